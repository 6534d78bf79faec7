"""Same-run A/B of the depth frame kernel's per-chunk waits (issue #37 item 5, first half;
notes/depth-frame.md, session 28): per row count, one DepthFrame whose o and down tasks wait for
the whole producer phase (today's build) and one with ``chunk_waits=True`` (each K stage of
an o / down task waits only for the attention or gate/up tasks that write its K range), on
the same random 1.7B weights and inputs, greedy draws:

* the launch (counter reset + kernel) of each, timed in alternating rounds (workbench.timing
  .bench, median of each round), so drift hits both alike;
* the bits: codes, Talker sum, KV and logits equal between the two (the same arithmetic);
* one traced frame of each: the critical chain's split and per-type medians (a chunked
  task's chunk waits fall in its landing and compute: kernels/depth/frame/launch.py
  ProtocolRun.task_stamps).

    python3 scripts/ab_frame_chunks.py --rows 1 16 64 [--rounds 3] [--rep-ms 300]

Writes the record ``depth-frame-chunk-waits-ab.json`` (workbench.results.write_record: the run
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

# notes/depth-frame.md, session 28 (the delta is chunked - whole-phase waits)
PREDICTION = {
    "simulator_all_projections": "-70..-90 µs at 1 and 16 rows, -0..-90 at 64 (frame_sim's "
                                 "per_chunk_waits approximation, which chunks every projection, "
                                 "the normalised ones too)",
    "simulator_o_down": "0 µs (±1): the simulator with this build's real chunk counters (o and "
                        "down only); its uniform per-type costs end a producer phase's tasks "
                        "together, so only the hardware's spread of attention and gate/up "
                        "task ends can be gained",
    "expected": "-0..-40 µs a frame (within ~1 %), the same bits"}


def _case(fw, rows: int, rounds: int, rep_ms: float) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows)
    h = torch.randn(rows, CFG.talker_hidden, generator=g, device="cuda").to(torch.bfloat16)
    g0 = torch.randint(0, CFG.talker_vocab, (rows,), generator=g, device="cuda")
    arms = {"whole": False, "chunks": True}
    frames, outs = {}, {}
    for name, on in arms.items():
        f = DepthFrame(fw, rows, chunk_waits=on)
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
    out = {"rows": rows, "bits_equal": same_bits(outs["whole"], outs["chunks"]),
           "norm_once": frames["whole"].schedule.options.norm_once,
           "counters": {n: len(f.schedule.counter_expect) for n, f in frames.items()}}
    for name in arms:
        out[f"{name}_us"] = statistics.median(times[name])
        out[f"{name}_rounds_us"] = times[name]
    del frames
    for name, on in arms.items():
        t = DepthFrame(fw, rows, chunk_waits=on, trace=True)
        t(h, g0)
        t.run.synchronize()
        stamps = t.run.task_stamps()
        out[f"{name}_chain"] = critical_chain(t.schedule, stamps)
        out[f"{name}_tile_times"] = _tile_times(t.schedule, stamps)
        del t
    torch.cuda.empty_cache()
    out["delta_us"] = out["chunks_us"] - out["whole_us"]
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
        print(f"rows {r}: whole-phase waits {x['whole_us']:.0f} µs, chunk waits "
              f"{x['chunks_us']:.0f} µs ({x['delta_us']:+.0f}; predicted "
              f"{PREDICTION['expected']}), bits equal {x['bits_equal']}", flush=True)
    path = write_record("depth-frame-chunk-waits-ab", {
        "parameters": vars(args), "prediction": PREDICTION, "cases": cases},
        seeds={"weights": args.seed})
    keys = ("handoff_us", "landing_us", "compute_us", "epilogue_us", "signal_us")
    print(f"{'rows':>4} {'whole':>8} {'chunks':>8} {'delta':>7} bits  chain whole / chunks "
          f"({'/'.join(k[:-3] for k in keys)})")
    for x in cases:
        c0, c1 = x["whole_chain"], x["chunks_chain"]
        print(f"{x['rows']:>4} {x['whole_us']:>8.0f} {x['chunks_us']:>8.0f} "
              f"{x['delta_us']:>+7.0f} {str(x['bits_equal']):5} "
              f"{'/'.join(f'{c0[k]:.0f}' for k in keys)}  {'/'.join(f'{c1[k]:.0f}' for k in keys)}")
    print(f"wrote {path}")
    return 0 if all(x["bits_equal"] for x in cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
