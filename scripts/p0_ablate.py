"""P0 mainloop ablations and config sweep on the GPU (device time only, CUDA-graph replay)."""
import torch
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
from kernels.nvfp4.gemm import gemm_nvfp4
from validators.gemm_operands import make_operand
from workbench.timing import bench

def run(M, N, K, configs):
    a = make_operand("normal", M, K, 1, "cuda"); b = make_operand("normal", N, K, 2, "cuda")
    a = (a[0], a[1], torch.tensor([a[2]], device="cuda")); b = (b[0], b[1], torch.tensor([b[2]], device="cuda"))
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    tb = bench(lambda: torch.nn.functional.linear(x, w), graph=True).median_us
    for kw in configs:
        cfg = BlockscaledGemmSm90(**kw)
        t = bench(lambda: gemm_nvfp4(*a, *b, out=out, config=cfg), graph=True).median_us
        kb = -(-K // 64); tiles = -(-M // cfg.tile_m) * -(-N // cfg.tile_n) * cfg.splits
        per_kb = t / (-(-tiles // 132) * -(-kb // cfg.splits))
        print(f"M={M} N={N} K={K} {kw}: {t:.1f} us (cuBLAS {tb:.1f}, ratio {tb/t:.2f}); "
              f"{per_kb*1e3:.0f} ns per k-block per CTA", flush=True)

import sys
if "--splitk" in sys.argv:  # M = 128: split K so every SM works (default_config's choice)
    for M, N, K in [(128, 5376, 5376), (128, 5376, 14336), (128, 14336, 5376), (128, 21504, 5376)]:
        run(M, N, K, [dict(tile_n=128, stages=8, splits=sp) for sp in (1, 2, 3, 4)])
elif "--buffers" in sys.argv:  # f16 buffer depth: 4 lets expansion run two wgmma groups ahead
    for M, N, K in [(128, 5376, 5376), (2048, 21504, 5376), (8192, 14336, 5376)]:
        run(M, N, K, [dict(tile_n=tn, stages=st, buffers=b) for tn, st, b in
                      ((256, 4, 3), (256, 2, 4), (128, 8, 3), (128, 6, 4))])
elif "--tiles" in sys.argv:  # tile-shape sweep at compute-bound sizes
    for M, N, K in [(2048, 21504, 5376), (2048, 5376, 14336), (8192, 14336, 5376)]:
        run(M, N, K, [dict(tile_m=tm, tile_n=tn, stages=st) for tm, tn, st in
                      ((128, 256, 4), (256, 128, 4), (256, 128, 3))])
else:
    for M, N, K in [(128, 5376, 5376), (2048, 21504, 5376)]:
        run(M, N, K, [dict(tile_n=tn, stages=st, ablate=ab) for tn, st in ((128, 8), (256, 4))
                      for ab in (None, "no_dequant", "no_mma")])
