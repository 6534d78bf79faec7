"""Same-run A/B of a depth frame kernel study switch (norm_once or kv_attention).

Per row count, on the same random 1.7B weights and inputs, greedy draws. ``--study
norm_once`` (the default; issue #37 item 1, notes/depth-frame.md session 21): each qkv /
gate-up / head tile normalising its own input (today's build) against ``norm_once=True`` (a
norm phase publishes each normalised input once).
``--study kv_attention`` (item 2, session 27): today's attention tasks (a q head, 8 rows)
against ``kv_attention=True`` (a kv head and both its q heads, 8 rows, the older slots loaded
before the qkv wait); both arms normalise as the plan says (schedules.plan.frame_norm_once).

* the launch (counter reset + kernel) of each, timed in alternating rounds (workbench.timing
  .bench, median of each round), so drift hits both alike;
* the bits: norm_once, codes, Talker sum, KV and logits equal between the two (the design's
  claim); kv_attention (other sum orders): the share of codes equal, the worst KV and logits
  differences where every code of the row agrees, and a rerun of the new arm bit-identical;
* one traced frame of each: the critical chain's split and per-type medians (the norm task's
  body is ``tile_times["norm"]``, the prediction's 2-5 µs; the attention task's, from its qkv
  wait, ``tile_times["attn"]``, predicted ~3 µs).

    python3 scripts/ab_depth_frame.py --rows 1 16 64 [--study kv_attention] [--rounds 3]
        [--rep-ms 300]

Writes the record ``depth-frame-norm-once-ab.json`` or ``depth-frame-kv-attention-ab.json``
(workbench.results.write_record: the run folder or $WB_RESULTS_DIR) and prints a table. Exits
1 if norm_once's bits differ, or kv_attention's rerun differs or its logits are not finite.
"""
import argparse
import statistics

import torch

from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from experiments.frame_protocol import _tile_times, critical_chain
from kernels.depth.frame import DepthFrame
from models.codepredictor import random_weights
from models.fast_loop import FastWeights
from workbench.results import provenance_line, write_record
from workbench.timing import bench

STUDIES = {  # arm name -> DepthFrame keyword arguments (the first arm is today's build)
    "norm_once": {"in_tile": {"norm_once": False}, "norm_once": {"norm_once": True}},
    "kv_attention": {"q_head": {}, "kv_attention": {"kv_attention": True}},
}
PREDICTIONS = {
    # notes/depth-frame.md, session 21 (simulator, central: body 3 µs, high share)
    "norm_once": {1: "+60 µs (-106..+620)", 16: "-156 µs (-320..+527)",
                  64: "-846 µs (-1002..+233)"},
    # session 27 (simulator, central: body 3 µs after the qkv wait, 1.5 µs before it)
    "kv_attention": {1: "-246 µs (-326..-86)", 16: "-298 µs (-378..-138)",
                     64: "-464 µs (-544..-304)"},
}


def _same(a, b) -> bool:
    return (torch.equal(a.codes, b.codes) and torch.equal(a.logits.view(torch.int32),
                                                          b.logits.view(torch.int32))
            and torch.equal(a.talker_sum.view(torch.int16), b.talker_sum.view(torch.int16))
            and all(torch.equal(k.view(torch.int16), k1.view(torch.int16)) and
                    torch.equal(v.view(torch.int16), v1.view(torch.int16))
                    for (k, v), (k1, v1) in zip(a.kv, b.kv)))


def _snapshot(out):
    return type(out)(out.codes.clone(), out.talker_sum.clone(),
                     [(k.clone(), v.clone()) for k, v in out.kv], out.logits.clone())


def _agreement(a, b) -> dict:
    """kv_attention's comparison (other sum orders, greedy draws): the share of codes equal,
    and over the rows whose codes all agree the worst KV and logits differences, each over the
    largest value of ``b`` (tests/test_depth_frame.py's measures)."""
    rows = (a.codes == b.codes).all(dim=1)
    out = {"codes_equal": float((a.codes == b.codes).float().mean()),
           "rows_all_codes_equal": int(rows.sum()), "logits_finite":
           bool(torch.isfinite(a.logits).all())}
    if rows.any():
        out["kv"] = max(float((x[rows].float() - y[rows].float()).abs().max()
                              / y.float().abs().max())
                        for (ka, va), (kb, vb) in zip(a.kv, b.kv) for x, y in ((ka, kb), (va, vb)))
        out["logits"] = float((a.logits[rows] - b.logits[rows]).abs().max()
                              / b.logits.abs().max())
    return out


def _case(fw, rows: int, rounds: int, rep_ms: float, study: str = "norm_once") -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows)
    h = torch.randn(rows, CFG.talker_hidden, generator=g, device="cuda").to(torch.bfloat16)
    g0 = torch.randint(0, CFG.talker_vocab, (rows,), generator=g, device="cuda")
    arms = STUDIES[study]
    frames, outs = {}, {}
    for name, kw in arms.items():
        f = DepthFrame(fw, rows, **kw)
        f.poison()
        outs[name] = _snapshot(f(h, g0))
        f.run.synchronize()
        assert f.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}, name
        frames[name] = f
    times = {name: [] for name in arms}
    for _ in range(rounds):
        for name, f in frames.items():
            times[name].append(bench(f.launch, warmup_ms=50, rep_ms=rep_ms,
                                     repeat=False).median_us)
    old, new = arms
    out = {"rows": rows, "study": study, "prediction_delta": PREDICTIONS[study].get(rows)}
    if study == "norm_once":
        out["bits_equal"] = _same(outs[old], outs[new])
        out["ok"] = out["bits_equal"]
    else:
        f = frames[new]
        f.poison()
        again = _snapshot(f(h, g0))
        f.run.synchronize()
        out["rerun_identical"] = _same(again, outs[new])
        out["agreement"] = _agreement(outs[new], outs[old])
        out["ok"] = out["rerun_identical"] and out["agreement"]["logits_finite"]
    for name in arms:
        out[f"{name}_us"] = statistics.median(times[name])
        out[f"{name}_rounds_us"] = times[name]
    del frames
    for name, kw in arms.items():
        t = DepthFrame(fw, rows, trace=True, **kw)
        t(h, g0)
        t.run.synchronize()
        stamps = t.run.task_stamps()
        out[f"{name}_chain"] = critical_chain(t.schedule, stamps)
        out[f"{name}_tile_times"] = _tile_times(t.schedule, stamps)
        del t
    torch.cuda.empty_cache()
    out["delta_us"] = out[f"{new}_us"] - out[f"{old}_us"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16, 64])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep-ms", type=float, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--study", choices=sorted(STUDIES), default="norm_once")
    args = p.parse_args(argv)
    old, new = STUDIES[args.study]
    watch = {"norm_once": "norm", "kv_attention": "attn"}[args.study]
    print(provenance_line())
    w = random_weights(CFG, seed=args.seed, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    cases = []
    for r in args.rows:
        x = _case(fw, r, args.rounds, args.rep_ms, args.study)
        cases.append(x)
        checks = {k: x[k] for k in ("bits_equal", "rerun_identical", "agreement") if k in x}
        print(f"rows {r}: {old} {x[f'{old}_us']:.0f} µs, {new} {x[f'{new}_us']:.0f} µs "
              f"({x['delta_us']:+.0f}; predicted {x['prediction_delta']}), {checks}, {watch} "
              f"task {x[f'{old}_tile_times'].get(watch, {})} -> "
              f"{x[f'{new}_tile_times'].get(watch, {})}", flush=True)
    name = {"norm_once": "depth-frame-norm-once-ab",
            "kv_attention": "depth-frame-kv-attention-ab"}[args.study]
    path = write_record(name, {"parameters": vars(args), "prediction": PREDICTIONS[args.study],
                               "cases": cases}, seeds={"weights": args.seed})
    keys = ("handoff_us", "landing_us", "compute_us", "epilogue_us", "signal_us")
    print(f"{'rows':>4} {old[:8]:>8} {new[:8]:>8} {'delta':>7} ok    chain {old} / {new} "
          f"({'/'.join(k[:-3] for k in keys)})")
    for x in cases:
        c0, c1 = x[f"{old}_chain"], x[f"{new}_chain"]
        print(f"{x['rows']:>4} {x[f'{old}_us']:>8.0f} {x[f'{new}_us']:>8.0f} "
              f"{x['delta_us']:>+7.0f} {str(x['ok']):5} "
              f"{'/'.join(f'{c0[k]:.0f}' for k in keys)}  {'/'.join(f'{c1[k]:.0f}' for k in keys)}")
    print(f"wrote {path}")
    return 0 if all(x["ok"] for x in cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
