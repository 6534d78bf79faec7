#!/bin/bash
# v11a's second device call (notes/fast-loop.md): tiles of the register-A wgmma projections at
# 64 rows, then a labelled profile. Run from the repository root with $OUT set.
M="mma={'down': 'wgmma', 'gate_up': 'rwgmma', 'qkv': 'rwgmma'}"
H="'heads': {'warps': 8, 'm_split': 2, 'a_stages': 2}"
Q="'qkv': {'splits': 2, 'm_split': 2}"
G="'gate_up': {'splits': 2, 'a_stages': 2}"
timeout 400 python3 scripts/ab_frame.py --rows 64 --rounds 3 --variant "" --variant "$M" \
  --variant "$M, tiles={'gate_up': {'splits': 2, 'a_stages': 4}, $H, $Q}" \
  --variant "$M, tiles={'gate_up': {'splits': 2, 'a_stages': 1}, $H, $Q}" \
  --variant "$M, tiles={'gate_up': {'splits': 4, 'a_stages': 2}, $H, $Q}" \
  --variant "$M, tiles={'gate_up': {'splits': 2, 'm_split': 2, 'a_stages': 2}, $H, $Q}" \
  --variant "$M, tiles={$G, $H, 'qkv': {'splits': 2}}" \
  --variant "$M, tiles={$G, $H, 'qkv': {'splits': 4, 'm_split': 2}}" \
  --variant "$M, tiles={$G, $H, $Q, 'wo': {'a_stages': 2}}" \
  --variant "$M, draw_noise='inline'" \
  --variant "mma={'down': 'wgmma', 'gate_up': 'rwgmma'}" 2>&1 | tee $OUT/ab-rwgmma-tiles-64.log
timeout 150 python3 scripts/profile_fast_loop.py --rows 64 --graph \
  --variant "prefill='serial', $M" --tag 64-serial-rwgmma 2>&1 | tee $OUT/profile-64.log
