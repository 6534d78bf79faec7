#!/usr/bin/env bash
# Device calls for the wgmma mainloop fed from shared memory (notes/fast-loop.md v10j).
#   part A (~4 min): the descriptor convention check (scripts/check_wgmma_layout.py), GPU tests
#     of the kernel, the chunk-major producers and the loop with
#     mma="wgmma"; phase traces of the five-layer chain at 64 and 16 rows, mma.sync and wgmma
#   part B (~5 min): same-run frame A/B, defaults against mma="wgmma", at 64, 16 and 128 rows;
#     graph profiles of both at 64 rows (what each kernel kind adds to the frame)
# Usage (device): source .gpu/install.sh && WB_GIT_COMMIT=<sha> bash scripts/land_wgmma_smem.sh A|B
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-} WB_RESULTS_DIR=$OUT
if [ "${1:-A}" = A ]; then
  timeout 60 python3 scripts/check_wgmma_layout.py > "$OUT/layout.log" 2>&1; tail -2 "$OUT/layout.log"
  timeout 150 python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k "wgmma or chunk_major" \
      -p no:cacheprovider > "$OUT/tests-kernels.log" 2>&1; tail -1 "$OUT/tests-kernels.log"
  timeout 120 python3 -m pytest -q -m gpu tests/test_fast_loop.py -k wgmma \
      -p no:cacheprovider > "$OUT/tests-loop.log" 2>&1; tail -1 "$OUT/tests-loop.log"
  for R in 64 16; do
    timeout 45 python3 scripts/trace_skinny.py --rows $R --tag mma > "$OUT/trace-$R-mma.log" 2>&1
    timeout 45 python3 scripts/trace_skinny.py --rows $R --wgmma --tag wgmma \
        > "$OUT/trace-$R-wgmma.log" 2>&1
  done
  grep -h "chain of" "$OUT"/trace-*.log
else
  timeout 100 python3 scripts/ab_frame.py --rows 64 --variant "" --variant mma=wgmma \
      > "$OUT/ab64.log" 2>&1
  timeout 80 python3 scripts/ab_frame.py --rows 16 --variant "" --variant mma=wgmma \
      > "$OUT/ab16.log" 2>&1
  timeout 130 python3 scripts/ab_frame.py --rows 128 --variant "" --variant mma=wgmma \
      > "$OUT/ab128.log" 2>&1
  timeout 60 python3 scripts/profile_fast_loop.py --rows 64 --graph --tag mma \
      > "$OUT/profile-64-mma.log" 2>&1
  timeout 60 python3 scripts/profile_fast_loop.py --rows 64 --graph --variant mma=wgmma \
      --tag wgmma > "$OUT/profile-64-wgmma.log" 2>&1
  grep -h median "$OUT"/ab*.log; grep -h "span" "$OUT"/profile-*.log
fi
