"""Why P1's clusters of 4 and 8 CTAs gave wrong bits on the H200 (notes/p1.md, session 25):
each variant's output against P0's bits on the two shapes that failed, three runs each, with the
mismatches located by 128-column weight tile (the CTA's rank in its cluster) and by k-block-free
row; then each variant's time on qkv at M = 2048.

    python3 scripts/p1_cluster_diag.py [--out DIR]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import torch

from device.waits import synchronize
from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, P1Study
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import quantize_nvfp4
from numerics import nvfp4
from workbench.timing import bench

SHAPES = [(128, 1024, 2048), (1100, 2048, 320), (300, 2048, 1056)]


def variant(name: str):
    """(cluster size, config) of a named variant."""
    c = int(name[1])
    if name.endswith("_b2c"):
        study = P1Study(cluster=c, buffers=2 * c, stages=4 if c == 4 else 3)
    else:
        study = P1Study.of_cluster(c)
    cfg = study.build()
    if name.endswith(("_fence", "_relaxed", "_pfence")):
        act, consumer = copy.copy(cfg.activation), cfg.consumer
        if name.endswith("_pfence"):
            consumer = copy.copy(consumer)
            consumer.proxy_fence_release = True
        elif name.endswith("_fence"):
            act.thread_fence = True
        else:
            act.relaxed_release = True
            consumer = copy.copy(consumer)
            consumer.relaxed_release = True
        cfg = BlockscaledGemmSm90.from_roles("swap_ab", cfg.producer, consumer, act,
                                             splits=1, raster_along_m=False)
    return c, cfg


def operands(M, N, K, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(M, K, generator=gen, device="cuda")
         * torch.exp(torch.randn(K, generator=gen, device="cuda"))).to(torch.bfloat16)
    w = torch.randn(N, K, generator=gen, device="cuda").to(torch.bfloat16)
    g_w = float(nvfp4.global_scale_from_amax(w.abs().max()))
    w_q, w_s = nvfp4.quantize(w, g_w, pad_16x=True)
    g_x = nvfp4.global_scale_from_amax(x.abs().max().float()).reshape(1).cuda()
    return x, g_x, prepack(w_q, w_s), w_q, w_s, torch.tensor([g_w], device="cuda")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+",
                   default=["c2", "c2_relaxed", "c4", "c4_fence", "c4_relaxed", "c4_b2c", "c8",
                            "c8_fence", "c8_relaxed"])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("p1_cluster_diag: needs the H200", file=sys.stderr)
        return 2
    rows = []
    for shape in SHAPES:
        M, N, K = shape
        x, g_x, pre, w_q, w_s, g_w = operands(M, N, K, seed=sum(shape))
        q, s = quantize_nvfp4(x, g_x, pad_16x=True)
        want = gemm_nvfp4(q, s, g_x, w_q, w_s, g_w, prepacked=pre, rows=(0, M),
                          config=BlockscaledGemmSm90.swap_ab(stages=6))
        for name in args.variants:
            c, cfg = variant(name)
            if (N // 128) % c:
                continue
            runs = []
            for _ in range(args.runs):
                out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
                try:
                    gemm_nvfp4_p1(x, g_x, pre, g_w, out=out, config=cfg)
                    synchronize()
                except Exception as e:  # a trap: report and stop this process's GPU work
                    print(f"{shape} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    rows.append({"shape": shape, "variant": name, "error": str(e)[:300]})
                    return finish(rows, args)
                bad = out.view(torch.int16) != want.view(torch.int16)
                tiles = bad.view(M, N // 128, 128).any(dim=2).any(dim=0)
                runs.append({"mismatches": int(bad.sum()), "nan": int(out.isnan().sum()),
                             "bad_weight_tiles": tiles.nonzero().flatten().tolist()[:16],
                             "bad_rows": int(bad.any(dim=1).sum())})
            rows.append({"shape": shape, "variant": name, "runs": runs})
            print(f"{shape} {name}: " + "; ".join(
                f"{r['mismatches']} bad ({r['bad_rows']} rows, tiles {r['bad_weight_tiles']})"
                for r in runs), flush=True)
    M, N, K = 2048, 21504, 5376
    x, g_x, pre, w_q, w_s, g_w = operands(M, N, K, seed=7)
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    kblocks = (M // 128) * (N // 128) * (K // 64) / 132
    for name in ["c1"] + args.variants:
        cfg = P1Study().build() if name == "c1" else variant(name)[1]
        t = bench(lambda: gemm_nvfp4_p1(x, g_x, pre, g_w, out=out, config=cfg), [()],
                  graph=True, warmup_ms=5, rep_ms=30).as_dict()
        rows.append({"timing": name, "us": t["median_us"],
                     "ns_per_kblock": 1e3 * t["median_us"] / kblocks})
        print(f"qkv M=2048 {name}: {t['median_us']:.1f} us, "
              f"{1e3 * t['median_us'] / kblocks:.0f} ns/kblock", flush=True)
    return finish(rows, args)


def finish(rows, args) -> int:
    out_dir = args.out or Path(os.environ.get("WB_RESULTS_DIR", "."))
    path = out_dir / f"p1-cluster-diag-{'-'.join(args.variants)}.json"[:120]
    if path.exists():
        print(f"{path} exists; not overwritten", file=sys.stderr)
        return 1
    path.write_text(json.dumps(rows, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
