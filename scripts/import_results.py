#!/usr/bin/env python3
"""Publish what a GPU run wrote under $OUT into results/: ``wb results publish`` by its old name.

    python3 scripts/import_results.py /work/.device/7 [more folders or files]

Summaries are validated and refused when they would replace one measured on another machine
class; a replaced summary moves to results/history/. Logs and records go to
results/logs/<commit>-<file>, each starting with its provenance line (workbench/publish.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench import WorkbenchError  # noqa: E402
from workbench.publish import publish  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, nargs="+", help="run folders or files")
    args = p.parse_args(argv)
    try:
        for line in publish(args.src):
            print(line)
    except WorkbenchError as e:
        print(f"import_results: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
