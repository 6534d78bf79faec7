#!/bin/bash
# v12d's device call (notes/fast-loop.md): results/depth-loop.json and the loop's GPU tests at
# the v12 defaults. Run from the repository root with $OUT set.
python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k rwgmma 2>&1 \
  | tee $OUT/tests-rwgmma.log | tail -2
timeout 300 python3 -m experiments.depth_loop 2>&1 | tee $OUT/experiment.log | tail -9
timeout 240 python3 -m pytest -q -m gpu tests/test_fast_loop.py 2>&1 \
  | tee $OUT/tests-loop.log | tail -2
