#!/bin/bash
# v12c's device call (notes/fast-loop.md): the talker sum's partial, the combined candidate
# and its parts at 64 rows, two builds each, after the loop tests they touch. Run from the
# repository root with $OUT set.
G="'gate_up': {'splits': 2, 'a_stages': 4}"
G8="'gate_up': {'splits': 2, 'a_stages': 8}"
Q="'qkv': {'splits': 2, 'm_split': 2}"
MH="mma={'down': 'wgmma', 'gate_up': 'rwgmma_tma', 'qkv': 'rwgmma_tma', 'wo': 'rwgmma_tma', 'heads': 'rwgmma_tma'}"
H8="'heads': {'splits': 2, 'a_stages': 8}"
python3 -m pytest -q -m gpu tests/test_fast_loop.py -k "prefill_overlap or matches_reference_1p7b and not wgmma and not skinny" 2>&1 \
  | tee $OUT/tests-talker-sum.log | tail -2
timeout 330 python3 scripts/ab_frame.py --rows 64 --rounds 3 --instances 2 \
  --variant "side_copies=False" --variant "" \
  --variant "$MH, tiles={$G8, $H8, $Q}, input_proj='skinny'" \
  --variant "$MH, tiles={$G8, $H8, $Q}" \
  --variant "$MH, tiles={$G, $H8, $Q}, input_proj='skinny'" \
  --variant "$MH, tiles={$G8, $H8, $Q, 'wo': {'a_stages': 8}}, input_proj='skinny'" \
  --variant "$MH, tiles={$G8, $H8, $Q, 'wo': {'a_stages': 2}}, input_proj='skinny'" \
  2>&1 | tee $OUT/ab-v12c-64.log | tail -8
