#!/bin/bash
# v13a's device call (notes/fast-loop.md): the draw's kernel tests, the 64-row A/B of
# draw_advance, the draw's trace at 64 rows, then the experiment. From the repository root
# with $OUT set.
timeout 200 python3 -m pytest -q -m gpu tests/test_depth_kernels.py -k "draw" 2>&1 \
  | tee $OUT/tests-draw.log | tail -3
timeout 150 python3 scripts/ab_frame.py --rows 64 --rounds 3 --instances 2 --variant "" \
  --variant "draw_advance=False" 2>&1 | tee $OUT/ab-v13a-64.log | tail -4
timeout 60 python3 scripts/trace_frame.py --kernel draw --rows 64 2>&1 \
  | tee $OUT/trace-draw-64.log | tail -12
timeout 240 python3 -m experiments.depth_loop 2>&1 | tee $OUT/experiment.log | tail -10
