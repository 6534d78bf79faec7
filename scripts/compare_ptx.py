"""Compare two PTX dumps file by file (``WB_PTX_DUMP=<dir> pytest -m compile`` writes one file per
compiled kernel, named by its test). Kernel entry names are normalised, since they embed the
module path, and comments are dropped; anything else that differs is reported.

    WB_PTX_DUMP=/tmp/before python3 -m pytest -q -m compile    # before a change
    WB_PTX_DUMP=/tmp/after  python3 -m pytest -q -m compile    # after it
    python3 scripts/compare_ptx.py /tmp/before /tmp/after
"""
import argparse
import re
import sys
from pathlib import Path


def normalised(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"kernel_cutlass_kernel_\w+", "KERNEL", text))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    old = {p.name: p for p in args.before.glob("*.ptx")}
    new = {p.name: p for p in args.after.glob("*.ptx")}
    changed = sorted(n for n in old.keys() & new.keys()
                     if normalised(old[n].read_text()) != normalised(new[n].read_text()))
    for name in changed:
        print(f"changed: {name}")
    for name in sorted(old.keys() - new.keys()):
        print(f"only before: {name}")
    for name in sorted(new.keys() - old.keys()):
        print(f"only after: {name}")
    print(f"{len(old.keys() & new.keys()) - len(changed)} identical, {len(changed)} changed, "
          f"{len(old.keys() - new.keys())} only before, {len(new.keys() - old.keys())} only after")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
