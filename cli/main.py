"""``wb``: the workbench command line.

    wb env                                  machine, versions, compile target
    wb run <experiment> [--quick] [...]     run experiments/<experiment>.py into a run folder
                                            (p0-compile or p0_compile: either spelling)
    wb results list|show|diff|publish|plot  summaries: published (results/) or a run's (--run)
    wb ladder [--phase p0|p1|p2|frame|numerics] [--quick]   ladder-<phase>.json and .md
              [--resume RUN_DIR] [--stop-after SECONDS]   resumable; 75: paused
    wb log-header COMMAND...                the provenance line a log starts with

A run writes into its run folder, results/runs/<utc>-<host>/ (git-ignored), or $WB_RESULTS_DIR
(checked before ``wb run`` or ``wb ladder`` starts any work); only ``wb results publish`` changes
the committed results/. User errors (unknown names, unreadable or malformed files, a GPU-only
command without a GPU) print one line on stderr and exit non-zero; they never print a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import shlex
import sys

import experiments
from cli import results as results_cli
from workbench import WorkbenchError
from workbench.logs import log_header
from workbench.results import check_results_dir


def _cmd_env(args) -> int:
    from workbench.env import environment  # here: only `wb env` loads torch (workbench.env)

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
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(experiments.__path__)
                  if not m.name.startswith("_"))


def _cmd_run(args) -> int:
    names = _experiment_names()
    usage = f"usage: wb run EXPERIMENT [--quick] [ARGS...]; experiments: {', '.join(names)}"
    if args.experiment is None:
        raise WorkbenchError(usage)
    if args.experiment.replace("_", "-") not in names:
        raise WorkbenchError(f"unknown experiment '{args.experiment}'; known: {', '.join(names)}")
    mod = importlib.import_module("experiments." + args.experiment.replace("-", "_"))
    argv = (["--quick"] if args.quick else []) + list(args.args)
    return int(mod.main(argv) or 0)


def _cmd_ladder(args) -> int:
    # here, not at the top: only `wb ladder` loads the ladder (torch, models, the kernels)
    from validators.runner import run_ladder

    devices = args.devices.split(",") if args.devices else None
    return run_ladder(phase=args.phase, quick=args.quick, resume=args.resume,
                      stop_after=args.stop_after, devices=devices)


def _cmd_log_header(args) -> int:
    if not args.command:
        raise WorkbenchError("usage: wb log-header COMMAND... (prints the provenance line for "
                             "a log of COMMAND's output)")
    print(log_header(shlex.join(args.command)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wb", description="CuTe DSL kernel research workbench")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    e = sub.add_parser("env", help="GPU, versions and compile target")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_cmd_env)
    r = sub.add_parser("run", help="run an experiment; its summary goes to a run folder")
    r.add_argument("experiment", nargs="?", metavar="EXPERIMENT",
                   help="one of: " + ", ".join(_experiment_names()))
    r.add_argument("--quick", action="store_true")
    r.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="passed on to the experiment")
    r.set_defaults(func=_cmd_run)
    results_cli.add_parser(sub)
    lad = sub.add_parser("ladder", help="run the validator ladder in order, stop at the first "
                         "part that fails; resumable (--resume, --stop-after)")
    lad.add_argument("--phase", default=None, choices=["numerics", "p0", "p1", "p2", "frame"],
                     help="default numerics; with --resume, the one ladder in RUN_DIR")
    lad.add_argument("--quick", action="store_true", default=None,
                     help="fewer cases; rungs 3-8 on the scaled-down synthetic H3")
    lad.add_argument("--resume", metavar="RUN_DIR",
                     help="continue the ladder whose state is in RUN_DIR after its last "
                     "completed part, step or block")
    lad.add_argument("--stop-after", type=float, metavar="SECONDS",
                     help="stop before a unit (a part, a block of rungs 5-7) that would end "
                     "past SECONDS from the start, save the state and exit 75 ('paused')")
    lad.add_argument("--devices", metavar="REF,ADV,MODEL",
                     help="rungs 5-7: the reference, the legal adversary and the model under "
                     "test each on its own device, side by side (e.g. cuda:1,cuda:2,cuda:0); "
                     "default: all on one, in turn")
    lad.set_defaults(func=_cmd_ladder)
    h = sub.add_parser("log-header", help="print the provenance line a log starts with")
    h.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND")
    h.set_defaults(func=_cmd_log_header)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed its usage and error
        return int(e.code or 0)
    try:
        if args.cmd in ("run", "ladder"):
            check_results_dir()  # a bad WB_RESULTS_DIR fails now, not after the whole run
        return args.func(args)
    except WorkbenchError as e:
        print(f"wb: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file that vanished or cannot be written: still one line
        print(f"wb: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wb: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
