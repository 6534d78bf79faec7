import time, torch, shutil
print("torch", torch.__version__, "gcc", shutil.which("gcc"), "cc", shutil.which("cc"))
try:
    import triton; print("triton", triton.__version__)
except Exception as e:
    print("no triton", e)
def f(x, w, n):
    xf = x.float(); y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    a = n * y.to(x.dtype)
    h = a @ w.t()
    g, u = h.chunk(2, -1)
    return torch.nn.functional.silu(g) * u
x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(6144, 1024, device="cuda", dtype=torch.bfloat16); n = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
t = time.time()
try:
    cf = torch.compile(f, dynamic=False)
    y = cf(x, w, n); torch.cuda.synchronize(); print("compiled in", time.time() - t)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): cf(x, w, n)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g): y2 = cf(x, w, n)
    g.replay(); torch.cuda.synchronize(); print("graph ok", (y2 - f(x, w, n)).abs().max().item())
except Exception as e:
    print("compile failed:", type(e).__name__, str(e)[:500])
