"""P2 ring capacity: latency of the bounded packed-tile ring against its capacity.

Per streamed H3 projection (qkv 21504x5376, out 5376x5376, fc1 14336x5376; fc2 stays on P0, as
in the seed, and is timed on the complete path only) at M = 37810 rows and ring capacities 128,
512, 1024, 2048 and 4096 rows, in one process:

* ``complete``: the complete quantize + P0 path as Nvfp4Linear's p0 runs it: amax kernel ->
  g, the whole activation quantized and expanded to f16 into preallocated buffers,
  gemm_nvfp4(a16=) over all rows with the f16 ``default_config(M, ...,
  stream_k=False)``;
* ``total`` (per capacity): the ring as Nvfp4Linear's p2: the same amax -> g, then chunk by
  chunk the quantize-and-expand into the ring (packed rows, scales and f16 rows; allocated per
  call on the calling stream) and gemm_nvfp4 on the ring with the SAME config
  (kernels/nvfp4/ring.py); ``total_eager`` the same without a graph (host time included: the
  ring makes 2 launches a chunk, 592 at 128 rows);
* ``chunk`` (per capacity): one full chunk alone, quantize into the ring + its GEMM.

Timed under CUDA-graph replay (workbench.timing.bench: medians, a repeat for the spread); the
activation (406 MB at qkv) exceeds L2 many times, so one operand set. Bytes: ring_bytes
(schedules.p2_ring, f16 rows included) against the whole activation's packed + f16 buffers.

Exactness in the same run: at every capacity the ring's output equals the complete path's bit
for bit, chunk by chunk (the first differing chunk is named). Headline per shape:
``best_capacity`` and ``best_speedup`` (complete / ring total, graph; > 1: the ring is faster),
``speedup_by_capacity``; gates: bit identity, and the ring at its best capacity not slower than
the complete path (notes/p2.md predicts it is slower at every capacity: wave quantization).
The plot (workbench.plots.p2_capacity_png): relative latency and chunk latency against capacity.
"""
from __future__ import annotations

import torch

from experiments._common import need_gpu, parser, progress, run_main
from kernels.nvfp4.amax import amax
from kernels.nvfp4.gemm import default_config, gemm_nvfp4
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import quantize_expand_nvfp4, quantize_nvfp4
from kernels.nvfp4.ring import PackedRing, ring_gemm
from numerics import nvfp4
from schedules import p2_ring as P
from workbench import WorkbenchError
from workbench import results as R
from workbench.plots import p2_capacity_png
from workbench.timing import bench

STREAMED = {"qkv": (21504, 5376), "out": (5376, 5376), "fc1": (14336, 5376)}
PINNED = {"fc2": (5376, 14336)}  # on P0 (the seed: its K = 14336 reduction contract)
M_DEFAULT = 37810
QUICK_CAPACITIES = (512, 2048)
SPEEDUP_TARGET = 1.0  # the ring must not be slower than the complete path (seed's P2 rule)
NOTES = {
    "prediction_f16": "session 22 (notes/p2.md, before any run; the ring and the complete path "
                      "on the f16 builds Nvfp4Linear runs, the 256-token build at M = 37810): "
                      "best_capacity 4096, best_speedup ~0.96-0.99 at qkv (chunked rounds of "
                      "256 x 128 tiles: 195 against 189 whole at 4096, 204 at 2048), the "
                      "ring saving the whole activation's f16 round trip (~170 us at qkv); "
                      "ring bytes 28 MB at 2048 rows (f16 rows 4.5x the packed ones), so the "
                      "8.3 MB target holds only up to ~600 rows.",
    "prediction": "session 18 (notes/p2.md, before any run): best_capacity 4096 at every "
                  "shape, best_speedup below 1 everywhere (qkv ~0.97, out ~0.86, fc1 ~0.97; "
                  "2048 within 1-5 % of 4096): each chunk's GEMM ends in a partial round of "
                  "132 SMs (rounds at 2048: qkv 204 vs 189 whole, out 56 vs 48, fc1 130 vs 126, "
                  "~91 µs a round), while the ring saves at most the packed activation's DRAM "
                  "round trip (~60 µs of 4.4-17.7 ms). The curve falls steeply below 512 rows.",
}


def _operands(N, K, M, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device="cuda")
    x = (x * torch.exp(torch.randn(K, generator=gen, device="cuda"))).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
    g_w = nvfp4.global_scale_from_amax(amax(w)).reshape(1)
    w_q, w_s = quantize_nvfp4(w, g_w, pad_16x=True)
    del w
    return x, w_q, w_s, g_w


def _time(fn, quick, calls_per_graph=20, graph=True):
    return bench(fn, [()], graph=graph, warmup_ms=10 if quick else 25,
                 rep_ms=60 if quick else 200, calls_per_graph=calls_per_graph).as_dict()


def _g(x):
    return nvfp4.global_scale_from_amax(amax(x)).reshape(1)


def first_bad_chunk(y, want, M: int, capacity: int) -> str | None:
    """The first chunk whose rows differ between the ring's output and the complete path's."""
    for ch in P.chunk_plan(0, M, capacity):
        a, b = y[ch.start:ch.stop].view(torch.int16), want[ch.start:ch.stop].view(torch.int16)
        if not torch.equal(a, b):
            return (f"chunk {ch.index} rows [{ch.start}, {ch.stop}): {int((a != b).sum())} "
                    "elements differ")
    return None


def _shape(name, N, K, M, capacities, quick, seed, streamed=True):
    x, w_q, w_s, g_w = _operands(N, K, M, seed)
    # the ring takes several chunks at every capacity here: never stream-K (kernels/nvfp4/ring.py)
    config = default_config(M, N, K, stream_k=False)
    pre = prepack(w_q, w_s)
    q = torch.zeros(-(-M // 16) * 16, K // 2, dtype=torch.uint8, device="cuda")
    s = torch.zeros(nvfp4.scale_shape(M, K), dtype=torch.uint8, device="cuda")
    f16 = torch.empty(M, K, dtype=torch.float16, device="cuda")
    want = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")

    def complete():
        g = _g(x)
        qq, ss, ff = quantize_expand_nvfp4(x, g, out=(q, s, f16))
        return gemm_nvfp4(qq, ss, g, w_q, w_s, g_w, rows=(0, M), out=want, config=config,
                          prepacked=pre, a16=ff)

    complete()
    base = {"projection": name, "N": N, "K": K, "M": M, "config": config.describe(),
            "streamed": streamed,
            "activation_bytes": P.ring_bytes(-(-M // 128) * 128, K, f16=True)}
    t = {"complete": _time(complete, quick, calls_per_graph=3),
         "complete_eager": _time(complete, quick, graph=False)}
    complete_us = t["complete"]["median_us"]
    rows = [{**base, "path": "complete", "timings": t, "complete_us": complete_us,
             "complete_eager_us": t["complete_eager"]["median_us"]}]
    progress(f"{name}: complete path {complete_us:.1f} us ({config.describe()['design']}, "
             f"tile_n {config.tile_n}, splits {config.splits})")
    if not streamed:
        return rows
    n_tiles = -(-N // config.tile_n)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    for cap in capacities:
        y.fill_(float("nan"))  # poisoned: the ring must overwrite every element

        def total():
            # the ring from the allocator on the calling stream, as Nvfp4Linear's p2 (a graph
            # capture runs on its own stream: a ring made outside would be refused there)
            return ring_gemm(x, _g(x), w_q, w_s, g_w, capacity=cap, config=config,
                             prepacked=pre, out=y)

        total()
        torch.cuda.synchronize()
        bad = first_bad_chunk(y, want, M, cap)
        chunk_rows = min(cap, M)
        g0 = _g(x)
        ring = PackedRing(cap, K, f16=True)  # the chunk alone: the kernels on it directly

        def chunk():
            quantize_expand_nvfp4(x[:chunk_rows], g0,
                                  out=(ring.q, ring.s, ring.f16[:chunk_rows]))
            return gemm_nvfp4(ring.q, ring.s, g0, w_q, w_s, g_w, rows=(0, chunk_rows),
                              out=y[:chunk_rows], config=config, prepacked=pre, a16=ring.f16)

        tt = {"total": _time(total, quick, calls_per_graph=2),
              "total_eager": _time(total, quick, graph=False),
              "chunk": _time(chunk, quick)}
        plan = P.chunk_plan(0, M, cap)
        row = {**base, "path": "ring", "capacity": cap, "chunks": len(plan),
               "last_chunk_rows": plan[-1].rows, "ring_bytes": ring.nbytes,
               "bit_identical": bad is None, "first_bad_chunk": bad, "timings": tt,
               "total_us": tt["total"]["median_us"],
               "total_eager_us": tt["total_eager"]["median_us"],
               "chunk_us": tt["chunk"]["median_us"], "complete_us": complete_us,
               "complete_share_us": complete_us * chunk_rows / M,
               "predicted_rounds": P.chunked_rounds(0, M, cap, n_tiles, sms, config.tile_m),
               "whole_rounds": P.rounds(M, n_tiles, sms, config.tile_m)}
        row.update(speedups(row, t["complete_eager"]["median_us"]))
        rows.append(row)
        progress(f"  capacity {cap}: total {row['total_us']:.1f} us (x{row['speedup']:.3f}), "
                 f"chunk {row['chunk_us']:.1f} us, {row['ring_bytes'] / 1e6:.2f} MB, "
                 f"bits {'equal' if bad is None else bad}")
        del ring
    return rows


def speedups(row: dict, complete_eager_us: float) -> dict:
    """complete / ring (> 1: the ring is faster), under graphs and eagerly."""
    return {"speedup": row["complete_us"] / row["total_us"],
            "speedup_eager": complete_eager_us / row["total_eager_us"]}


def headline_and_gates(rows: list) -> tuple[dict, dict]:
    """Per streamed shape: the capacity with the best graph speedup, that speedup, and the
    speedup at every capacity; gates: every ring output bit-identical to the complete path,
    and per shape the best speedup >= SPEEDUP_TARGET."""
    ring = [r for r in rows if r.get("path") == "ring"]
    shapes = list(dict.fromkeys(r["projection"] for r in ring))
    headline = {"best_capacity": {}, "best_speedup": {}, "speedup_by_capacity": {}}
    gates = {}
    for name in shapes:
        mine = [r for r in ring if r["projection"] == name]
        best = max(mine, key=lambda r: r["speedup"])
        headline["best_capacity"][name] = best["capacity"]
        headline["best_speedup"][name] = best["speedup"]
        headline["speedup_by_capacity"][name] = {str(r["capacity"]): r["speedup"] for r in mine}
        gates[f"ring_not_slower_{name}"] = R.gate(
            best["speedup"] >= SPEEDUP_TARGET,
            f"best capacity {best['capacity']}: complete / ring {best['speedup']:.3f} vs "
            f"target {SPEEDUP_TARGET}")
    bad = [f"{r['projection']} capacity {r['capacity']}: {r['first_bad_chunk']}"
           for r in ring if not r["bit_identical"]]
    gates["ring_bit_identical"] = R.gate(
        bool(ring) and not bad, f"{len(ring)} ring runs, every chunk equal to the complete path"
        if not bad else "; ".join(bad))
    return headline, gates


def _main(argv) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=M_DEFAULT)
    p.add_argument("--capacities", type=int, nargs="*", default=None)
    p.add_argument("--projections", nargs="*", default=list(STREAMED) + list(PINNED))
    args = p.parse_args(argv)
    caps = args.capacities or (list(QUICK_CAPACITIES) if args.quick else list(P.CAPACITIES))
    for c in caps:
        try:
            P.check_capacity(c)
        except ValueError as e:
            raise WorkbenchError(f"--capacities: {e}") from None
    unknown = [n for n in args.projections if n not in STREAMED and n not in PINNED]
    if unknown:
        raise WorkbenchError(f"unknown projections {unknown}; choose from "
                             f"{list(STREAMED) + list(PINNED)}")
    need_gpu("p2-ring-capacity")
    rows = []
    for name in args.projections:
        N, K = STREAMED.get(name) or PINNED[name]
        progress(f"{name} M={args.m} (N={N}, K={K})")
        rows += _shape(name, N, K, args.m, caps, args.quick, seed=args.seed + N + K,
                       streamed=name in STREAMED)
        torch.cuda.empty_cache()
    headline, gates = headline_and_gates(rows)
    summary = R.make_summary(
        "p2-ring-capacity",
        parameters={"M": args.m, "capacities": caps, "projections": args.projections,
                    "streamed": list(STREAMED), "pinned_to_p0": list(PINNED),
                    "speedup_target": SPEEDUP_TARGET},
        measurements=rows, headline=headline, gates=gates, seeds={"operands": args.seed},
        notes=NOTES)
    path = R.write(summary, args.results_dir)
    try:  # latency against capacity beside the summary (the plots extra)
        progress(f"wrote {p2_capacity_png(summary, path.with_suffix('.png'))}")
    except WorkbenchError as e:
        progress(f"no plot: {e}")
    table = [[r["projection"], r.get("capacity", "whole"),
              f"{r.get('ring_bytes', r['activation_bytes']) / 1e6:.2f}",
              f"{r.get('chunk_us', float('nan')):.1f}",
              f"{r.get('total_us', r['complete_us']):.1f}", f"{r['complete_us']:.1f}",
              f"{r.get('speedup', 1.0):.3f}", f"{r.get('speedup_eager', 1.0):.3f}",
              {True: "equal", False: "DIFFER"}.get(r.get("bit_identical"), "-")]
             for r in rows]
    print(R.format_table(table, ["proj", "capacity", "MB", "chunk us", "total us",
                                 "complete us", "x graph", "x eager", "bits"]))
    print(f"wrote {path} (verdict {summary['verdict']})")
    return 0


def main(argv=None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
