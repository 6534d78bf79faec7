#!/usr/bin/env bash
# Device call for v10k (notes/fast-loop.md): GPU tests of the chunk-major gate/up output and the
# loop with mma=("wo", "down"); frame A/B at 64 and 16 rows; labelled graph profiles at 64 rows.
# Usage (device): source .gpu/install.sh && WB_GIT_COMMIT=<sha> bash scripts/land_hybrid.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-} WB_RESULTS_DIR=$OUT
timeout 150 python3 -m pytest -q -m gpu tests/test_fast_loop.py tests/test_depth_kernels.py \
    -k "wgmma_on_h200 or chunk_major_producers" -p no:cacheprovider > "$OUT/tests.log" 2>&1
tail -1 "$OUT/tests.log"
timeout 150 python3 scripts/ab_frame.py --rows 64 --variant "" --variant "mma=('wo','down')" \
    --variant "mma=('wo',)" --variant "mma=('down',)" > "$OUT/ab64.log" 2>&1
timeout 80 python3 scripts/ab_frame.py --rows 16 --variant "" --variant "mma=('wo','down')" \
    --variant "mma=('wo',)" > "$OUT/ab16.log" 2>&1
timeout 60 python3 scripts/profile_fast_loop.py --rows 64 --graph --tag sync \
    > "$OUT/profile-64-sync.log" 2>&1
timeout 60 python3 scripts/profile_fast_loop.py --rows 64 --graph --variant "mma=('wo','down')" \
    --tag hybrid > "$OUT/profile-64-hybrid.log" 2>&1
grep -h median "$OUT"/ab*.log; grep -h "span" "$OUT"/profile-*.log
