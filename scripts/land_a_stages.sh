#!/usr/bin/env bash
# One device call that tests and measures branch wip/skinny-a-stages (the a slice copied in
# K-ranges, each range's mma starting when it lands) on the H200: GPU tests, then same-run frame
# A/B at 64 and 16 rows, then a phase trace at 64 rows. Logs under $OUT; medians last.
# Usage (device): source .gpu/install.sh && WB_GIT_COMMIT=<sha> bash scripts/land_a_stages.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-} WB_RESULTS_DIR=$OUT
S4="{'qkv':{'a_stages':4},'wo':{'a_stages':4},'gate_up':{'a_stages':4},'down':{'a_stages':4}}"
S2="{'qkv':{'a_stages':2},'wo':{'a_stages':2},'gate_up':{'a_stages':2},'down':{'a_stages':2}}"
timeout 120 python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k "staged or skinny_gemm_matches" \
    -p no:cacheprovider > "$OUT/tests.log" 2>&1; tail -1 "$OUT/tests.log"
timeout 110 python3 scripts/ab_frame.py --rows 64 --variant "" --variant "tiles=$S2" \
    --variant "tiles=$S4" > "$OUT/ab64.log" 2>&1
timeout 70 python3 scripts/ab_frame.py --rows 16 --variant "" --variant "tiles=$S2" \
    > "$OUT/ab16.log" 2>&1
timeout 60 python3 scripts/trace_skinny.py --rows 64 --tiles "$S4" --tag stages4 > "$OUT/trace.log" 2>&1
grep -h median "$OUT"/ab*.log; grep -h "chain of" "$OUT/trace.log"
