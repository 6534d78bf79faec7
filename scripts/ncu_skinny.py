"""One skinny projection (kernels/depth/gemm_skinny.py) launched a few times, for Nsight Compute:

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        -k regex:kernel -c 1 -s 2 python3 scripts/ncu_skinny.py --rows 64 --n 3072 --k 1024 --swiglu
"""
import argparse

import torch

from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--rows", type=int, default=64)
ap.add_argument("--n", type=int, default=3072)
ap.add_argument("--k", type=int, default=1024)
ap.add_argument("--swiglu", action="store_true")
ap.add_argument("--pdl", action="store_true")
ap.add_argument("--splits", type=int, default=None, help="K slices (cluster size)")
args = ap.parse_args()
g = torch.Generator(device="cuda").manual_seed(0)
a = torch.randn(args.rows, args.k, device="cuda", generator=g).to(torch.bfloat16)
w = (0.03 * torch.randn((2 if args.swiglu else 1) * args.n, args.k, device="cuda",
                        generator=g)).to(torch.bfloat16)
out = torch.empty(args.rows, args.n, device="cuda", dtype=torch.bfloat16)
w = pack_weights(w, args.swiglu)
for _ in range(4):
    gemm_skinny(a, w, out, swiglu=args.swiglu, pdl=args.pdl, splits=args.splits)
torch.cuda.synchronize()
print("ok", float(out.float().abs().mean()))
