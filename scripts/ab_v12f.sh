#!/bin/bash
# v12f's device call (notes/fast-loop.md): down's shared-memory wgmma tiles and qkv's stages
# at 64 rows, two builds each. Run from the repository root with $OUT set.
T="'gate_up': {'splits': 2, 'a_stages': 8}, 'heads': {'splits': 2, 'a_stages': 8}"
Q="'qkv': {'splits': 2, 'm_split': 2}"
timeout 300 python3 scripts/ab_frame.py --rows 64 --rounds 3 --instances 2 --variant "" \
  --variant "tiles={$T, $Q, 'down': {'m_split': 2}}" \
  --variant "tiles={$T, $Q, 'down': {'stages': 2}}" \
  --variant "tiles={$T, 'qkv': {'splits': 2, 'm_split': 2, 'a_stages': 4}}" \
  2>&1 | tee $OUT/ab-v12f-64.log | tail -5
