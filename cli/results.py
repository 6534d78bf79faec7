"""``wb results``: list, show, diff, publish and plot summaries.

They read the published summaries (results/) unless ``--run DIR`` names a run folder
(``latest``: the newest under results/runs/). Every unreadable entry is a one-line error.
"""
from __future__ import annotations

from pathlib import Path

from workbench import WorkbenchError
from workbench import results as R


def resolve_run(arg: str) -> Path:
    """A run folder: a path, or ``latest`` (the newest of results/runs/)."""
    if arg == "latest":
        runs = R.published_dir() / "runs"
        found = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
        if not found:
            raise WorkbenchError(f"no run folders under {runs}")
        return found[-1]
    path = Path(arg)
    if not path.is_dir():
        why = "not a folder" if path.exists() else "not found"
        raise WorkbenchError(f"run folder {arg}: {why}")
    return path


def _folder(args) -> Path:
    return resolve_run(args.run) if args.run else R.published_dir()


def cmd_list(args) -> int:
    folder = _folder(args)
    rows, bad = [], []
    for p in R.list_summaries(folder):
        try:
            s = R.load(str(p))
        except WorkbenchError as e:
            bad.append(str(e))
            continue
        head = ", ".join(f"{k}={R.fmt(v)}" for k, v in list(R.flat_headline(s).items())[:4])
        rows.append([s["name"], s["verdict"], R.machine_class(s), s["provenance"]["utc"], head])
    if rows:
        print(R.format_table(rows, ["name", "verdict", "gpu", "utc", "headline"]))
    elif not bad:
        print(f"no summaries in {folder}")
    if bad:
        raise WorkbenchError(f"{len(bad)} unusable entr{'y' if len(bad) == 1 else 'ies'} in "
                             f"{folder}: {'; '.join(bad)}")
    return 0


def cmd_show(args) -> int:
    s = R.load(args.name, _folder(args))
    p = s["provenance"]
    print(f"{s['name']}: verdict {s['verdict']}  (commit {p['commit'][:10]}"
          f"{' dirty' if p['dirty'] else ''}, {p['utc']}, gpu {R.machine_class(s)})")
    print(f"command: {p['command']}")
    print()
    print(R.format_table([[k, v] for k, v in R.flat_headline(s).items()], ["headline", "value"]))
    if s["gates"]:
        print()
        print(R.format_table([[g, "pass" if v["pass"] else "FAIL", v.get("detail", "")]
                              for g, v in s["gates"].items()], ["gate", "result", "detail"]))
    for k, v in (s.get("notes") or {}).items():
        print(f"\n{k}: {v}")
    return 0


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def cmd_diff(args) -> int:
    if args.run:
        if args.b is not None:
            raise WorkbenchError("usage: wb results diff NAME --run DIR (the published NAME "
                                 "against the run's), or wb results diff A B")
        run = resolve_run(args.run)
        (la, a), (lb, b) = ("published", R.load(args.a)), (str(run), R.load(args.a, run))
    elif args.b is None:
        raise WorkbenchError("usage: wb results diff A B (each a summary file or a published "
                             "name), or wb results diff NAME --run DIR")
    else:
        (la, a), (lb, b) = (args.a, R.load(args.a)), (args.b, R.load(args.b))
    ha, hb = R.flat_headline(a), R.flat_headline(b)
    rows = []
    for k in sorted(set(ha) | set(hb)):
        va, vb = ha.get(k, "-"), hb.get(k, "-")
        ratio = vb / va if _number(va) and _number(vb) and va else ""
        rows.append([k, va, vb, ratio])
    rows.append(["(verdict)", a["verdict"], b["verdict"], ""])
    rows.append(["(machine)", R.machine_class(a), R.machine_class(b), ""])
    print(R.format_table(rows, ["headline", la, lb, "B/A"]))
    return 0


def cmd_publish(args) -> int:
    from workbench.publish import publish

    for line in publish([Path(s) for s in args.sources]):
        print(line)
    return 0


def cmd_plot(args) -> int:
    from workbench.plots import summary_png

    folder = _folder(args)
    s = R.load(args.name, folder)
    default_dir = folder if args.run else R.results_dir()
    out = Path(args.out) if args.out else default_dir / f"{s['name']}.png"
    print(f"wrote {summary_png(s, out, headline=args.headline)}")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("results", help="list, show, diff, publish or plot summaries",
                       description=__doc__.splitlines()[0])
    acts = s.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name, fn, help_, run=True):
        a = acts.add_parser(name, help=help_)
        if run:
            a.add_argument("--run", metavar="DIR",
                           help="a run folder (or 'latest') instead of the published results/")
        a.set_defaults(func=fn)
        return a

    action("list", cmd_list, "one line per summary")
    action("show", cmd_show, "a summary's headline, gates and notes").add_argument("name")
    d = action("diff", cmd_diff, "headline of A against B; with --run, published NAME against "
               "the run's")
    d.add_argument("a", metavar="A")
    d.add_argument("b", metavar="B", nargs="?")
    p = action("publish", cmd_publish, "copy run folders or files into results/ (refuses a "
               "summary from another machine class)", run=False)
    p.add_argument("sources", nargs="+", metavar="RUN_DIR_OR_FILE")
    pl = action("plot", cmd_plot, "PNG of a summary's headline, one bar per case (or its own "
                "plot: p0-baseline's ratio to cuBLAS per shape and M)")
    pl.add_argument("name")
    pl.add_argument("--out", metavar="PNG", help="default: <run folder>/<name>.png")
    pl.add_argument("--headline", action="store_true",
                    help="the headline plot even where the summary has a plot of its own")

