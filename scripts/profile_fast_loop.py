"""Kernel breakdown of one fast-loop frame (not graphed) on the GPU: ``--rows 1 8 64``."""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from models.codepredictor import random_weights
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
args = ap.parse_args()
w = random_weights(seed=0, dtype=torch.bfloat16).to(device="cuda")
fw = FastWeights(w)
for R in args.rows:
    h = torch.randn(R, 2048, device="cuda").to(torch.bfloat16)
    g0 = torch.randint(0, 2048, (R,), device="cuda")
    fl = FastLoop(fw, R, Sampler(R, seeds=list(range(R)), device="cuda"), graph=False)
    for _ in range(2):
        fl(h, g0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fl(h, g0)
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
    tot = sum(e.device_time for e in ev)
    print(f"R={R} ({fl.path}): {len(ev)} kernels per frame, {tot:.0f} us of kernel time")
    by = {}
    for e in ev:
        k = e.name[:70]
        n, t = by.get(k, (0, 0.0))
        by[k] = (n + 1, t + e.device_time)
    for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {t:8.0f} us  {n:4d}x  {k}")
