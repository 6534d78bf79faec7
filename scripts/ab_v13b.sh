#!/bin/bash
# v13b's device call (notes/fast-loop.md): the GEMV kernel tests, the 1-row A/B of gemv_x,
# then the experiment. From the repository root with $OUT set.
timeout 200 python3 -m pytest -q -m gpu tests/test_depth_kernels.py tests/test_fast_loop.py \
  -k "gemv" 2>&1 | tee $OUT/tests-gemv.log | tail -3
timeout 150 python3 scripts/ab_frame.py --rows 1 --rounds 3 --instances 2 --variant "" \
  --variant "gemv_x='direct'" 2>&1 | tee $OUT/ab-v13b-1.log | tail -3
timeout 240 python3 -m experiments.depth_loop 2>&1 | tee $OUT/experiment.log | tail -10
