#!/bin/bash
# v12e's device call (notes/fast-loop.md): the kernel GPU tests the change touches,
# results/depth-loop.json and every GPU test of the loop. Run from the repository root with
# $OUT set.
python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k "rwgmma or draw or frame_tiles" \
  2>&1 | tee $OUT/tests-kernels.log | tail -2
timeout 300 python3 -m experiments.depth_loop 2>&1 | tee $OUT/experiment.log | tail -9
timeout 240 python3 -m pytest -q -m gpu tests/test_fast_loop.py 2>&1 \
  | tee $OUT/tests-loop.log | tail -2
