"""P0 mainloop ablations and the split-K sweep on the GPU (device time only, CUDA-graph replay).

    python3 scripts/p0_ablate.py            # each half of the mainloop alone (P0Variant)
    python3 scripts/p0_ablate.py --splitk   # M = 128: splits 1-4 (default_config's choice)

The tile-shape and f16-buffer sweeps lost their A/B and left with their options; their logs are
results/logs/ddb50d7-p0-tiles.log and abaec12-p0-buffers.log (notes/p0-gemm.md v2, v3).
"""
import sys

import torch

from configs.arch import K_BLOCK
from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, P0Variant
from validators.gemm_operands import make_operand
from workbench.timing import bench

ABLATIONS = {"full": P0Variant(), "no dequant": P0Variant(skip_dequant=True),
             "no MMA": P0Variant(skip_mma=True)}


def _operand(rows, K, seed):
    q, s, g = make_operand("normal", rows, K, seed, "cuda")
    return q, s, torch.tensor([g], device="cuda")


def run(M, N, K, configs):
    """Time each ``(label, BlockscaledGemmSm90 kwargs)`` against cuBLAS bf16 at M x N x K."""
    a, b = _operand(M, K, 1), _operand(N, K, 2)
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    t_ref = bench(lambda: torch.nn.functional.linear(x, w), graph=True).median_us
    for label, kw in configs:
        variant = kw.pop("variant", None)
        cfg = BlockscaledGemmSm90(**kw)
        cfg = cfg if variant is None else variant.of(cfg)
        t = bench(lambda cfg=cfg: gemm_nvfp4(*a, *b, out=out, config=cfg), graph=True).median_us
        k_blocks = -(-K // K_BLOCK)
        tiles = -(-M // cfg.tile_m) * -(-N // cfg.tile_n) * cfg.splits
        per_kb = t / (-(-tiles // 132) * -(-k_blocks // cfg.splits))
        print(f"M={M} N={N} K={K} {label}: {t:.1f} us (cuBLAS {t_ref:.1f}, ratio "
              f"{t_ref / t:.2f}); {per_kb * 1e3:.0f} ns per k-block per CTA", flush=True)


def main(argv):
    if "--splitk" in argv:
        for M, N, K in [(128, 5376, 5376), (128, 5376, 14336), (128, 14336, 5376),
                        (128, 21504, 5376)]:
            run(M, N, K, [(f"splits={sp}", dict(tile_n=128, stages=8, splits=sp))
                          for sp in (1, 2, 3, 4)])
        return
    for M, N, K in [(128, 5376, 5376), (2048, 21504, 5376)]:
        run(M, N, K, [(f"tile_n={tn} stages={st} {name}",
                       dict(tile_n=tn, stages=st, variant=variant))
                      for tn, st in ((128, 8), (256, 4)) for name, variant in ABLATIONS.items()])


if __name__ == "__main__":
    main(sys.argv[1:])
