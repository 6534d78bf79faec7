"""Where a skinny projection's time goes inside the loop's chain: five layers of (row norm, QKV,
wo + residual, row norm, gate/up SwiGLU, down + residual) captured in one CUDA graph with PDL as
in the fast loop (attention left out: wo reads a fixed input), every projection a traced build
(kernels/depth/gemm_skinny.py ``trace=``: thread 0 of each CTA stamps %globaltimer at TRACE_POINTS).
Prints per projection the medians over CTAs of each phase and the gap to the previous
projection, and writes the record ``skinny-trace-<rows>[-<tag>].json`` (workbench.results
.write_record: provenance included, into the run folder or $WB_RESULTS_DIR).

    python3 scripts/trace_skinny.py --rows 64 --tiles "{'qkv': {'warps': 8}}"
"""
import argparse
import ast

import torch

from kernels.depth.gemm_skinny import TRACE_POINTS, GemmSkinny, gemm_skinny, pack_weights, \
    tile_warps, trace_shape, warps_per_group
from kernels.depth.gemm_skinny_wgmma import (WGMMA_WARPS, GemmSkinnyWgmma, gemm_skinny_wgmma,
                                             pack_weights_wgmma)
from kernels.depth.rows_rmsnorm import rows_rmsnorm
from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from models.fast_loop import projection_shapes
from workbench.results import provenance_line, results_dir, write_record
from workbench.timing import bench

NAMES = ("qkv", "wo", "gate_up", "down")
LAYERS = 5


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def summarize(launches, stamps) -> list:
    """Per launch ((name, after_norm), stamps [CTAs, len(TRACE_POINTS)] in ns): the first entry
    and dependency release, the median release, the gap from the previous launch's last exit
    to this one's first release, each phase's median over CTAs (keyed by the point that ends
    it) and the critical path (first release to last exit), all in µs since the first entry;
    how long a CTA was resident before its release (median: the time its weight loads had
    under the predecessor) and how many CTAs entered only after the first release (they
    could not start their weights early)."""
    for s in stamps:
        if (s < 0).any():
            raise ValueError("a CTA left a trace stamp unwritten")
    t0 = min(int(s[:, 0].min()) for s in stamps)
    out, prev_exit = [], None
    for (name, norm), s in zip(launches, stamps):
        s = (s - t0).double() / 1e3
        med = {TRACE_POINTS[i]: _median((s[:, i] - s[:, i - 1]).tolist())
               for i in range(2, len(TRACE_POINTS))}
        wait0, last_exit = float(s[:, 1].min()), float(s[:, -1].max())
        early = _median((s[:, 1] - s[:, 0]).tolist())
        late = int((s[:, 0] > wait0).sum())
        out.append({"proj": name, "after_norm": norm, "ctas": s.shape[0],
                    "resident_before_release_median_us": early, "entered_after_release": late,
                    "entry_first_us": float(s[:, 0].min()), "wait_first_us": wait0,
                    "wait_median_us": _median(s[:, 1].tolist()),
                    "gap_after_previous_exit_us": None if prev_exit is None else
                    wait0 - prev_exit, "phase_median_us": med,
                    "critical_us": last_exit - wait0, "exit_last_us": last_exit})
        prev_exit = last_exit
    return out


def _build(M: int, tiles: dict, wgmma: bool = False):
    """The chain's buffers, packed weights and traced launches (name, callable, trace).
    ``wgmma``: the projections by kernels/depth/gemm_skinny_wgmma.py (timing only: the chain's
    producers write row-major, which that kernel reads as chunk-major, so the values mean
    nothing)."""
    dev, bf = "cuda", torch.bfloat16
    shapes = dict(zip(NAMES, projection_shapes(CFG)))
    x = torch.randn(M, CFG.hidden, device=dev).to(bf)
    xn = torch.empty_like(x)
    attn = torch.randn(M, shapes["wo"][1], device=dev).to(bf)
    qkv = torch.empty(M, shapes["qkv"][0], device=dev, dtype=bf)
    mlp = torch.empty(M, shapes["gate_up"][0], device=dev, dtype=bf)
    gamma = (1 + 0.1 * torch.randn(CFG.hidden, device=dev)).to(bf)
    launches = []
    for _ in range(LAYERS):
        for name in NAMES:
            n, k, swiglu = shapes[name]
            rows = 2 * n if swiglu else n
            a, out, resid, norm = {"qkv": (x, qkv, None, True), "wo": (attn, x, x, False),
                                   "gate_up": (x, mlp, None, True),
                                   "down": (mlp, x, x, False)}[name]
            w = (0.03 * torch.randn(rows, k, device=dev)).to(bf)
            kw = dict(tiles.get(name, {}))
            if wgmma:
                kw["warps"] = kw.get("warps") or WGMMA_WARPS  # the wgmma mainloop's tile
                w = pack_weights_wgmma(w, swiglu, kw["warps"])
                cfg = GemmSkinnyWgmma(M, k, swiglu=swiglu, pdl=True, **kw)
                tr = torch.full(trace_shape(cfg, n), -1, dtype=torch.int64, device=dev)
                launches.append((name, norm, a, w, out, resid, swiglu, kw, tr))
                continue
            w = pack_weights(w, swiglu)
            cfg = GemmSkinny(M, k, swiglu=swiglu, pdl=True, splits=kw.get("splits"),
                             warps=kw.get("warps") or tile_warps(rows, k, M),
                             m_split=kw.get("m_split") or warps_per_group(rows, k, M))
            tr = torch.full(trace_shape(cfg, n), -1, dtype=torch.int64, device=dev)
            launches.append((name, norm, a, w, out, resid, swiglu, kw, tr))

    project = gemm_skinny_wgmma if wgmma else gemm_skinny

    def run():
        for name, norm, a, w, out, resid, swiglu, kw, tr in launches:
            src = rows_rmsnorm(a, gamma, xn, pdl=True) if norm else a
            project(src, w, out, resid=resid, swiglu=swiglu, pdl=True, trace=tr, **kw)
    return launches, run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tiles", default="{}", help="per projection gemm_skinny kwargs (a dict)")
    ap.add_argument("--tag", default="", help="suffix of the JSON file's name")
    ap.add_argument("--wgmma", action="store_true",
                    help="the projections by kernels/depth/gemm_skinny_wgmma.py (timing only)")
    args = ap.parse_args()
    tiles = ast.literal_eval(args.tiles)
    name = f"skinny-trace-{args.rows}{'-' + args.tag if args.tag else ''}"
    if (results_dir() / f"{name}.json").exists():
        raise SystemExit(f"{results_dir() / name}.json exists: pass another --tag")
    print(provenance_line(), flush=True)
    launches, run = _build(args.rows, tiles, args.wgmma)
    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    chain_us = bench(graph.replay, warmup_ms=50, rep_ms=300).median_us
    graph.replay()  # the stamps of one clean replay
    torch.cuda.synchronize()
    stamps = [tr.cpu() for *_, tr in launches]
    rows_out = summarize([(name, norm) for name, norm, *_ in launches], stamps)
    print(f"{args.rows} rows, tiles {tiles}: chain of {len(launches)} projections "
          f"{chain_us:.1f} µs ({chain_us / LAYERS:.1f} a layer, norms included)")
    print("proj     ctas  late  early  entry0  wait0  wait_med  gap  " +
          " ".join(f"{b[:9]:>9}" for b in TRACE_POINTS[2:]) + "  crit")
    for r in rows_out:
        gap = r["gap_after_previous_exit_us"]
        print(f"{r['proj']:8} {r['ctas']:4} {r['entered_after_release']:5} "
              f"{r['resident_before_release_median_us']:6.2f} "
              f"{r['entry_first_us']:7.2f} {r['wait_first_us']:6.2f} "
              f"{r['wait_median_us']:8.2f} {'' if gap is None else f'{gap:4.2f}':>4}  "
              + " ".join(f"{r['phase_median_us'][b]:9.2f}" for b in TRACE_POINTS[2:])
              + f"  {r['critical_us']:5.2f}")
    path = write_record(name, {"rows": args.rows, "tiles": tiles, "wgmma": args.wgmma,
                               "chain_us": chain_us, "trace_points": TRACE_POINTS,
                               "launches": rows_out})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
