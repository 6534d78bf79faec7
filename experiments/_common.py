"""Helpers shared by experiment scripts: argument parsing, progress lines, GPU checks."""
from __future__ import annotations

import argparse
import sys
import time

from workbench import WorkbenchError
from workbench import results as R
from workbench.env import require_gpu


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results-dir", default=None, help="where to write the summary (default: "
                   "$WB_RESULTS_DIR, else this run's folder results/runs/<utc>-<host>/; "
                   "`wb results publish` copies it into results/)")
    return p


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def need_gpu(name: str) -> None:
    require_gpu(f"experiment '{name}'")


def run_main(fn, argv) -> int:
    """Run an experiment's ``fn(argv)``: where it will write is checked before any work, and
    with --quick every summary it makes is marked quick (workbench.results.quick_run)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        # the shared flags, spelled out (no -h, no abbreviations: a prefix of the experiment's
        # own flags must not read as one of them); the experiment parses argv itself
        probe = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        probe.add_argument("--quick", action="store_true")
        probe.add_argument("--results-dir", default=None)
        shared, _ = probe.parse_known_args(argv)
        R.check_results_dir(shared.results_dir)
        with R.quick_run(shared.quick):
            return int(fn(argv) or 0)
    except WorkbenchError as e:
        print(f"{e}", file=sys.stderr)
        return 2
