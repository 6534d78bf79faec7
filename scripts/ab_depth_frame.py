"""Same-run A/B of the depth frame kernel's norm phase (issue #37 item 1; notes/depth-frame.md,
session 21): per row count, one DepthFrame with each qkv / gate-up / head tile normalising its
own input (today's build) and one with ``norm_once=True`` (a norm phase publishes each
normalised input once), on the same random 1.7B weights and inputs, greedy draws:

* the launch (counter reset + kernel) of each, timed in alternating rounds (workbench.timing
  .bench, median of each round), so drift hits both alike;
* the bits: codes, Talker sum, KV and logits equal between the two (the design's claim);
* one traced frame of each: the critical chain's split and per-type medians (the norm task's
  body is ``tile_times["norm"]``, the prediction's 2-5 µs).

    python3 scripts/ab_depth_frame.py --rows 1 16 64 [--rounds 3] [--rep-ms 300]

Writes the record ``depth-frame-norm-once-ab.json`` (workbench.results.write_record: the run
folder or $WB_RESULTS_DIR) and prints a table.
"""
import argparse
import statistics

import torch

from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from experiments.frame_protocol import _tile_times, critical_chain
from experiments._frame_studies import same_bits, snapshot_outputs
from kernels.depth.frame import DepthFrame
from models.codepredictor import random_weights
from models.fast_loop import FastWeights
from workbench.results import provenance_line, write_record
from workbench.timing import bench

PREDICTION = {  # notes/depth-frame.md, session 28 (after item 4; the delta is norm once - in-tile)
    32: "+100..+300 µs (in-tile stays the rule below 64 rows)",
    64: "+150..+350 µs: in-tile now wins at 64 rows (the norm tasks' ~740 µs of chain against "
        "~440-525 µs of in-tile normalisation in ~175 normalised tiles)"}


def _case(fw, rows: int, rounds: int, rep_ms: float) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows)
    h = torch.randn(rows, CFG.talker_hidden, generator=g, device="cuda").to(torch.bfloat16)
    g0 = torch.randint(0, CFG.talker_vocab, (rows,), generator=g, device="cuda")
    arms = {"in_tile": False, "norm_once": True}
    frames, outs = {}, {}
    for name, on in arms.items():
        f = DepthFrame(fw, rows, norm_once=on)
        f.poison()
        outs[name] = snapshot_outputs(f(h, g0))
        f.run.synchronize()
        assert f.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}, name
        frames[name] = f
    times = {name: [] for name in arms}
    for _ in range(rounds):
        for name, f in frames.items():
            times[name].append(bench(f.launch, warmup_ms=50, rep_ms=rep_ms,
                                     repeat=False).median_us)
    out = {"rows": rows, "bits_equal": same_bits(outs["in_tile"], outs["norm_once"]),
           "prediction_delta": PREDICTION.get(rows)}
    for name in arms:
        out[f"{name}_us"] = statistics.median(times[name])
        out[f"{name}_rounds_us"] = times[name]
    del frames
    for name, on in arms.items():
        t = DepthFrame(fw, rows, norm_once=on, trace=True)
        t(h, g0)
        t.run.synchronize()
        stamps = t.run.task_stamps()
        out[f"{name}_chain"] = critical_chain(t.schedule, stamps)
        out[f"{name}_tile_times"] = _tile_times(t.schedule, stamps)
        del t
    torch.cuda.empty_cache()
    out["delta_us"] = out["norm_once_us"] - out["in_tile_us"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16, 64])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep-ms", type=float, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(provenance_line())
    w = random_weights(CFG, seed=args.seed, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    cases = []
    for r in args.rows:
        x = _case(fw, r, args.rounds, args.rep_ms)
        cases.append(x)
        norm = x["norm_once_tile_times"].get("norm", {})
        print(f"rows {r}: in-tile {x['in_tile_us']:.0f} µs, norm once {x['norm_once_us']:.0f} "
              f"µs ({x['delta_us']:+.0f}; predicted {x['prediction_delta']}), bits equal "
              f"{x['bits_equal']}, norm task {norm}", flush=True)
    path = write_record("depth-frame-norm-once-ab", {
        "parameters": vars(args), "prediction": PREDICTION, "cases": cases},
        seeds={"weights": args.seed})
    keys = ("handoff_us", "landing_us", "compute_us", "epilogue_us", "signal_us")
    print(f"{'rows':>4} {'in-tile':>8} {'once':>8} {'delta':>7} bits  chain in-tile / once "
          f"({'/'.join(k[:-3] for k in keys)})")
    for x in cases:
        c0, c1 = x["in_tile_chain"], x["norm_once_chain"]
        print(f"{x['rows']:>4} {x['in_tile_us']:>8.0f} {x['norm_once_us']:>8.0f} "
              f"{x['delta_us']:>+7.0f} {str(x['bits_equal']):5} "
              f"{'/'.join(f'{c0[k]:.0f}' for k in keys)}  {'/'.join(f'{c1[k]:.0f}' for k in keys)}")
    print(f"wrote {path}")
    return 0 if all(x["bits_equal"] for x in cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
