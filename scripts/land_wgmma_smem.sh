#!/usr/bin/env bash
# One device call for the wgmma mainloop fed from shared memory (notes/fast-loop.md v10j): its
# GPU tests, then phase traces of the five-layer projection chain at 64 and 16 rows with the
# mma.sync kernel (today's defaults) and with the wgmma kernel (timing only). ~3 min.
# Usage (device): source .gpu/install.sh && WB_GIT_COMMIT=<sha> bash scripts/land_wgmma_smem.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-} WB_RESULTS_DIR=$OUT
timeout 150 python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k "wgmma" \
    -p no:cacheprovider > "$OUT/tests.log" 2>&1; tail -1 "$OUT/tests.log"
for R in 64 16; do
  timeout 60 python3 scripts/trace_skinny.py --rows $R --tag mma > "$OUT/trace-$R-mma.log" 2>&1
  timeout 60 python3 scripts/trace_skinny.py --rows $R --wgmma --tag wgmma \
      > "$OUT/trace-$R-wgmma.log" 2>&1
done
grep -h "chain of" "$OUT"/trace-*.log
