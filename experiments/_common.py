"""Helpers shared by experiment scripts: argument parsing, progress lines, GPU checks."""
from __future__ import annotations

import argparse
import sys
import time

from workbench import WorkbenchError


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
    from workbench.env import require_gpu

    require_gpu(f"experiment '{name}'")


def run_main(fn, argv) -> int:
    try:
        return int(fn(argv) or 0)
    except WorkbenchError as e:
        print(f"{e}", file=sys.stderr)
        return 2
