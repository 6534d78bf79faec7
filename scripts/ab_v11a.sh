#!/bin/bash
# v11e's landing call (notes/fast-loop.md): the TMA kernel's GPU tests; if they pass, the frame
# A/B at 64 rows (the new default, TMA for gate/up, qkv and o, against the bulk copies); if
# the default wins by > 10 µs, experiments.depth_loop and the loop's GPU tests at it.
T="'rwgmma_tma'"
python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k rwgmma > $OUT/tests-rwgmma-tma.log 2>&1
tail -1 $OUT/tests-rwgmma-tma.log
grep -q "failed" $OUT/tests-rwgmma-tma.log && exit 1
timeout 150 python3 scripts/ab_frame.py --rows 64 --rounds 3 --variant "" \
  --variant "mma={'down': 'wgmma', 'gate_up': 'rwgmma', 'qkv': 'rwgmma'}" \
  --variant "mma={'down': 'wgmma', 'gate_up': $T, 'qkv': $T}" > $OUT/ab-rwgmma-tma-64.log 2>&1
grep "rows .*: m" $OUT/ab-rwgmma-tma-64.log
python3 - $OUT/ab-rwgmma-tma-64.log <<'PY' || exit 0
import re, sys
t = [float(x) for x in re.findall(r"median of rounds (\d+)", open(sys.argv[1]).read())]
sys.exit(0 if len(t) == 3 and t[0] < t[1] - 10 else 1)
PY
timeout 200 python3 -m experiments.depth_loop > $OUT/experiment.log 2>&1; tail -8 $OUT/experiment.log
timeout 170 python3 -m pytest -q -m gpu tests/test_fast_loop.py > $OUT/tests-loop.log 2>&1
tail -1 $OUT/tests-loop.log
