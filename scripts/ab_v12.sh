#!/bin/bash
# v12a's device call (notes/fast-loop.md): the ready candidates at 64 rows, two builds each,
# after their GPU tests. Run from the repository root with $OUT set.
G="'gate_up': {'splits': 2, 'a_stages': 4}"
H="'heads': {'warps': 8, 'm_split': 2, 'a_stages': 2}"
Q="'qkv': {'splits': 2, 'm_split': 2}"
M="'down': 'wgmma', 'gate_up': 'rwgmma_tma', 'qkv': 'rwgmma_tma', 'wo': 'rwgmma_tma'"
T="'rwgmma_tma'"
python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k rwgmma 2>&1 \
  | tee $OUT/tests-rwgmma.log | tail -2
python3 -m pytest -q -m gpu tests/test_fast_loop.py -k "skinny_input" 2>&1 \
  | tee $OUT/tests-input-proj.log | tail -2
timeout 400 python3 scripts/ab_frame.py --rows 64 --rounds 3 --instances 2 --variant "" \
  --variant "mma={$M, 'heads': $T}, tiles={$G, 'heads': {'splits': 2, 'a_stages': 4}, $Q}" \
  --variant "mma={'down': $T, 'gate_up': $T, 'qkv': $T, 'wo': $T}" \
  --variant "tiles={'gate_up': {'splits': 2, 'a_stages': 8}, $H, $Q}" \
  --variant "tiles={$G, $H, 'qkv': {'splits': 2, 'm_split': 2, 'a_stages': 8}}" \
  --variant "input_proj='skinny'" \
  2>&1 | tee $OUT/ab-v12a-64.log | tail -8
