"""Same-run A/B of one of the depth frame kernel's exact options (issue #37; notes/depth-frame.md):
per row count, one DepthFrame with the option off and one with it on, on the same random 1.7B
weights and inputs, greedy draws. The options (each a DepthFrame keyword whose default is the
plan's rule, and each promising the same bits):

* ``norm_once`` (item 1): a norm phase publishes each normalised qkv / gate-up / head input
  once, against each tile normalising its own (the norm task's body is
  ``tile_times["norm"]``);
* ``chunk_waits`` (item 5): each K stage of an o / down task waits only for the attention or
  gate/up tasks that write its K range, against waiting for the whole producer phase (a
  traced chunked task's later chunk waits fall in its landing and compute:
  ProtocolRun.task_stamps).

(Session 29's ``bulk_store``, one bulk store a projection tile, ran here too and lost: its
code left, its record is notes/depth-frame.md's and git's, a66f7de. So did session 30's
``register_a`` (#37 item 3's register-A projection tiles, against the ring's; other bits) and
``lanes`` (two consumer warpgroups on them, against one): 13f9403.)

For each: the launch (counter reset + kernel) of each arm, timed in alternating rounds
(workbench.timing.bench, median of each round), so drift hits both alike; the bits (codes,
Talker sum, KV and logits equal between the two); one traced frame of each (the critical
chain's split and per-type medians).

    python3 scripts/ab_frame_option.py --option chunk_waits --rows 1 16 64 [--rounds 3]

Writes the option's record (``depth-frame-<option>-ab.json``, workbench.results.write_record:
the run folder or $WB_RESULTS_DIR) and prints a table; exits 1 when any bits differ.
"""
import argparse
import statistics

import torch

from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from experiments._frame_studies import same_bits, snapshot_outputs
from experiments.frame_protocol import _tile_times, critical_chain
from kernels.depth.frame import DepthFrame
from models.codepredictor import random_weights
from models.fast_loop import FastWeights
from workbench.results import provenance_line, write_record
from workbench.timing import alternating_rounds

# option: (record, the arms' names off / on, the predictions written before the runs, by key)
OPTIONS = {
    "norm_once": ("depth-frame-norm-once-ab", ("in_tile", "norm_once"), {
        # notes/depth-frame.md, session 28 (after item 4; the delta is norm once - in-tile)
        32: "+100..+300 µs (in-tile stays the rule below 64 rows)",
        64: "+150..+350 µs: in-tile now wins at 64 rows (the norm tasks' ~740 µs of chain "
            "against ~440-525 µs of in-tile normalisation in ~175 normalised tiles)"}),
    "chunk_waits": ("depth-frame-chunk-waits-ab", ("whole", "chunks"), {
        # notes/depth-frame.md, session 28 (the delta is chunked - whole-phase waits)
        "simulator_all_projections": "-70..-90 µs at 1 and 16 rows, -0..-90 at 64 (frame_sim's "
                                     "per_chunk_waits approximation, which chunks every "
                                     "projection, the normalised ones too)",
        "simulator_o_down": "0 µs (±1): the simulator with this build's real chunk counters (o "
                            "and down only); its uniform per-type costs end a producer phase's "
                            "tasks together, so only the hardware's spread of attention and "
                            "gate/up task ends can be gained",
        "expected": "-0..-40 µs a frame (within ~1 %), the same bits"}),
}
CHAIN = ("handoff_us", "landing_us", "compute_us", "epilogue_us", "signal_us")


def _case(fw, option: str, rows: int, rounds: int, rep_ms: float) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows)
    h = torch.randn(rows, CFG.talker_hidden, generator=g, device="cuda").to(torch.bfloat16)
    g0 = torch.randint(0, CFG.talker_vocab, (rows,), generator=g, device="cuda")
    _, names, prediction = OPTIONS[option]
    arms = dict(zip(names, (False, True)))
    frames, outs = {}, {}
    for name, on in arms.items():
        f = DepthFrame(fw, rows, **{option: on})
        f.poison()
        outs[name] = snapshot_outputs(f(h, g0))
        f.run.synchronize()
        assert f.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}, name
        frames[name] = f
    times = alternating_rounds({name: f.launch for name, f in frames.items()}, rounds,
                               warmup_ms=50, rep_ms=rep_ms)
    off, on = names
    out = {"rows": rows, "option": option, "bits_equal": same_bits(outs[off], outs[on]),
           "prediction": prediction.get(rows, prediction.get("expected")),
           "options": {n: {"norm_once": f.schedule.options.norm_once,
                           "chunk_waits": f.schedule.options.chunk_waits}
                       for n, f in frames.items()},
           "counters": {n: len(f.schedule.counter_expect) for n, f in frames.items()}}
    for name in arms:
        out[f"{name}_us"] = statistics.median(times[name])
        out[f"{name}_rounds_us"] = times[name]
    del frames
    for name, value in arms.items():
        t = DepthFrame(fw, rows, trace=True, **{option: value})
        t(h, g0)
        t.run.synchronize()
        stamps = t.run.task_stamps()
        out[f"{name}_chain"] = critical_chain(t.schedule, stamps)
        out[f"{name}_tile_times"] = _tile_times(t.schedule, stamps)
        del t
    torch.cuda.empty_cache()
    out["delta_us"] = out[f"{on}_us"] - out[f"{off}_us"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--option", required=True, choices=list(OPTIONS))
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16, 64])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep-ms", type=float, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if any(not 1 <= r <= 64 for r in args.rows):
        p.error("--rows: the frame takes 1..64 rows")
    record, (off, on), prediction = OPTIONS[args.option]
    print(provenance_line())
    w = random_weights(CFG, seed=args.seed, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    cases = []
    for r in args.rows:
        x = _case(fw, args.option, r, args.rounds, args.rep_ms)
        cases.append(x)
        print(f"rows {r}: {off} {x[f'{off}_us']:.0f} µs, {on} {x[f'{on}_us']:.0f} µs "
              f"({x['delta_us']:+.0f}; predicted {x['prediction']}), bits equal "
              f"{x['bits_equal']}", flush=True)
    path = write_record(record, {"parameters": vars(args), "prediction": prediction,
                                 "cases": cases}, seeds={"weights": args.seed})
    print(f"{'rows':>4} {off:>12} {on:>12} {'delta':>7} bits  chain {off} / {on} "
          f"({'/'.join(k[:-3] for k in CHAIN)})")
    for x in cases:
        c0, c1 = x[f"{off}_chain"], x[f"{on}_chain"]
        print(f"{x['rows']:>4} {x[f'{off}_us']:>12.0f} {x[f'{on}_us']:>12.0f} "
              f"{x['delta_us']:>+7.0f} {str(x['bits_equal']):5} "
              f"{'/'.join(f'{c0[k]:.0f}' for k in CHAIN)}  "
              f"{'/'.join(f'{c1[k]:.0f}' for k in CHAIN)}")
    print(f"wrote {path}")
    return 0 if all(x["bits_equal"] for x in cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
