#!/bin/bash
# v12b's device call (notes/fast-loop.md): side_copies and the v12a winners at 64 rows, two
# builds each, after the prefill bit test; then a profile of the candidate. Run from the
# repository root with $OUT set.
G="'gate_up': {'splits': 2, 'a_stages': 4}"
G8="'gate_up': {'splits': 2, 'a_stages': 8}"
Q="'qkv': {'splits': 2, 'm_split': 2}"
MH="mma={'down': 'wgmma', 'gate_up': 'rwgmma_tma', 'qkv': 'rwgmma_tma', 'wo': 'rwgmma_tma', 'heads': 'rwgmma_tma'}"
H="'heads': {'splits': 2, 'a_stages': 4}"
BEST="$MH, tiles={$G8, $H, $Q}, input_proj='skinny'"
python3 -m pytest -q -m gpu tests/test_fast_loop.py -k "prefill_overlap" 2>&1 \
  | tee $OUT/tests-side-copies.log | tail -2
timeout 330 python3 scripts/ab_frame.py --rows 64 --rounds 3 --instances 2 \
  --variant "side_copies=False" --variant "" \
  --variant "$MH, tiles={$G, $H, $Q}" \
  --variant "$MH, tiles={$G, 'heads': {'splits': 2, 'm_split': 2}, $Q}" \
  --variant "$MH, tiles={$G, 'heads': {'splits': 2, 'a_stages': 8}, $Q}" \
  --variant "$BEST" \
  2>&1 | tee $OUT/ab-v12b-64.log | tail -7
timeout 120 python3 scripts/profile_fast_loop.py --rows 64 --graph --variant "$BEST" \
  --tag 64-v12b 2>&1 | tee $OUT/profile-64.log | head -20
