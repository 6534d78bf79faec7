"""P1's first H200 measurement (notes/p1.md; the prediction was written before it): the
activation quantized inside the GEMM (kernels.nvfp4.gemm_shell.P1Study, C = G = 1) against P0
on the quantize kernel's output, in one run.

    python3 scripts/p1_ab.py [--seconds 150] [--out DIR]

Per projection (qkv, out, fc1; N x K as in experiments/p0_baseline.py) and M in (128, 2048),
the same bf16 activation x and the same weight:
* ``p0_gemm``: gemm_nvfp4 on quantize_expand_nvfp4(x, g)'s f16 expansion (the production
  swap-AB f16 build at the split P1 uses, so the bits must be equal; the packed swap-AB build
  this row timed before session 27 has the same bits and left the code: notes/p0-gemm.md);
* ``p0_e2e``: quantize_expand_nvfp4 + that GEMM (g given: the amax is the same launch on both
  paths);
* ``p1``: gemm_nvfp4_p1(x, g): the GEMM that quantizes inside;
* with ``--ablate``: ``p1_no_quantizer`` (the stage waits and publishes but never writes its
  f16 tiles) and ``p1_no_mma`` (the consumers skip their wgmmas), both wrong by design
  (P1Study(variant=P0Variant(...))): which half bounds P1 (notes/p1.md, session 22);
* with ``--cluster 2 4 8``: ``p1_c2``, ``p1_c4``, ``p1_c8``, P1 on C CTAs along N, each
  k-block quantized by one of them and sent to the others by bulk DSMEM copies, the bf16
  tile loaded by that one only (P1Study.of_cluster(C); notes/p1.md, session 26); each one's
  bits against P0's in three runs; with ``--ablate`` too, ``p1_cC_local`` (nothing sent: wrong
  results, timing only) and ``p1_b3`` (one CTA, three buffers).
* with ``--groups 2``: ``p1_g2``, P1 with N-group reuse G = 2 (64-token tiles, each quantized
  tile multiplied into two 128-row weight tiles; notes/p1.md), its bits against P0's. Its
  ns/kblock counts the 128 x 128 k-blocks of work, as the other columns.
Rows report µs (CUDA-graph replay, operand sets rotated past L2), ns per k-block a CTA runs in
sequence, p1 over p0_gemm and over p0_e2e, and whether P1's output equals P0's bits (into a
NaN-poisoned buffer) and reruns identically. Jobs run in order until --seconds is spent; those
left out are listed. Writes ``p1-ab.json`` under --out or $WB_RESULTS_DIR (never overwriting).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from configs.arch import K_BLOCK
from device.runtime import cluster_ctas, sm_count
from device.waits import synchronize
from kernels.nvfp4.amax import amax
from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, P0Variant, P1Study
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import quantize_expand_nvfp4
from numerics import nvfp4
from workbench.timing import bench, rotation_count

PROJECTIONS = {"qkv": (21504, 5376), "out": (5376, 5376), "fc1": (14336, 5376)}
JOBS = tuple((name, M) for M in (128, 2048) for name in ("qkv", "fc1", "out"))


def splits_for(M: int, N: int, K: int, sms: int) -> int:
    """The K split gemm_nvfp4's chooser gives the swap-AB build (schedules/plan.py), P1's."""
    from kernels.nvfp4.gemm import k_splits
    return k_splits(M, N, K, sms)


def operands(M, N, K, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(N, K, generator=gen, device="cuda").to(torch.bfloat16)
    g_w = float(nvfp4.global_scale_from_amax(w.abs().max()))
    w_q, w_s = nvfp4.quantize(w, g_w)
    g_x = nvfp4.global_scale_from_amax(amax(x)).reshape(1)
    return x, g_x, w_q, w_s, prepack(w_q, w_s), torch.tensor([g_w], device="cuda")


def run_job(name, M, args, rows):
    N, K = PROJECTIONS[name]
    sms = sm_count()
    splits = splits_for(M, N, K, sms)
    p0_cfg = BlockscaledGemmSm90.swap_ab_f16(splits=splits)
    p1_cfg = P1Study(splits=splits).build()
    per_set = M * K * 2 + N * (K // 2 + K // 16)
    sets = [operands(M, N, K, 1000 * i + M + N) for i in range(rotation_count(per_set, factor=2.0, cap=4))]
    packed = [quantize_expand_nvfp4(x, g, pad_16x=True) for x, g, *_ in sets]
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")

    def p0_gemm(x, g, w_q, w_s, pre, g_w, q, s, f):
        return gemm_nvfp4(q, s, g, w_q, w_s, g_w, prepacked=pre, rows=(0, M), config=p0_cfg,
                          a16=f, out=out)

    def p0_e2e(x, g, w_q, w_s, pre, g_w, q, s, f):
        quantize_expand_nvfp4(x, g, pad_16x=True, out=(q, s, f))
        return p0_gemm(x, g, w_q, w_s, pre, g_w, q, s, f)

    def p1(x, g, w_q, w_s, pre, g_w, q, s, f):
        return gemm_nvfp4_p1(x, g, pre, g_w, out=out, config=p1_cfg)

    arg_sets = [(*o, q, s, f) for o, (q, s, f) in zip(sets, packed)]
    row = {"projection": name, "M": M, "N": N, "K": K, "splits": splits,
           "p1_config": p1_cfg.describe()}
    want = p0_gemm(*arg_sets[0]).clone()
    got = torch.full_like(out, float("nan"))
    gemm_nvfp4_p1(*[arg_sets[0][i] for i in (0, 1, 4, 5)], out=got, config=p1_cfg)
    again = gemm_nvfp4_p1(*[arg_sets[0][i] for i in (0, 1, 4, 5)], config=p1_cfg)
    synchronize()
    row["bits_equal_p0"] = bool(torch.equal(got.view(torch.int16), want.view(torch.int16)))
    row["rerun_identical"] = bool(torch.equal(again.view(torch.int16), got.view(torch.int16)))
    row["no_nan_left"] = not bool(got.isnan().any())
    tiles = -(-M // 128) * -(-N // 128) * splits
    kblocks = -(-tiles // min(tiles, sms)) * -(-(-(-K // K_BLOCK)) // splits)
    timed = [("p0_gemm", p0_gemm), ("p0_e2e", p0_e2e), ("p1", p1)]
    clusters = [(f"p1_c{c}", study_of(f"p1_c{c}")) for c in args.cluster
                if c > 1 and splits == 1 and -(-N // 128) % c == 0]
    for label, study in clusters:
        cluster_cfg = study.build()
        row[f"{label}_grid_ctas"] = cluster_ctas(cluster_cfg.cluster_n)  # all resident at once
        runs = []
        for _ in range(3):  # the DSMEM stores' race showed in 10-45 % of runs at C >= 4
            got_c = torch.full_like(out, float("nan"))
            gemm_nvfp4_p1(*[arg_sets[0][i] for i in (0, 1, 4, 5)], out=got_c,
                          config=cluster_cfg)
            runs.append(got_c)
        synchronize()
        row[f"{label}_bits_equal_p0"] = all(torch.equal(r.view(torch.int16),
                                                        want.view(torch.int16)) for r in runs)

        def p1_cluster(x, g, w_q, w_s, pre, g_w, q, s, f, cfg=cluster_cfg):
            return gemm_nvfp4_p1(x, g, pre, g_w, out=out, config=cfg)
        timed.append((label, p1_cluster))
    if args.groups == 2:  # N-group reuse: each quantized 64-row tile into two weight tiles
        g2_cfg = P1Study(groups=2, tokens=64, splits=splits).build()
        g2 = torch.full_like(out, float("nan"))
        gemm_nvfp4_p1(*[arg_sets[0][i] for i in (0, 1, 4, 5)], out=g2, config=g2_cfg)
        synchronize()
        row["g2_bits_equal_p0"] = bool(torch.equal(g2.view(torch.int16), want.view(torch.int16)))

        def p1_g2(x, g, w_q, w_s, pre, g_w, q, s, f):
            return gemm_nvfp4_p1(x, g, pre, g_w, out=out, config=g2_cfg)
        timed.append(("p1_g2", p1_g2))
    if args.ablate:
        studies = [("p1_no_quantizer", P1Study(splits=splits,
                                               variant=P0Variant(skip_dequant=True))),
                   ("p1_no_mma", P1Study(splits=splits, variant=P0Variant(skip_mma=True))),
                   ("p1_b3", P1Study(splits=splits, buffers=3))]
        studies += [(f"{label}_local", replace(study, pair_local_only=True))
                    for label, study in clusters]
        for label, study in studies:
            cfg = study.build()
            if label == "p1_b3":  # an exact build: its bits too
                got_b = torch.full_like(out, float("nan"))
                gemm_nvfp4_p1(*[arg_sets[0][i] for i in (0, 1, 4, 5)], out=got_b, config=cfg)
                synchronize()
                row[f"{label}_bits_equal_p0"] = bool(torch.equal(got_b.view(torch.int16),
                                                                 want.view(torch.int16)))

            def ablated(x, g, w_q, w_s, pre, g_w, q, s, f, cfg=cfg):
                return gemm_nvfp4_p1(x, g, pre, g_w, out=out, config=cfg)
            timed.append((label, ablated))
    for label, fn in timed:
        t = bench(fn, arg_sets, graph=True, warmup_ms=5, rep_ms=args.rep_ms).as_dict()
        row[label] = {"timing": t, "us": t["median_us"],
                      "ns_per_kblock": 1e3 * t["median_us"] / kblocks}
        if label.startswith("p1"):
            row[label].update(build_figures(label, M, N, K, row[label]["us"]))
    row["p1_over_p0_gemm"] = row["p1"]["us"] / row["p0_gemm"]["us"]
    row["p1_over_p0_e2e"] = row["p1"]["us"] / row["p0_e2e"]["us"]
    row.update(producer_cost(row))
    ablation = "".join(f"  {label} {row[label]['ns_per_kblock']:.0f} ns/kblock"
                       for label, _ in timed if label not in ("p0_gemm", "p0_e2e", "p1"))
    for k in sorted(k for k in row if k.endswith("bits_equal_p0") and k != "bits_equal_p0"):
        ablation += f" {k.removeprefix('p1_').removesuffix('_p0')}={row[k]}"
    if "break_even_cxg" in row:
        ablation += f"  break_even_cxg {row['break_even_cxg']:.2f}"
    rows.append(row)
    print(f"{name:>4} M={M:<5} s{splits} p0_gemm {row['p0_gemm']['us']:8.1f} us  p0_e2e "
          f"{row['p0_e2e']['us']:8.1f}  p1 {row['p1']['us']:8.1f} ({row['p1']['ns_per_kblock']:.0f}"
          f" ns/kblock)  p1/p0_gemm {row['p1_over_p0_gemm']:.2f}  p1/p0_e2e "
          f"{row['p1_over_p0_e2e']:.2f}  bits_equal={row['bits_equal_p0']} "
          f"rerun={row['rerun_identical']} no_nan={row['no_nan_left']}{ablation}", flush=True)
    del sets, packed
    torch.cuda.empty_cache()


WGMMA_DENSE_PEAK = 790e12  # f16 wgmma FLOP/s an H200 sustains (experiments/p0_baseline.py)


def build_figures(label: str, M: int, N: int, K: int, us: float) -> dict:
    """What the issue asks beside each P1 build's time, from its shape and build: threads and
    registers a role (the setmaxnreg split), CTAs an SM (shared memory and threads), the tensor
    pipe's busy fraction estimated as the FLOP rate over the dense wgmma rate (timing-derived,
    not a counter), and the bf16 activation bytes its CTAs' TMAs read a call (each CTA reads its
    token tile once a K pass; a cluster once for all its CTAs)."""
    study = study_of(label)
    if study is None:
        return {}
    d = study.build().describe()
    tokens = study.tokens
    weight_rows = 128 * study.groups * study.cluster
    per_sm = min(233472 // (d["smem_bytes"] + 1024), 2048 // d["threads"],
                 65536 // (d["threads"] * 128))  # compiled at the 128-register cap
    return {"threads": d["threads"], "role_registers": {k: v["regs"] for k, v in
                                                        d["roles"].items()},
            "cluster": d["cluster_n"], "ctas_per_sm": per_sm, "smem_bytes": d["smem_bytes"],
            "tensor_pipe_busy_est": 2 * M * N * K / (us * 1e-6) / WGMMA_DENSE_PEAK,
            "bf16_bytes_read": -(-M // tokens) * tokens * K * 2 * -(-N // weight_rows)}


def study_of(label: str):
    """The P1Study a timed label names (None for P0's columns and the ablations), at one K
    split: what :func:`build_figures` reads from it (threads, registers, shared memory) does
    not depend on the split."""
    if label == "p1":
        return P1Study()
    if label == "p1_g2":
        return P1Study(groups=2, tokens=64)
    if label.startswith("p1_c") and label[4:].isdigit():
        return P1Study.of_cluster(int(label[4:]))
    return None


def producer_cost(row: dict) -> dict:
    """The seed's measure on Hopper: P1's extra time a (128-row N tile, 64-K tile) over P0's
    GEMM at the same k-block count; with the ablations, the break-even C x G (the quantizer's
    time a k-block alone over the MMA's alone: the sharing that would hide it)."""
    r = {"producer_ns_per_ntile_ktile": row["p1"]["ns_per_kblock"]
         - row["p0_gemm"]["ns_per_kblock"]}
    if "p1_no_mma" in row and "p1_no_quantizer" in row:
        r["break_even_cxg"] = (row["p1_no_mma"]["ns_per_kblock"]
                               / row["p1_no_quantizer"]["ns_per_kblock"])
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=150.0)
    p.add_argument("--rep-ms", type=float, default=40.0)
    p.add_argument("--ablate", action="store_true",
                   help="also time P1 without its quantizer and without its wgmmas")
    p.add_argument("--cluster", type=int, nargs="+", choices=(1, 2, 4, 8), default=[1],
                   help="cluster sizes C > 1 also timed: P1 on C CTAs sharing each quantized "
                        "tile (one split, weight tiles a multiple of C); with --ablate each "
                        "C's ablation (nothing sent) too")
    p.add_argument("--groups", type=int, choices=(1, 2), default=1,
                   help="2: also time P1's N-group reuse (64-token tiles, each quantized tile "
                        "into two weight tiles; P1Study(groups=2, tokens=64))")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("p1_ab: needs the H200", file=sys.stderr)
        return 2
    out_dir = args.out or Path(os.environ.get("WB_RESULTS_DIR", "."))
    path = out_dir / "p1-ab.json"
    if path.exists():
        print(f"p1_ab: {path} exists; not overwritten", file=sys.stderr)
        return 1
    t0, rows, done, skipped = time.time(), [], [], []
    for name, M in JOBS:
        if time.time() - t0 > args.seconds:
            skipped.append(f"{name}@{M}")
            continue
        run_job(name, M, args, rows)
        done.append(f"{name}@{M}")
    if skipped:
        print(f"not run (--seconds {args.seconds:.0f}): {', '.join(skipped)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    prov = {"commit": os.environ.get("WB_GIT_COMMIT", "unknown")[:7],
            "dirty": os.environ.get("WB_GIT_DIRTY"), "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python3 scripts/p1_ab.py " + " ".join(argv or sys.argv[1:]),
            "jobs_run": done, "jobs_skipped": skipped, "seconds": time.time() - t0}
    path.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
