"""P0 baseline: the block-scaled NVFP4 GEMM against cuBLAS, quack's W4A16 and Comfy Kitchen.

Per projection (N x K: qkv 21504x5376, out 5376x5376, fc1 14336x5376, fc2 5376x14336, and a
7168x5376 projection, "wide") and
M in (128, 2048, 37810), timed side by side in one process (CUDA-graph replay, medians, operand
sets rotated beyond L2 where a set is smaller than 3x L2):
* ``p0``: gemm_nvfp4 on prepacked A (with its exact f16 expansion, ``a16``) and B with the
  weight's register-order prepack, so the default config is the production one
  (schedules/plan.py, the f16 branch: swap-AB fed the f16 tile by TMA at small M, the
  three-warpgroup 256-token build beyond);
* ``ours_e2e``: an NVFP4 linear from bf16 activations: amax kernel, g, the quantize kernel
  writing the packed activation and its f16 expansion, the GEMM; timed under CUDA graphs and
  eagerly (``ours_e2e_eager``: host time per call included);
* ``comfy_e2e``: what a Hopper user of Comfy Kitchen 0.2.40 gets: torch amax, quantize_nvfp4
  (pad_16x), dequantize_nvfp4 of activation and weight, bf16 F.linear; graphs and eager;
* ``cublas_bf16``: F.linear on the dequantized bf16 operands;
* ``cublas_fp8``: torch._scaled_mm on e4m3 operands with per-tensor scales (context only);
* ``quack_w4a16``: quack-kernels 0.6.5's ``gemm_w4a16`` (Tri Dao's SM90 weight-only GEMM:
  e2m1 codes decoded to bf16 in registers, bf16 wgmma) on the same NVFP4 weight values and the
  bf16 activation, an anchor from outside this project on the same hardware, same run. Its
  weights: our quantized weight (hi-first nibbles, 128x4-swizzled e4m3 scales, g) reordered by
  :func:`quack_nvfp4_weight` into quack's input format (lo-first nibbles, row-major scales),
  then quack's own ``prepare_w4_weight(..., wformat="nvfp4")`` repack; g rides its epilogue
  ``tensor_scale``. Checked in the same run on P0's 32 sampled rows against the exact (float64)
  product of the bf16 activation and the dequantized weight: max |error| / max |reference|
  below 1e-2 (fp32 accumulation and the bf16 output differ by ~2^-9; other weights, O(1)).
  quack not importable: the column is not run and the run says why (notes.not_run).

Bytes and FLOPs per case: FLOPs = 2MNK. P0 reads A and B packed (K/2 + K/16 bytes per row) and
writes 2MN; cuBLAS bf16 reads 2K bytes per row. Floor = max(FLOPs / 790 TFLOP/s (the measured
dense f16/bf16 wgmma rate), bytes / 4.24 TB/s). At M = 128 the bound is bytes (weights), at
M = 2048 and 37810 FLOPs.

Headline per M, each the worst shape's speed ratio "p0 over X" = X's time / ours (>= 1: ours
at least as fast): ``p0_over_cublas_bf16``, ``p0_over_quack_w4a16`` (the GEMMs on the same
NVFP4 weights, P0 reading the NVFP4 activation, quack the bf16 one; ``ours_e2e_over_quack_w4a16``
per case puts our whole linear from bf16 beside it), ``e2e_speedup_vs_comfy`` (eager) and
``e2e_speedup_vs_comfy_graph``.

Correctness in the same run: P0 on 32 sampled rows of every case within the oracle's fp32 bound.
Needs CuTe DSL; comfy_kitchen for the Comfy columns (GPU host: unpack .gpu, then the comfy
archive) and quack-kernels for quack's (the quack extra; GPU host: its wheels in .whl/, which
needs triton, part of the CUDA torch build). A column whose package is missing is not run: the
verdict is then incomplete, never pass.
"""
from __future__ import annotations

import torch

from experiments._common import need_gpu, parser, progress, run_main
from kernels.nvfp4.amax import amax
from kernels.nvfp4.gemm import default_config, gemm_nvfp4
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import quantize_expand_nvfp4, quantize_nvfp4
from numerics import gemm_oracle as G
from numerics import nvfp4
from workbench import WorkbenchError
from workbench import results as R
from workbench.plots import p0_ratio_png
from workbench.timing import COPY_CEILING_BPS, bench, rotation_count

PROJECTIONS = {"qkv": (21504, 5376), "out": (5376, 5376), "fc1": (14336, 5376),
               "fc2": (5376, 14336), "wide": (7168, 5376)}
M_VALUES = (128, 2048, 37810)
WGMMA_PEAK = 790e12
TARGETS = {"p0_over_cublas_bf16": {128: 1.15, 2048: 0.90, 37810: 0.90},
           "p0_over_quack_w4a16": {128: 1.0, 2048: 1.0, 37810: 1.0},
           "e2e_speedup_vs_comfy": {128: 3.0, 2048: 1.3, 37810: 1.05},  # eager, as a user calls
           "e2e_speedup_vs_comfy_graph": {128: 3.0, 2048: 1.3, 37810: 1.05}}  # issue #34
HEADLINE_KEYS = ("p0_over_cublas_bf16", "p0_over_quack_w4a16", "e2e_speedup_vs_comfy",
                 "e2e_speedup_vs_comfy_graph")
QUACK_VERSION = "0.6.5"  # the pinned quack extra; another version runs, and the summary says so
QUACK_MAX_REL_ERR = 1e-2
NOTES = {
    "prediction": "session 17, written before this version's first run (dedfb51's A/B, "
                  "results/logs/dedfb51-p0-v2-ab.json, set the p0 column): 0.44-0.67 of cuBLAS "
                  "bf16 at M = 128 (swap-AB; out and 7168x5376 the worst), 0.56-0.68 at 2048 and "
                  "~0.7 at 37810 (the P0 design). End to end under graphs 1.9-3.0x Comfy at 128, "
                  "1.0-1.2x at 2048, 0.8-1.1x at 37810. Eagerly our three launches now cost "
                  "~11-24 µs of host time each (TVM-FFI) against 52-134 µs of GPU work at "
                  "M = 128, so eager e2e should sit near the graph figure (1.8-2.9x, up from "
                  "0.94-1.05x at 1515c0c); at M >= 2048 GPU time dominates both columns.",
    "outcome": "session 17 (5ea022f, H200): 0.47-0.76 of cuBLAS bf16 at M = 128 (swap-AB), "
               "0.63-0.75 at 2048, 0.72-0.75 at 37810; e2e vs Comfy under graphs 2.09-3.42x / "
               "0.97-1.20x / 0.81-1.03x, eager 1.61-2.91x / 0.96-2.21x / 0.81-1.01x. The "
               "prediction held for the graph columns; eager at M = 128 came out below it, host "
               "bound and noisy (notes/p0-gemm.md v7). v1 (c997143): 0.67-0.80 at 2048, "
               "0.33-0.73 at 128.",
}


def _comfy():
    try:  # here, not at the top: comfy_kitchen is optional (the oracle extra, GPU host only)
        import comfy_kitchen as ck
    except Exception as e:
        return None, f"comfy_kitchen not importable: {e}"
    return ck, None


def _quack():
    """quack.gemm_w4 (gemm_w4a16, prepare_w4_weight) and its version, or None and why not.
    Importing quack patches CuTe DSL process-wide (``:``/``...`` tensor indexing, tensor
    ``to``/``clone``/``contiguous``, ``if const_expr(a) and b`` rewrites); all additive, none
    a spelling our kernels use: P0's PTX and SASS (p0 and swap-AB) came out identical with and
    without quack imported (sm_90a, compiled without a GPU)."""
    try:  # here, not at the top: quack-kernels is optional (the quack extra, GPU host: .whl/)
        import quack
        from quack import gemm_w4
    except Exception as e:  # ImportError, or triton missing under it, or a cutlass mismatch
        return None, None, f"quack-kernels not importable: {type(e).__name__}: {e}"
    return gemm_w4, getattr(quack, "__version__", "unknown"), None


def anchors():
    """(comfy_kitchen or None, why not, quack.gemm_w4 or None, its version, why not): the
    outside anchors this process can time, each one missing said as a progress line."""
    ck, comfy_why = _comfy()
    if ck is None:
        progress(comfy_why + " (comfy_e2e not measured)")
    qk, quack_version, quack_why = _quack()
    if qk is None:
        progress(quack_why + " (quack_w4a16 not measured)")
    elif quack_version != QUACK_VERSION:
        progress(f"quack-kernels {quack_version}, not the pinned {QUACK_VERSION}")
    return ck, comfy_why, qk, quack_version, quack_why


def quack_nvfp4_weight(bq: torch.Tensor, bs: torch.Tensor, N: int, K: int):
    """Our NVFP4 weight as quack's nvfp4 format takes it before its repack: (N, K/2) uint8 codes
    with element 2i in the LOW nibble (ours: high) and (N, K/16) e4m3 scales row-major (ours:
    the cuBLAS 128x4 swizzle). The same codes and scales, reordered; g stays apart (quack's
    ``tensor_scale``). quack ships no converter from this layout, hence this one."""
    rows, cols = bq.shape[0], bq.shape[1] * 2 // nvfp4.BLOCK  # the buffers' 16-padded extents
    sf = nvfp4.from_blocked(bs.view(torch.uint8), rows, cols)[:N, :K // nvfp4.BLOCK]
    q = nvfp4.swap_nibbles(bq[:N, :K // 2])
    return q.contiguous(), sf.contiguous().view(torch.float8_e4m3fn)


def _quack_case(qk, xs, weights, out, row_ids, N, K, quick):
    """quack's gemm_w4a16 on the case's operand sets (the bf16 activations, the weights via
    :func:`quack_nvfp4_weight` and quack's repack): (its timing, max |error| / max |reference|
    on the sampled rows of set 0 against the exact product in float64)."""
    sets = []
    for (x, *_), (bq, bs, gb, _pre) in zip(xs, weights):
        blob, sf = qk.prepare_w4_weight(*quack_nvfp4_weight(bq, bs, N, K), wformat="nvfp4")
        sets.append((x, blob, sf, float(gb)))  # g read on the host once, not in the timed call

    def run(x, blob, sf, g):
        return qk.gemm_w4a16(x, blob, sf, tensor_scale=g, out=out, wformat="nvfp4")

    x, _, _, g = sets[0]
    run(*sets[0])
    w = nvfp4.dequantize_operand(weights[0][0], weights[0][1], (N, K)).double()  # e2m1 * s
    ref = (x[row_ids].double() @ w.T) * g
    err = float((out[row_ids].double() - ref).abs().max() / ref.abs().max())
    del w, ref
    return _time(run, sets, quick), err


def _global_scale_from_amax(amax_value: torch.Tensor) -> torch.Tensor:
    """numerics.nvfp4's g (Comfy's rule) as the one-element fp32 tensor the kernels read."""
    return nvfp4.global_scale_from_amax(amax_value).reshape(1)


def ours_linear(out, M: int):
    """Our NVFP4 linear from bf16 (x, weight codes, scales, g_w, prepack) into ``out``: the amax
    kernel (g on the device), the quantize kernel with the f16 expansion, the GEMM."""
    def run(x, b, bs_, gb_, pre):
        g = _global_scale_from_amax(amax(x))
        q, s, f = quantize_expand_nvfp4(x, g, pad_16x=True)
        return gemm_nvfp4(q[:M], s, g, b, bs_, gb_, out=out, prepacked=pre, a16=f)
    return run


def comfy_linear(ck, M: int):
    """What a Hopper user of Comfy Kitchen gets from the same arguments as :func:`ours_linear`:
    torch amax, quantize_nvfp4 (pad_16x), both operands dequantized, bf16 F.linear."""
    def run(x, b, bs_, gb_, pre):
        g = _global_scale_from_amax(torch.amax(x.abs())).reshape(())
        q, s = ck.quantize_nvfp4(x, g, pad_16x=True)
        xd = ck.dequantize_nvfp4(q, g, s, torch.bfloat16)[:M]
        wd = ck.dequantize_nvfp4(b, gb_.reshape(()), bs_, torch.bfloat16)
        return torch.nn.functional.linear(xd, wd)
    return run


def _time(fn, arg_sets, quick, graph: bool = True):
    kw = dict(graph=graph, warmup_ms=10 if quick else 25, rep_ms=60 if quick else 200)
    try:
        return bench(fn, arg_sets, **kw).as_dict()
    except Exception as e:  # not capturable: time eagerly (host overhead included) and say so
        torch.cuda.synchronize()
        d = bench(fn, arg_sets, **{**kw, "graph": False}).as_dict()
        d["note"] = f"eager timing (graph capture failed: {type(e).__name__})"
        return d


def _case(name, N, K, M, ck, qk, quick, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    w_bytes_packed = N * K // 2 + N * K // 16
    sets = rotation_count(w_bytes_packed + M * (K // 2 + K // 16), factor=2.0, cap=8)
    xs, weights = [], []
    for _ in range(sets):
        x = torch.randn(M, K, generator=gen, device=dev).to(torch.bfloat16)
        w = (torch.randn(N, K, generator=gen, device=dev) * 0.02).to(torch.bfloat16)
        ga = _global_scale_from_amax(torch.amax(x.abs()))
        gb = _global_scale_from_amax(torch.amax(w.abs()))
        aq, as_, a16 = quantize_expand_nvfp4(x, ga, pad_16x=True)  # + the f16 expansion
        bq, bs = quantize_nvfp4(w, gb, pad_16x=True)
        xs.append((x, aq[:M], as_, ga, a16))
        weights.append((bq, bs, gb, prepack(bq, bs)))
    out = torch.empty(M, N, dtype=torch.bfloat16, device=dev)

    # correctness of P0 on sampled rows (oracle on the GPU)
    x, aq, as_, ga, a16 = xs[0]
    bq, bs, gb, pre = weights[0]
    gemm_nvfp4(aq, as_, ga, bq, bs, gb, out=out, prepacked=pre, a16=a16)
    rows = torch.randperm(M, generator=torch.Generator().manual_seed(seed))[:32].sort().values
    d, real, bound = G.reference_gemm(aq, as_, bq, bs, float(ga), float(gb), M, N, K,
                                      row_ids=rows.cuda())
    got = out[rows.cuda()].double()
    within = bool(((got - real).abs() <= bound).all())
    exact_frac = float((got == d.double()).float().mean())

    p0_sets = [(xs[i][1], xs[i][2], xs[i][3], xs[i][4], *weights[i]) for i in range(sets)]
    row = {"projection": name, "M": M, "N": N, "K": K, "operand_sets": sets,
           "config": default_config(M, N, K).describe(),
           "p0_within_fp32_bound_on_32_rows": within, "p0_exact_fraction": exact_frac}
    flops = 2 * M * N * K
    bytes_p0 = 2 * M * K + N * (K // 2 + K // 16) + 2 * M * N  # A as its f16 expansion
    bytes_bf16 = 2 * (M * K + N * K + M * N)
    row["flops"], row["bytes_p0"], row["bytes_cublas_bf16"] = flops, bytes_p0, bytes_bf16
    row["floor_us_p0"] = max(flops / WGMMA_PEAK, bytes_p0 / COPY_CEILING_BPS) * 1e6
    row["floor_us_bf16"] = max(flops / WGMMA_PEAK, bytes_bf16 / COPY_CEILING_BPS) * 1e6
    row["bound"] = "bytes" if bytes_p0 / COPY_CEILING_BPS > flops / WGMMA_PEAK else "flops"

    t = {}
    t["p0"] = _time(lambda a, s, g, a16, b, bs_, gb_, pre: gemm_nvfp4(
        a, s, g, b, bs_, gb_, out=out, prepacked=pre, a16=a16), p0_sets, quick)
    if qk is not None:  # beside p0, on the same weight values
        try:
            t["quack_w4a16"], row["quack_w4a16_max_rel_err"] = _quack_case(
                qk, xs, weights, out, rows.cuda(), N, K, quick)
        except Exception as e:  # e.g. its compile failing for a shape: this column, not the run
            row["quack_w4a16_not_run"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
        row["bytes_quack_w4a16"] = N * (K // 2 + K // 16) + 2 * M * K + 2 * M * N

    ours_e2e = ours_linear(out, M)
    e2e_sets = [(xs[i][0], *weights[i]) for i in range(sets)]
    t["ours_e2e"] = _time(ours_e2e, e2e_sets, quick)
    t["ours_e2e_eager"] = _time(ours_e2e, e2e_sets, quick, graph=False)

    deq = []
    for i in range(sets):  # dequantized operands for cuBLAS (exact values of the NVFP4 codes)
        xa = nvfp4.dequantize(xs[i][1], xs[i][2], xs[i][3], (M, K))
        wb = nvfp4.dequantize(weights[i][0], weights[i][1], weights[i][2], (N, K))
        deq.append((xa, wb))
    t["cublas_bf16"] = _time(lambda a, b: torch.nn.functional.linear(a, b), deq, quick)
    fp8 = []
    for xa, wb in deq:
        sa = (xa.abs().amax().float() / 448).reshape(())
        sb = (wb.abs().amax().float() / 448).reshape(())
        fp8.append(((xa.float() / sa).to(torch.float8_e4m3fn), (wb.float() / sb).to(
            torch.float8_e4m3fn).t(), sa, sb))
    try:
        t["cublas_fp8"] = _time(lambda a, b, sa, sb: torch._scaled_mm(
            a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), fp8, quick)
    except RuntimeError as e:  # e.g. M not a multiple of 16
        row["cublas_fp8_error"] = str(e).splitlines()[0]
    del fp8
    if ck is not None:
        comfy_e2e = comfy_linear(ck, M)
        t["comfy_e2e"] = _time(comfy_e2e, e2e_sets, quick)
        t["comfy_e2e_eager"] = _time(comfy_e2e, e2e_sets, quick, graph=False)
    for k, v in t.items():
        v["tflops"] = flops / v["median_us"] / 1e6
    row["timings"] = t
    row.update(speed_ratios(t))
    row["p0_fraction_of_floor"] = row["floor_us_p0"] / t["p0"]["median_us"]
    return row


def speed_ratios(t: dict) -> dict:
    """A case's ratios from its timings, each "ours over X" = X's median time / ours (>= 1: ours
    at least as fast); a column not timed gives none."""
    us = {k: v["median_us"] for k, v in t.items()}
    r = {"p0_over_cublas_bf16": us["cublas_bf16"] / us["p0"]}
    if "quack_w4a16" in us:
        r["p0_over_quack_w4a16"] = us["quack_w4a16"] / us["p0"]
        # both take the bf16 activation: our whole linear (amax, quantize, GEMM) against quack's
        r["ours_e2e_over_quack_w4a16"] = us["quack_w4a16"] / us["ours_e2e"]
    if "comfy_e2e" in us:
        r["e2e_speedup_vs_comfy"] = us["comfy_e2e_eager"] / us["ours_e2e_eager"]
        r["e2e_speedup_vs_comfy_graph"] = us["comfy_e2e"] / us["ours_e2e"]
    return r


def headline_and_gates(rows: list, ms) -> tuple[dict, dict]:
    """Per HEADLINE_KEYS figure and M, the worst shape's ratio (a key no case measured at that M
    is left out, so a column not run has no gate), a gate per target; P0's correctness gate,
    and quack's same-weights gate where quack ran."""
    headline, gates = {}, {}
    for key in HEADLINE_KEYS:
        per_m = {}
        for M in ms:
            vals = [r[key] for r in rows if r["M"] == M and key in r]
            if vals:
                worst = min(vals)
                per_m[str(M)] = worst
                target = TARGETS[key].get(M)
                if target is not None:
                    gates[f"{key}_M{M}"] = R.gate(worst >= target,
                                                  f"worst shape {worst:.2f} vs target {target}")
        headline[key] = per_m
    gates["p0_within_fp32_bound"] = R.gate(all(r["p0_within_fp32_bound_on_32_rows"] for r in rows),
                                           "32 sampled rows per case vs the exact oracle")
    errs = [r["quack_w4a16_max_rel_err"] for r in rows if "quack_w4a16_max_rel_err" in r]
    if errs:
        gates["quack_w4a16_same_weights"] = R.gate(
            max(errs) < QUACK_MAX_REL_ERR, f"max |error| / max |reference| {max(errs):.2e} on 32 "
            f"rows per case vs < {QUACK_MAX_REL_ERR:g} ({len(errs)} of {len(rows)} cases)")
    return headline, gates


def not_run_parts(rows: list, comfy_why: str | None, quack_why: str | None) -> list[str]:
    """The columns that did not run, each with its reason (the summary's notes.not_run: the
    verdict is then incomplete at best)."""
    parts = [f"{col}: {why}" for col, why in (("comfy_e2e", comfy_why),
                                                ("quack_w4a16", quack_why)) if why]
    parts += [f"quack_w4a16 {r['projection']} M={r['M']}: {r['quack_w4a16_not_run']}"
              for r in rows if "quack_w4a16_not_run" in r]
    return parts


def config_label(desc: dict) -> str:
    """A build's short name from its ``describe()``: the design and its token rows a CTA (the
    256-token build is the swap-AB design too), then stream-K or the K split."""
    label = f"{desc['design']} {desc['tile'][0]}t"
    if desc.get("stream_k"):
        return label + " sk"
    return label + (f" s{desc['splits']}" if desc.get("splits", 1) > 1 else "")


def _main(argv) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--m", type=int, nargs="*", default=list(M_VALUES))
    p.add_argument("--projections", nargs="*", default=list(PROJECTIONS))
    args = p.parse_args(argv)
    need_gpu("p0-baseline")
    ck, comfy_why, qk, quack_version, quack_why = anchors()
    rows = []
    for M in args.m:
        for name in args.projections:
            N, K = PROJECTIONS[name]
            progress(f"{name} M={M} (N={N}, K={K})")
            rows.append(_case(name, N, K, M, ck, qk, args.quick, seed=args.seed + M + N + K))
            r = rows[-1]
            progress(f"  p0 ({config_label(r['config'])}) {r['timings']['p0']['median_us']:.1f} us, "
                     f"cuBLAS bf16 {r['timings']['cublas_bf16']['median_us']:.1f} us, ratio "
                     f"{r['p0_over_cublas_bf16']:.2f}; quack W4A16 "
                     f"{r['timings'].get('quack_w4a16', {}).get('median_us', float('nan')):.1f}"
                     f" us, ratio {r.get('p0_over_quack_w4a16', float('nan')):.2f}; e2e vs comfy "
                     f"eager {r.get('e2e_speedup_vs_comfy', float('nan')):.2f}, graph "
                     f"{r.get('e2e_speedup_vs_comfy_graph', float('nan')):.2f}")
            if "quack_w4a16_not_run" in r:
                progress(f"  quack_w4a16 not run: {r['quack_w4a16_not_run']}")
            torch.cuda.empty_cache()
    headline, gates = headline_and_gates(rows, args.m)
    summary = R.make_summary(
        "p0-baseline",
        parameters={"projections": {k: PROJECTIONS[k] for k in args.projections}, "M": args.m,
                    "quick": args.quick, "wgmma_peak_flops": WGMMA_PEAK,
                    "copy_ceiling_bps": COPY_CEILING_BPS, "targets": TARGETS,
                    "quack_kernels": quack_version or "not importable"},
        measurements=rows, headline=headline, gates=gates, seeds={"operands": args.seed},
        notes=NOTES, not_run=not_run_parts(rows, comfy_why, quack_why))
    path = R.write(summary, args.results_dir)
    try:  # the ratio per shape and M as a picture beside the summary (the plots extra)
        progress(f"wrote {p0_ratio_png(summary, path.with_suffix('.png'))}")
    except WorkbenchError as e:
        progress(f"no plot: {e}")
    nan = float("nan")
    table = [[r["projection"], r["M"], config_label(r["config"]),
              f"{r['timings']['p0']['median_us']:.1f}",
              f"{r['timings']['cublas_bf16']['median_us']:.1f}", f"{r['p0_over_cublas_bf16']:.2f}",
              f"{r['timings'].get('quack_w4a16', {}).get('median_us', nan):.1f}",
              f"{r.get('p0_over_quack_w4a16', nan):.2f}",
              f"{r['timings']['ours_e2e_eager']['median_us']:.1f}",
              f"{r['timings'].get('comfy_e2e_eager', {}).get('median_us', nan):.1f}",
              f"{r.get('e2e_speedup_vs_comfy', nan):.2f}",
              f"{r.get('e2e_speedup_vs_comfy_graph', nan):.2f}",
              f"{r['p0_fraction_of_floor']:.2f}"] for r in rows]
    print(R.format_table(table, ["proj", "M", "design", "p0 us", "bf16 us", "p0/bf16",
                                 "quack us", "p0/quack",
                                 "e2e eager us", "comfy eager us", "e2e x eager",
                                 "e2e x graph", "floor frac"]))
    print(f"wrote {path} (verdict {summary['verdict']})")
    return 0


def main(argv=None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
