import torch, time
import kernels.gemm_skinny as gs
from models.codepredictor import random_weights
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
from workbench.timing import bench
w = random_weights(seed=0, dtype=torch.bfloat16).to(device="cuda"); fw = FastWeights(w)
R = 64
g = torch.Generator(device="cuda").manual_seed(R)
h = torch.randn(R, 2048, device="cuda", generator=g).to(torch.bfloat16)
g0 = torch.randint(0, 2048, (R,), device="cuda", generator=g)
loops = {}
for name, tuned in (("4 slices", {}), ("8 slices (tuned)", {(64, 4096, 1024): 8})):
    gs.TUNED_SPLITS.clear(); gs.TUNED_SPLITS.update(tuned)
    loops[name] = FastLoop(fw, R, Sampler(R, seeds=list(range(R)), device="cuda"))
for rep in range(3):
    for name, fl in loops.items():
        print(rep, name, round(bench(lambda: fl(h, g0), warmup_ms=100, rep_ms=400).median_us), flush=True)
