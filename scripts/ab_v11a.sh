#!/bin/bash
# v11a's third device call (notes/fast-loop.md): the register-A wgmma projections at the other
# buckets, and the 64-row choice over two builds each. Run from the repository root, $OUT set.
R="'gate_up': 'rwgmma', 'qkv': 'rwgmma'"
T="tiles={'gate_up': {'splits': 2, 'a_stages': 4}, 'heads': {'warps': 8, 'm_split': 2, 'a_stages': 2}, 'qkv': {'splits': 2, 'm_split': 2}}"
ab() { timeout 300 python3 scripts/ab_frame.py --rounds 3 "$@"; }
ab --rows 64 --instances 2 --variant "" --variant "mma={'down': 'wgmma', $R}, $T" \
  2>&1 | tee $OUT/ab-rwgmma-64-instances.log
ab --rows 32 --variant "" --variant "mma={$R}" --variant "mma={'gate_up': 'rwgmma'}" \
  2>&1 | tee $OUT/ab-rwgmma-32.log
ab --rows 128 --variant "" --variant "mma={'down': 'wgmma', $R}" \
  --variant "mma={'down': 'wgmma', 'gate_up': 'rwgmma'}" 2>&1 | tee $OUT/ab-rwgmma-128.log
ab --rows 16 --variant "" --variant "mma={$R}" --variant "mma={'gate_up': 'rwgmma'}" \
  2>&1 | tee $OUT/ab-rwgmma-16.log
