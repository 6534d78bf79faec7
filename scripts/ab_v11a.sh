#!/bin/bash
# v11e's device call (notes/fast-loop.md): the register-A wgmma with TMA (row-major inputs) at
# 64 rows, after its GPU tests. Run from the repository root with $OUT set.
G="'gate_up': {'splits': 2, 'a_stages': 4}"
Q="'qkv': {'splits': 2, 'm_split': 2}"
D="'down': 'wgmma'"
T="'rwgmma_tma'"
python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k rwgmma 2>&1 | tee $OUT/tests-rwgmma-tma.log | tail -2
python3 -m pytest -q -m gpu tests/test_fast_loop.py -k "wgmma_on_h200 and mma4" 2>&1 | tee $OUT/tests-loop-tma.log | tail -2
timeout 300 python3 scripts/ab_frame.py --rows 64 --rounds 3 --variant "" \
  --variant "mma={$D, 'gate_up': $T, 'qkv': 'rwgmma'}" \
  --variant "mma={$D, 'gate_up': 'rwgmma', 'qkv': $T}" \
  --variant "mma={$D, 'gate_up': $T, 'qkv': $T}" \
  --variant "mma={$D, 'gate_up': $T, 'qkv': $T, 'wo': $T}" \
  --variant "mma={$D, 'gate_up': $T, 'qkv': $T, 'wo': $T, 'heads': $T}, tiles={$G, 'heads': {'splits': 2, 'a_stages': 4}, $Q}" \
  --variant "mma={'down': $T, 'gate_up': $T, 'qkv': $T, 'wo': $T}" \
  2>&1 | tee $OUT/ab-rwgmma-tma-64.log
