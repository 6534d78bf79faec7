#!/bin/bash
# v11c's device call (notes/fast-loop.md): tiles around the register-A wgmma defaults at 64
# rows. Run from the repository root with $OUT set.
G="'gate_up': {'splits': 2, 'a_stages': 4}"
H="'heads': {'warps': 8, 'm_split': 2, 'a_stages': 2}"
Q="'qkv': {'splits': 2, 'm_split': 2}"
M="'down': 'wgmma', 'gate_up': 'rwgmma', 'qkv': 'rwgmma'"
timeout 400 python3 scripts/ab_frame.py --rows 64 --rounds 3 --variant "" \
  --variant "mma={$M, 'down': 'rwgmma'}" \
  --variant "mma={$M, 'down': 'rwgmma'}, tiles={$G, $H, $Q, 'down': {'splits': 8}}" \
  --variant "tiles={'gate_up': {'warps': 8, 'splits': 4, 'a_stages': 2}, $H, $Q}" \
  --variant "tiles={$G, $H, 'qkv': {'warps': 8, 'splits': 4}}" \
  --variant "mma={$M, 'heads': 'rwgmma'}, tiles={$G, 'heads': {'splits': 2, 'a_stages': 4}, $Q}" \
  --variant "mma={$M, 'wo': 'rwgmma'}, tiles={$G, $H, $Q, 'wo': {'splits': 8, 'm_split': 2}}" \
  --variant "tiles={$G, $H, $Q, 'wo': {'splits': 8}}" \
  2>&1 | tee $OUT/ab-rwgmma-tiles2-64.log
