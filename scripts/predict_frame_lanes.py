"""The simulator's bound on #37 item 3's two consumer lanes (notes/depth-frame.md, session 29),
CPU only. Two warpgroups that take alternate tasks let a task start while its CTA's previous
task still runs, so what they can gain is the time the chain spends waiting for a busy CTA
rather than for its inputs. The simulator (schedules.frame_sim) is calibrated as
experiments/frame_schedule.py calibrates it: the published depth-frame summary's stamps at 1
and 64 rows, costs linear in rows between them, the handoff fitted, each row count's
schedule as its frame ran it. Each schedule is then simulated with one lane a CTA and with two
(``SimOptions(lanes=2)``: task i waits for task i - 2 of its CTA). Each lane's body stays as
long as it is alone, so the SM's tensor cores and copies are not shared; that makes the gain an
upper bound.

    python3 scripts/predict_frame_lanes.py [--rows 1 8 16 32 64]
"""
import argparse
import dataclasses

from experiments.frame_schedule import (WHOLE_FIT_ROWS, _production_plan, _published_stamps,
                                        _whole_frame_calibration, _whole_frame_costs)
from schedules import frame_sim as F


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=[1, 8, 16, 32, 64])
    args = p.parse_args(argv)
    measured, source = _published_stamps("depth-frame")
    if any(r not in measured for r in args.rows):
        p.error(f"--rows: the published summary measured {sorted(measured)}")
    built: dict = {}
    fit = _whole_frame_calibration(built, coarse_to_fine=True)
    if fit is None:
        p.error(f"the published depth-frame summary has no traced runs at {WHOLE_FIT_ROWS} rows")
    lo, hi = WHOLE_FIT_ROWS
    fitted = _whole_frame_costs(measured)
    print(f"calibration: {source}, handoff {fit['handoff_us']} µs")
    print(f"{'rows':>4} {'measured':>9} {'1 lane':>8} {'2 lanes':>8} {'gain':>6}")
    for r in args.rows:
        s, order = _production_plan(built, r, measured[r])
        costs = dataclasses.replace(F.costs_between((lo, fitted[lo]), (hi, fitted[hi]), r),
                                    handoff_us=fit["handoff_us"])
        one, two = (F.simulate(s, costs, F.SimOptions(producer_warp=True,
                                                      cluster_wait_at_end=True, lanes=n),
                               order=order).makespan_us for n in (1, 2))
        print(f"{r:>4} {measured[r]['frame_us']:>9.0f} {one:>8.0f} {two:>8.0f} "
              f"{two - one:>+6.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
