"""The simulator's prediction for the depth frame's kv-head attention tasks
(FrameOptions(kv_attention=True); notes/depth-frame.md, session 27), CPU only: the whole-frame
calibration (the published depth-frame summary's stamps at 1 and 64 rows, costs linear in rows
between, handoff 0 as the fit puts it) for today's schedule against the kv_attention schedule
(half the attention tasks, each also waiting on the previous position's attention first) with
schedules.frame_sim.kv_attention_costs, over the new task's body after its qkv wait (2 / 3 / 5
µs) and before it (the older slots' loads: EARLY_US), each plus the chain's signal.

    python3 scripts/predict_kv_attention.py [--rows 1 16 64]
"""
import argparse
import dataclasses

from experiments.frame_schedule import WHOLE_FIT_ROWS, _published_stamps
from schedules import depth_frame as D
from schedules import frame_sim as F
from schedules.plan import FRAME_RING

EARLY_US = 1.5  # wait2's acquire + a barrier + one L2 round of 30 16-byte loads, 128 threads
BODIES_US = (2.0, 3.0, 5.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16, 64])
    args = p.parse_args(argv)
    measured, source = _published_stamps("depth-frame")
    lo, hi = WHOLE_FIT_ROWS
    fitted = {r: F.costs_from_stamps(measured[r]) for r in (lo, hi)}
    so = F.SimOptions(producer_warp=True, cluster_wait_at_end=True)
    print(f"calibration: {source}")
    for r in args.rows:
        costs = dataclasses.replace(F.costs_between((lo, fitted[lo]), (hi, fitted[hi]), r),
                                    handoff_us=0.0)
        signal = costs.fixed_us["norm"] - F.NORM_BODY_US  # the chain's signal a task
        s0 = D.build(options=D.FrameOptions(rows=r, **FRAME_RING))
        base = F.simulate(s0, costs, so)
        s1 = D.validate(D.build(options=D.FrameOptions(rows=r, kv_attention=True,
                                                       **FRAME_RING)))
        order = D.topological_order(s1)
        cells = []
        for body in BODIES_US:
            c = F.kv_attention_costs(costs, body, EARLY_US, signal)
            x = F.simulate(s1, c, so, order=order)
            cells.append(f"body {body:.0f} µs: {x.makespan_us:.0f} "
                         f"({x.makespan_us - base.makespan_us:+.0f}; chain attn "
                         f"{x.critical_path.get('attn', 0):.0f})")
        print(f"rows {r}: today {base.makespan_us:.0f} µs (attn today {costs.fixed_us['attn']:.1f}"
              f" µs a task, chain attn {base.critical_path.get('attn', 0):.0f}; measured frame "
              f"{measured.get(r, {}).get('frame_us', float('nan')):.0f}); " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
