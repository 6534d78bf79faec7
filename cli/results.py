"""``wb results``: list, show, diff, publish and plot summaries.

They read the published summaries (results/) unless ``--run DIR`` names a run folder
(``latest``: ``$WB_RESULTS_DIR`` when set, else the newest run folder under results/runs/ that
holds a summary). Every unreadable entry is a one-line error; every table fits
``R.TABLE_WIDTH`` columns.
"""
from __future__ import annotations

from pathlib import Path

from workbench import WorkbenchError
from workbench import results as R
from workbench.plots import summary_png
from workbench.publish import publish

LIST_FIGURES = 4  # headline figures a `list` line names (`show` has them all)


def resolve_run(arg: str) -> Path:
    """A run folder: a path, or ``latest`` (:func:`workbench.results.latest_run`)."""
    if arg == "latest":
        return R.latest_run()
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
        head = ", ".join(f"{k}={R.fmt(v)}"
                         for k, v in list(R.flat_headline(s).items())[:LIST_FIGURES])
        rows.append([s["name"], R.verdict_text(s), R.machine_class(s), s["provenance"]["utc"],
                     head])
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
    print(R.wrap(f"{s['name']}: verdict {R.verdict_text(s)}  (commit {p['commit'][:10]}, "
                 f"{p['utc']}, gpu {R.machine_class(s)})"))
    print(R.wrap(f"command: {p['command']}"))
    print()
    print(R.format_table([[k, v] for k, v in R.flat_headline(s).items()], ["headline", "value"],
                         max_cell=64, wrap_last=True))
    if s["gates"]:
        print()
        print(R.format_table([[g, "pass" if v["pass"] else "FAIL", v.get("detail", "")]
                              for g, v in s["gates"].items()], ["gate", "result", "detail"],
                             wrap_last=True))
    for k, v in (s.get("notes") or {}).items():
        print()
        print(R.wrap(f"{k}: {'; '.join(map(str, v)) if isinstance(v, list) else v}"))
    return 0


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _label(tag: str, source: str, s: dict) -> str:
    p = s["provenance"]
    return R.wrap(f"{tag}: {source} ({R.verdict_text(s)}; {R.machine_class(s)}, commit "
                  f"{p['commit'][:10]}, {p['utc']})")


def cmd_diff(args) -> int:
    if args.run:
        if args.b is not None:
            raise WorkbenchError("usage: wb results diff NAME --run DIR (the published NAME "
                                 "against the run's), or wb results diff A B")
        run = resolve_run(args.run)
        (la, a), (lb, b) = ((f"published {R.summary_path(args.a)}", R.load(args.a)),
                            (f"run {run}", R.load(args.a, run)))
    elif args.b is None:
        raise WorkbenchError("usage: wb results diff A B (each a summary file or a published "
                             "name), or wb results diff NAME --run DIR")
    else:
        (la, a), (lb, b) = ((str(R.summary_path(args.a)), R.load(args.a)),
                            (str(R.summary_path(args.b)), R.load(args.b)))
    ha, hb = R.flat_headline(a), R.flat_headline(b)
    rows, same = [], 0
    for k in sorted(set(ha) | set(hb)):
        va, vb = ha.get(k, "-"), hb.get(k, "-")
        if va == vb and not args.all:
            same += 1
            continue
        ratio = vb / va if _number(va) and _number(vb) and va else ""
        rows.append([k, va, vb, ratio])
    rows.append(["(verdict)", R.verdict_text(a), R.verdict_text(b), ""])
    rows.append(["(machine)", R.machine_class(a), R.machine_class(b), ""])
    print(_label("A", la, a))
    print(_label("B", lb, b))
    print()
    print(R.format_table(rows, ["headline", "A", "B", "B/A"], max_cell=[56, 20, 20]))
    if same:
        print(f"\n{same} headline figure{'s' if same > 1 else ''} equal in both "
              "(--all lists them)")
    return 0


def cmd_publish(args) -> int:
    for line in publish([Path(s) for s in args.sources], force=args.force):
        print(R.wrap(line))
    return 0


def _beside_a_copy(summary: dict, folder: Path) -> Path:
    """Where a published summary's plot goes without --out: its run folder, beside a copy of
    the summary, so the folder stays a run (``--run latest`` reads it, ``wb results publish``
    takes the plot with it); never beside another summary of that name."""
    R.check_results_dir()
    mine = folder / f"{summary['name']}.json"
    if not mine.exists():
        R.write(summary, folder)
    elif R.read_json(mine) != summary:
        raise WorkbenchError(f"{mine} is another '{summary['name']}' summary; plot that one "
                             "with --run, or give --out PNG")
    return folder / f"{summary['name']}.png"


def cmd_plot(args) -> int:
    folder = _folder(args)
    s = R.load(args.name, folder)
    if args.out:
        out = Path(args.out)
    elif args.run:
        out = folder / f"{s['name']}.png"
    else:
        out = _beside_a_copy(s, R.results_dir())
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
    d.add_argument("--all", action="store_true", help="list the figures equal in both too")
    p = action("publish", cmd_publish, "copy run folders or files into results/ (refuses a "
               "summary from another machine class, and a quick or dirty one over a full, "
               "clean one)", run=False)
    p.add_argument("sources", nargs="+", metavar="RUN_DIR_OR_FILE")
    p.add_argument("--force", action="store_true",
                   help="publish a quick or dirty summary over a full, clean one (the summary "
                   "records that it was forced); never across machine classes")
    pl = action("plot", cmd_plot, "PNG of a summary's headline, one panel per unit (or its own "
                "plot: p0-baseline's ratio to cuBLAS per shape and M)")
    pl.add_argument("name")
    pl.add_argument("--out", metavar="PNG", help="default: beside the run's summary; for a "
                    "published one, this process's run folder (with a copy of the summary)")
    pl.add_argument("--headline", action="store_true",
                    help="the headline plot even where the summary has a plot of its own")

