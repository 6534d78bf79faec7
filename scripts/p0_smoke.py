"""Quick P0 smoke on the GPU: one small exact check, then rough timings vs cuBLAS bf16."""
import sys, time, torch
from validators.gemm_operands import make_operand
from numerics import gemm_oracle as G
from kernels.gemm_nvfp4 import gemm_nvfp4
from kernels.blockscaled_gemm_sm90 import BlockscaledGemmSm90

def check(M, N, K, tile_n, kinds=("normal", "normal")):
    a = make_operand(kinds[0], M, K, 1, "cuda"); b = make_operand(kinds[1], N, K, 2, "cuda")
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    t = time.time()
    gemm_nvfp4(*a, *b, out=out, config=BlockscaledGemmSm90(tile_n=tile_n, stages=4))
    torch.cuda.synchronize()
    d, real, bound = G.reference_gemm(a[0], a[1], b[0], b[1], a[2], b[2], M, N, K)
    err = (out.double() - real).abs()
    print(f"check M={M} N={N} K={K} tile_n={tile_n}: nan={int(torch.isnan(out).sum())} "
          f"bad={int((~(err <= bound)).sum())} exact={float((out.double()==d.double()).float().mean()):.4f} "
          f"({time.time()-t:.1f}s)", flush=True)

for args in [(130, 264, 96, 128), (300, 520, 1056, 256)]:
    check(*args)

def bench(fn, iters=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(5): fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        s.record(); g.replay(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 5)
    ts.sort(); return ts[len(ts)//2] * 1e3

for M, N, K in [(128, 5376, 5376), (128, 21504, 5376), (2048, 21504, 5376), (2048, 5376, 14336), (8192, 21504, 5376)]:
    a = make_operand("normal", M, K, 1, "cuda"); b = make_operand("normal", N, K, 2, "cuda")
    a = (a[0], a[1], torch.tensor([a[2]], device="cuda")); b = (b[0], b[1], torch.tensor([b[2]], device="cuda"))
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    tb = bench(lambda: torch.nn.functional.linear(x, w))
    for tn, st in ((128, 8), (256, 4)):
        cfg = BlockscaledGemmSm90(tile_n=tn, stages=st)
        tp = bench(lambda: gemm_nvfp4(*a, *b, out=out, config=cfg))
        fl = 2 * M * N * K
        print(f"M={M} N={N} K={K} tile_n={tn}: p0 {tp:.1f} us ({fl/tp/1e6:.0f} TF/s) cublas bf16 {tb:.1f} us ({fl/tb/1e6:.0f} TF/s) ratio {tb/tp:.2f}", flush=True)
