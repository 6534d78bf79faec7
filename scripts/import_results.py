#!/usr/bin/env python3
"""Copy summaries that a GPU run wrote under $OUT into results/, keeping history.

    python3 scripts/import_results.py /work/.device/7 [--log NAME]

Each <name>.json is validated against the schema and written with the workbench writer, so an
existing results/<name>.json moves to results/history/ first (nothing is overwritten silently).
Logs (*.log) are copied to results/logs/<commit>-<file>.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench import WorkbenchError  # noqa: E402
from workbench import results as R  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path)
    args = p.parse_args(argv)
    commit = "unknown"
    for f in sorted(args.src.glob("*.json")):
        data = json.loads(f.read_text())
        errs = R.validate(data)
        if errs:
            raise WorkbenchError(f"{f}: {'; '.join(errs)}")
        commit = data["provenance"]["commit"][:7]
        print(f"imported {R.write(data)}")
    logs = R.results_dir() / "logs"
    for f in sorted(args.src.glob("*.log")):
        logs.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, logs / f"{commit}-{f.name}")
        print(f"copied {f.name} -> results/logs/{commit}-{f.name}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except WorkbenchError as e:
        print(f"import_results: {e}", file=sys.stderr)
        raise SystemExit(2)
