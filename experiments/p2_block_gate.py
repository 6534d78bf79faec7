"""P2's block-level gate (#39): the unfused path, the chunked ring and the persistent work queue
alternating inside one loaded synthetic H3 block.

The block: block 0 of the synthetic H3 (models.h3.FULL, 37,810 tokens, seed 0) on the p0 backend,
its weights packed on the GPU, fed the step-0 activation from the seed's noise. Three paths for
the streamed projections (qkv, out with its gated residual add, fc1; fc2 stays on P0, the seed's
rule), each called as the model calls the projection:
* ``unfused``: Nvfp4Linear p0 (amax, quantize-and-expand of the whole activation into the
  shared scratch, the f16 GEMM): the default path;
* ``ring``: Nvfp4Linear p2 at its ring capacity (kernels/nvfp4/ring.py);
* ``workqueue``: amax, then one launch of kernels/nvfp4/workqueue.py at schedules.plan.WORKQUEUE
  (``--capacity/--slots/--producers`` override it); ``--layouts 256x3x2,256x3x8`` adds queue
  layouts (chunk rows x slots x quantizer CTAs) timed beside it at each projection, a diagnostic
  of where the queue's time goes (their bits are checked too; the block runs the default).

Per path: each projection's latency (CUDA events around one call, the paths taking turns call by
call, median of ``--rounds`` after a warm-up; the activations are 0.4 GB, far beyond L2), the
whole block's latency with that path behind all three projections (same alternation), the
block's output against the unfused block's bit for bit (int16 views), and memory: the bytes each
path holds for the activation (the unfused path's packed codes, scales and f16 expansion of the
whole activation; the ring's or queue's slots) and the peak each projection and the block
reach above what was allocated before them in a **cold** call: every plan and activation
scratch set released first (the unfused path keeps its scratch once made, so a warm call's
"start" already holds it), torch's allocator peak reset before the call.

    python3 -m experiments.p2_block_gate [--quick] [--rounds 7]
    wb run p2-block-gate

``--quick``: the scaled H3 (models.h3.QUICK, 256 tokens): the paths and checks on small shapes
(the queue needs a whole 256-row token tile; timing there means little). Summary
``p2-block-gate.json``; headline ``workqueue_time_over_unfused`` (worst of qkv / out / fc1),
``ring_time_over_unfused``, ``block_time_over_unfused`` per path, ``ring_bytes``,
``peak_bytes_saved`` (the least cold projection peak saved by the queue); gates: bit-identical
blocks, the queue no slower than the unfused path at every streamed projection, ring memory
within 8.3 MB, each cold projection's peak lower by at least the unfused path's activation
tensors less the queue's ring.
"""
from __future__ import annotations

import statistics

import torch

from experiments._common import need_gpu, parser, progress, run_main
from workbench import WorkbenchError
from workbench import results as R

NAME = "p2-block-gate"
PROJECTIONS = ("qkv", "out", "fc1")
PATHS = ("unfused", "ring", "workqueue")
RING_TARGET_BYTES = 8.3e6  # the ring memory target


def activation_bytes(M: int, K: int) -> int:
    """What the unfused path materialises for one activation: packed codes (M16 x K/2, M rounded
    up to 16), the swizzled E4M3 scales and the f16 expansion (M x K x 2)."""
    from numerics import nvfp4
    Mp = -(-M // nvfp4.BLOCK) * nvfp4.BLOCK
    rows, cols = nvfp4.scale_shape(Mp, K)
    return Mp * K // 2 + rows * cols + M * K * 2


class Paths:
    """The three callables per projection on the loaded block's linears: ``call(path, role,
    inp)`` returns the projection's output as the model would get it."""

    def __init__(self, model, layout_kw: dict, extra_layouts: dict | None = None):
        self.lin = model.linears(0)
        self.layout_kw = layout_kw
        self.layouts = {"workqueue": layout_kw, **(extra_layouts or {})}
        self._g_w = {}
        self._ring = {}  # role -> the p2 linear (made once: its prepack and plans are kept)

    def release(self) -> None:
        """Every plan and activation scratch set the paths hold, so the next call is cold."""
        for lin in (*self.lin.values(), *self._ring.values()):
            lin.release_scratch()
        self._ring.clear()

    def call(self, path: str, role: str, inp: dict, out=None):
        lin = self.lin[role]
        x, gate, residual = inp["x"], inp["gate"], inp["residual"]
        if path == "unfused":
            return lin(x, gate=gate, residual=residual, out=out)
        if path == "ring":
            ring = self._ring.get(role)
            if ring is None:
                ring = self._ring[role] = lin.with_backend("p2")
            return ring(x, gate=gate, residual=residual, out=out)
        return self.queue(role, x, gate, residual, out, self.layouts[path])

    def whole(self, role, M: int):
        """(the whole call's 256-token build the queue reproduces, whether the unfused path runs
        that same build): the p0 linear's own choice where it is the 256-token build without
        stream-K, else (small M: the swap-AB build) the 256-token build anyway, whose bits then
        differ from the unfused path's and are checked against their own reference."""
        from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
        from schedules import plan as P
        config, pre = self.lin[role]._p0_config(M, stream_k=False)
        unfused, _ = self.lin[role]._p0_config(M)
        if config.threads == 384 and config.tile_m == 256:
            return config, pre, unfused.static_key() == config.static_key()
        return (BlockscaledGemmSm90.wide_f16(stages=P.WIDE_F16.stages, buffers=P.F16_BUFFERS,
                                             tokens=P.WIDE_F16.tile_n), pre, False)

    def g_w(self, role, device):
        g_w = self._g_w.get(role)
        if g_w is None:
            g_w = self._g_w[role] = torch.tensor([self.lin[role].g_w], dtype=torch.float32,
                                                 device=device)
        return g_w

    def queue(self, role, x, gate, residual, out, layout_kw=None):
        from kernels.nvfp4.amax import amax
        from kernels.nvfp4.workqueue import queue_gemm
        from numerics import nvfp4
        config, pre, _ = self.whole(role, x.shape[0])
        g = nvfp4.global_scale_from_amax(amax(x)).reshape(1)  # the whole activation's
        return queue_gemm(x, g, pre, self.g_w(role, x.device), gate=gate, residual=residual,
                          out=out, config=config,
                          **(self.layout_kw if layout_kw is None else layout_kw))

    def queue_reference(self, role, inp):
        """The whole call the queue must equal: the same g, the whole activation quantized and
        expanded, one GEMM on the same 256-token build."""
        from kernels.nvfp4.amax import amax
        from kernels.nvfp4.gemm import gemm_nvfp4
        from kernels.nvfp4.quantize import quantize_expand_nvfp4
        from numerics import nvfp4
        x = inp["x"]
        M = x.shape[0]
        config, pre, _ = self.whole(role, M)
        lin = self.lin[role]
        g = nvfp4.global_scale_from_amax(amax(x)).reshape(1)
        q, s, f16 = quantize_expand_nvfp4(x, g, pad_16x=True)
        return gemm_nvfp4(q, s, g, lin.w_q, lin.w_s, self.g_w(role, x.device), prepacked=pre,
                          a16=f16, rows=(0, M), config=config, gate=inp["gate"],
                          residual=inp["residual"])

    def ring_bytes(self, path: str, M: int, K: int) -> int:
        from schedules import plan as P
        from schedules.p2_ring import ring_bytes
        if path == "unfused":
            return activation_bytes(M, K)
        if path == "ring":
            cap = self.lin["qkv"].with_backend("p2").ring_capacity
            return ring_bytes(cap, K, f16=True)
        d, kw = P.WORKQUEUE, self.layouts[path]
        return kw.get("capacity", d.capacity) * kw.get("slots", d.slots) * K * 2


def timed(fn) -> float:
    """Milliseconds of one call by CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def cold_peak(paths: Paths, fn) -> int:
    """Bytes the allocator's peak rises above its start during ``fn()``, every plan and scratch
    set released first."""
    paths.release()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def parse_layouts(text: str | None) -> dict:
    """``"256x3x2,512x2x4"`` -> {"workqueue 256x3x2": {capacity, slots, producers}, ...},
    each checked by QueueLayout before any GPU work (WorkbenchError)."""
    from producers.ring_queue import QueueLayout
    out = {}
    for item in filter(None, (text or "").split(",")):
        try:
            cap, slots, prod = (int(v) for v in item.strip().split("x"))
            QueueLayout(cap, slots, prod)
        except (TypeError, ValueError) as e:
            raise WorkbenchError(f"--layouts {item!r}: need CAPACITYxSLOTSxPRODUCERS, e.g. "
                                 f"256x3x2 ({e})") from None
        out[f"workqueue {cap}x{slots}x{prod}"] = {"capacity": cap, "slots": slots,
                                                   "producers": prod}
    return out


def block_with(model, paths: Paths, path: str):
    """The model's block 0 with ``path`` behind qkv, out and fc1 (fc2 on P0)."""
    def wrap(block, role, lin):
        if block != 0 or role not in PROJECTIONS or path == "unfused":
            return lin

        def call(a, rows=None, *, gate=None, residual=None):
            if rows is not None:
                raise WorkbenchError(f"{role} called on a row slice")
            return paths.call(path, role, {"x": a, "gate": gate, "residual": residual})
        return call
    return model.derived(wrap=wrap)


def _main(argv) -> int:
    from experiments.p2_parity import build_runner
    from models.h3 import FULL, QUICK

    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7, help="timed calls a path (after 2 warm-up)")
    p.add_argument("--capacity", type=int, default=None)
    p.add_argument("--slots", type=int, default=None)
    p.add_argument("--producers", type=int, default=None)
    p.add_argument("--layouts", default=None,
                   help="extra queue layouts timed at each projection, e.g. 256x3x2,256x3x8")
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise WorkbenchError(f"--rounds {args.rounds}: at least 1")
    layout_kw = {k: getattr(args, k) for k in ("capacity", "slots", "producers")
                 if getattr(args, k) is not None}
    from producers.ring_queue import QueueLayout  # the layout's checks before any GPU work
    from schedules import plan as P
    d = P.WORKQUEUE
    try:
        QueueLayout(layout_kw.get("capacity", d.capacity), layout_kw.get("slots", d.slots),
                    layout_kw.get("producers", 1))  # default: by the build
    except (TypeError, ValueError) as e:
        raise WorkbenchError(f"work queue layout: {e}") from None
    extra = parse_layouts(args.layouts)
    variants = (*PATHS, *extra)
    cfg = QUICK if args.quick else FULL
    need_gpu(NAME)
    progress(f"{'QUICK' if args.quick else 'FULL'} H3 block 0: {cfg.tokens} rows; paths "
             f"{PATHS}; {args.rounds} rounds")
    runner, inputs, info = build_runner(cfg, (0,), args.seed)
    model = runner.model
    paths = Paths(model, layout_kw, extra)
    from models.h3 import initial_latent
    x0 = model.embed(initial_latent(cfg, args.seed).to(model.device), 0)

    rows = []
    for role in PROJECTIONS:  # per projection, the paths taking turns call by call
        inp = inputs[(0, role)]
        M, K = inp["x"].shape
        ms = {path: [] for path in variants}
        outs = {}
        for r in range(args.rounds + 2):
            for path in variants:
                res = None if inp["residual"] is None else inp["residual"].clone()
                t = timed(lambda: outs.__setitem__(path, paths.call(
                    path, role, {**inp, "residual": res})))
                if r >= 2:
                    ms[path].append(t)
        _, _, same = paths.whole(role, M)
        queue_ref = outs["unfused"] if same else paths.queue_reference(role, inp)
        refs = {"unfused": outs["unfused"], "ring": outs["unfused"],
                **{v: queue_ref for v in variants if v.startswith("workqueue")}}
        peaks = {}
        for path in PATHS:  # each path's cold call: what it allocates for the projection
            res = None if inp["residual"] is None else inp["residual"].clone()
            peaks[path] = cold_peak(paths, lambda: paths.call(path, role,
                                                              {**inp, "residual": res}))
        for path in variants:
            med = statistics.median(ms[path])
            row = {"projection": role, "path": path, "M": M, "K": K,
                   "N": outs[path].shape[1], "median_us": 1e3 * med,
                   "samples_us": [1e3 * t for t in ms[path]],
                   "reference": "unfused" if refs[path] is outs["unfused"] else
                   "the whole call on the queue's 256-token build",
                   "bit_identical": bool(torch.equal(outs[path].view(torch.int16),
                                                     refs[path].view(torch.int16))),
                   "activation_bytes": paths.ring_bytes(path, M, K),
                   "cold_peak_over_start_bytes": peaks.get(path)}
            rows.append(row)
            cold = "" if path not in peaks else f", cold peak +{peaks[path] / 1e6:.0f} MB"
            progress(f"{role} {path}: {row['median_us']:.1f} us, bits "
                     f"{'equal' if row['bit_identical'] else 'DIFFER'}{cold}")
        del outs, refs
        torch.cuda.empty_cache()

    blocks = {path: block_with(model, paths, path) for path in PATHS}
    ys, bms, peaks = {}, {path: [] for path in PATHS}, {}
    for r in range(args.rounds + 2):
        for path in PATHS:
            t = timed(lambda: ys.__setitem__(path, blocks[path].block(0, x0)))
            if r >= 2:
                bms[path].append(t)
    for path in PATHS:
        peaks[path] = cold_peak(paths, lambda: blocks[path].block(0, x0))
    want = ys["unfused"].view(torch.int16)
    # the queue's block equals the unfused block where its projections ran the same builds
    same_all = all(paths.whole(role, inputs[(0, role)]["x"].shape[0])[2]
                   for role in PROJECTIONS)
    for path in PATHS:
        equal = bool(torch.equal(ys[path].view(torch.int16), want))
        row = {"block": 0, "path": path, "median_us": 1e3 * statistics.median(bms[path]),
               "samples_us": [1e3 * t for t in bms[path]],
               "cold_peak_over_start_bytes": peaks[path],
               "bit_identical": equal if path != "workqueue" or same_all else None,
               "equal_to_unfused": equal}
        rows.append(row)
        progress(f"block {path}: {row['median_us']:.1f} us, peak +{peaks[path] / 1e6:.0f} MB, "
                 f"equal to the unfused block: {equal}")

    proj = {(r["projection"], r["path"]): r for r in rows if "projection" in r}
    blk = {r["path"]: r for r in rows if "block" in r}

    def over(path):
        return {role: proj[role, path]["median_us"] / proj[role, "unfused"]["median_us"]
                for role in PROJECTIONS}
    wq, rg = over("workqueue"), over("ring")
    saved = {role: proj[role, "unfused"]["cold_peak_over_start_bytes"]
             - proj[role, "workqueue"]["cold_peak_over_start_bytes"] for role in PROJECTIONS}
    K_max = max(r["K"] for r in rows if "K" in r)
    unfused_act = max(proj[role, "unfused"]["activation_bytes"] for role in PROJECTIONS)
    queue_ring = max(proj[role, "workqueue"]["activation_bytes"] for role in PROJECTIONS)
    headline = {
        "workqueue_time_over_unfused": max(wq.values()), "workqueue_by_projection": wq,
        "ring_time_over_unfused": max(rg.values()), "ring_by_projection": rg,
        "block_time_over_unfused": {p: blk[p]["median_us"] / blk["unfused"]["median_us"]
                                    for p in PATHS},
        "workqueue_layouts": {v: over(v) for v in extra},
        "ring_bytes": queue_ring, "peak_bytes_saved": min(saved.values()),
        "peak_bytes_saved_by_projection": saved,
        "activation_bytes_less_ring": unfused_act - queue_ring,
        "block_cold_peak_over_start_bytes": {p: blk[p]["cold_peak_over_start_bytes"]
                                             for p in PATHS},
        "K_max": K_max}
    bad = [r for r in rows if r["bit_identical"] is False]
    gates = {
        "bit_identical": R.gate(not bad, "every projection and block equal to the unfused "
                                "path's bits" if not bad else "; ".join(
                                    f"{r.get('projection', 'block')} {r['path']} differs"
                                    for r in bad)),
        "workqueue_not_slower": R.gate(max(wq.values()) <= 1.0, ", ".join(
            f"{k} {v:.3f}" for k, v in wq.items()) + " (queue / unfused time)"),
        "ring_memory_within_target": R.gate(queue_ring <= RING_TARGET_BYTES,
                                            f"{queue_ring / 1e6:.2f} MB (target 8.3)"),
        "peak_lower_by_the_activation": R.gate(
            min(saved.values()) >= unfused_act - queue_ring - 1e6,
            "cold projection peak saved: " + ", ".join(f"{k} {v / 1e6:.0f} MB"
                                                       for k, v in saved.items())
            + f" (need {(unfused_act - queue_ring) / 1e6:.0f} MB: the unfused path's "
            "activation tensors less the ring); cold block peak over start: "
            + ", ".join(f"{p} {blk[p]['cold_peak_over_start_bytes'] / 1e6:.0f} MB"
                        for p in PATHS)),
    }
    summary = R.make_summary(
        NAME, parameters={"config": "QUICK" if args.quick else "FULL", "rows": cfg.tokens,
                          "block": 0, "step": 0, "seed": args.seed, "rounds": args.rounds,
                          "workqueue": {**{k: getattr(d, k) for k in ("capacity", "slots",
                                                                       "producers", "loads")},
                                        **layout_kw},
                          "extra_layouts": extra},
        measurements=rows + [{"setup": info}], headline=headline, gates=gates,
        seeds={"model": args.seed},
        notes={"method": "paths alternating call by call in one process on one loaded block; "
                         "CUDA events around each call; medians after 2 warm-up rounds; "
                         "peaks from one cold call a path (plans and scratch released)"},
        quick="QUICK H3 block 0" if args.quick else None)
    path = R.write(summary, args.results_dir)
    print(R.format_table([[r.get("projection", "block"), r["path"], f"{r['median_us']:.1f}",
                           {True: "equal", False: "DIFFER", None: "n/a"}[r["bit_identical"]]]
                          for r in rows],
                         ["proj", "path", "us", "bits"]))
    print(f"wrote {path} (verdict {R.verdict_text(summary)})")
    return 0


def main(argv=None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
