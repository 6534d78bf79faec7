"""``wb``: the workbench command line.

    wb env                               machine, versions, compile target
    wb run <experiment> [--quick] [...]  run experiments/<experiment>.py, write results/<name>.json
    wb results list | show NAME | diff A B
    wb ladder [--phase p0|p1|p2|frame|numerics] [--quick]

User errors (unknown names, malformed files, a GPU-only command without a GPU) print one line on
stderr and exit non-zero; they never print a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from workbench import WorkbenchError


def _cmd_env(args) -> int:
    from workbench.env import environment

    env = environment()
    if args.json:
        print(json.dumps(env, indent=1))
        return 0
    gpu = env["gpu"]
    if gpu == "none":
        print("gpu:            none visible (torch.cuda.is_available() is False); "
              "kernels compile offline only")
    else:
        cc = ".".join(map(str, gpu["compute_capability"]))
        print(f"gpu:            {gpu['name']} (sm_{cc.replace('.', '')}, {gpu['sm_count']} SMs, "
              f"{gpu['memory_gib']} GiB, driver {gpu['driver']})")
    print(f"compile target: {env['compile_target']} (override with CUTE_DSL_ARCH)")
    for k in ("torch", "cuda", "cute_dsl", "python", "host"):
        print(f"{k + ':':<15} {env[k] if env[k] is not None else 'not installed'}")
    return 0


def _experiment_names() -> list[str]:
    import pkgutil

    import experiments

    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(experiments.__path__)
                  if not m.name.startswith("_"))


def _cmd_run(args) -> int:
    names = _experiment_names()
    if args.experiment not in names and args.experiment.replace("_", "-") not in names:
        raise WorkbenchError(f"unknown experiment '{args.experiment}'; known: {', '.join(names)}")
    mod = importlib.import_module("experiments." + args.experiment.replace("-", "_"))
    argv = (["--quick"] if args.quick else []) + list(args.rest)
    return int(mod.main(argv) or 0)


def _cmd_results(args) -> int:
    from workbench import results as R

    if args.action == "list":
        rows = []
        for p in R.list_summaries():
            try:
                s = R.load(str(p))
                head = ", ".join(f"{k}={R._fmt(v)}" for k, v in list(R.flat_headline(s).items())[:4])
                gpu = s["provenance"]["gpu"]
                rows.append([s["name"], s["verdict"], gpu if gpu == "none" else gpu["name"],
                             s["provenance"]["utc"], head])
            except WorkbenchError as e:
                rows.append([p.stem, "INVALID", "", "", str(e)[:80]])
        if not rows:
            print("no summaries in results/")
            return 0
        print(R.format_table(rows, ["name", "verdict", "gpu", "utc", "headline"]))
        return 0
    if args.action == "show":
        if len(args.names) != 1:
            raise WorkbenchError("usage: wb results show NAME")
        s = R.load(args.names[0])
        p = s["provenance"]
        gpu = p["gpu"] if p["gpu"] == "none" else p["gpu"]["name"]
        print(f"{s['name']}: verdict {s['verdict']}  (commit {p['commit'][:10]}"
              f"{' dirty' if p['dirty'] else ''}, {p['utc']}, gpu {gpu})")
        print(f"command: {p['command']}")
        print()
        print(R.format_table([[k, v] for k, v in R.flat_headline(s).items()], ["headline", "value"]))
        if s["gates"]:
            print()
            print(R.format_table([[g, "pass" if v["pass"] else "FAIL", v.get("detail", "")]
                                  for g, v in s["gates"].items()], ["gate", "result", "detail"]))
        if s.get("notes"):
            print()
            for k, v in s["notes"].items():
                print(f"{k}: {v}")
        return 0
    if args.action == "diff":
        if len(args.names) != 2:
            raise WorkbenchError("usage: wb results diff A B")
        a, b = R.load(args.names[0]), R.load(args.names[1])
        ha, hb = R.flat_headline(a), R.flat_headline(b)
        rows = []
        for k in sorted(set(ha) | set(hb)):
            va, vb = ha.get(k, "-"), hb.get(k, "-")
            ratio = (vb / va) if isinstance(va, (int, float)) and isinstance(vb, (int, float)) \
                and not isinstance(va, bool) and va else ""
            rows.append([k, va, vb, ratio])
        print(R.format_table(rows, ["headline", args.names[0], args.names[1], "B/A"]))
        return 0
    raise WorkbenchError(f"unknown results action '{args.action}'")


def _cmd_ladder(args) -> int:
    from validators.runner import run_ladder

    return run_ladder(phase=args.phase, quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wb", description="CuTe DSL kernel research workbench")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env", help="GPU, versions and compile target")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_cmd_env)
    r = sub.add_parser("run", help="run an experiment and write its results/ summary")
    r.add_argument("experiment")
    r.add_argument("--quick", action="store_true")
    r.add_argument("rest", nargs=argparse.REMAINDER)
    r.set_defaults(func=_cmd_run)
    s = sub.add_parser("results", help="list, show or diff results/ summaries")
    s.add_argument("action", choices=["list", "show", "diff"])
    s.add_argument("names", nargs="*")
    s.set_defaults(func=_cmd_results)
    lad = sub.add_parser("ladder", help="run the validator ladder in order, stop at the first failure")
    lad.add_argument("--phase", default="numerics",
                     choices=["numerics", "p0", "p1", "p2", "frame"])
    lad.add_argument("--quick", action="store_true")
    lad.set_defaults(func=_cmd_ladder)
    return p



def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed one usage line
        return int(e.code or 0)
    try:
        return args.func(args)
    except WorkbenchError as e:
        print(f"wb: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wb: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
