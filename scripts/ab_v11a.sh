#!/bin/bash
# v11d's device call (notes/fast-loop.md): the register-A wgmma with the copy warp (row-major
# inputs) at 64 rows. Run from the repository root with $OUT set.
G="'gate_up': {'splits': 2, 'a_stages': 4}"
H="'heads': {'warps': 8, 'm_split': 2, 'a_stages': 2}"
Q1="'qkv': {'splits': 2}"
D="'down': 'wgmma'"
python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k rwgmma 2>&1 | tee $OUT/tests-rwgmma-warp.log | tail -2
timeout 400 python3 scripts/ab_frame.py --rows 64 --rounds 3 --variant "" \
  --variant "mma={$D, 'gate_up': 'rwgmma_warp', 'qkv': 'rwgmma'}" \
  --variant "mma={$D, 'gate_up': 'rwgmma', 'qkv': 'rwgmma_warp'}, tiles={$G, $H, $Q1}" \
  --variant "mma={$D, 'gate_up': 'rwgmma_warp', 'qkv': 'rwgmma_warp'}, tiles={$G, $H, $Q1}" \
  --variant "mma={$D, 'gate_up': 'rwgmma_warp', 'qkv': 'rwgmma_warp', 'wo': 'rwgmma_warp'}, tiles={$G, $H, $Q1, 'wo': {'m_split': 1}}" \
  --variant "mma={$D, 'gate_up': 'rwgmma_warp', 'qkv': 'rwgmma_warp', 'heads': 'rwgmma_warp'}, tiles={$G, 'heads': {'splits': 2, 'a_stages': 4}, $Q1}" \
  2>&1 | tee $OUT/ab-rwgmma-warp-64.log
