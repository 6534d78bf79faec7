"""Per-kernel times of the fast loop's kernels path on the GPU, each in a CUDA graph of back-to-back
launches (weights rotated through copies beyond L2), with and without programmatic dependent
launch; and the whole frame with PDL on and off. Writes a results summary ``depth-kernels.json``
into the run folder (``$WB_RESULTS_DIR``, default results/runs/<utc>-<host>/).

    python3 scripts/bench_depth_kernels.py --rows 1 8 64

Up to 8 rows the projections are the fused GEMVs (kernels/depth/gemv_small_m.py): the loop uses them
only up to ``GEMV_MAX_ROWS`` (schedules/plan.py) and pads more rows to 16, so at 3-8 rows this
times the GEMV side of that crossover. Above 8 rows a normed projection is timed as a row norm +
the mma.sync split-K projection with the kernel's default tiles (the loop's plan may run another
mainloop there). Frames (``--rows``) are the loop's own plan, padding included.
"""
import argparse
import math

import torch

from kernels.depth.attention import depth_attention
from kernels.depth.draw import depth_draw
from kernels.depth.gemm_skinny import gemm_skinny, pack_weights
from kernels.depth.gemv_small_m import gemv_small_m as gemv
from kernels.depth.rows_rmsnorm import rows_rmsnorm
from models.codepredictor import random_weights
from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
from schedules.plan_variant import FrameVariant, variant_plan
from workbench import results as Rs
from workbench.timing import bench

LAUNCHES = 40
L2_BYTES = 60 * 2**20  # the H200's L2


def _graph_time_us(fn, launches=LAUNCHES):
    """Median µs per launch of ``fn(i)`` for i < launches, captured as one graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(launches):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(launches):
            fn(i)
    return bench(g.replay, warmup_ms=50, rep_ms=300).median_us / launches


def _copies(shape, nbytes):
    n = max(2, math.ceil(2 * L2_BYTES / nbytes))
    return [torch.randn(*shape, device="cuda").mul_(0.02).to(torch.bfloat16) for _ in range(n)]


def kernel_cases(R):
    c = CFG
    D, qkv_n = c.head_dim, (c.q_heads + 2 * c.kv_heads) * c.head_dim
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(R, c.hidden, **bf)
    gamma = torch.ones(c.hidden, **bf)
    qkv = torch.randn(R, qkv_n, **bf)
    attn = torch.randn(R, c.q_heads * D, **bf)
    mlp = torch.randn(R, c.intermediate, **bf)
    logits = torch.randn(R, 15, c.vocab, device="cuda")
    kc = torch.randn(R, c.kv_heads, 16, D, **bf)
    vc = torch.randn_like(kc)
    cos = torch.randn(16, D, **bf)
    sin = torch.randn(16, D, **bf)
    table = torch.randn(c.vocab, c.hidden, **bf)
    embeds = torch.randn(c.vocab, c.talker_hidden, **bf)
    used = torch.zeros(R, 16, c.talker_hidden, **bf)
    codes = torch.zeros(R, 15, dtype=torch.int64, device="cuda")
    smp = Sampler(R, seeds=list(range(R)), device="cuda")
    w = {"qkv": _copies((qkv_n, c.hidden), qkv_n * c.hidden * 2),
         "wo": _copies((c.hidden, c.q_heads * D), c.hidden * c.q_heads * D * 2),
         "gate_up": _copies((2 * c.intermediate, c.hidden), 4 * c.intermediate * c.hidden),
         "down": _copies((c.hidden, c.intermediate), 2 * c.intermediate * c.hidden),
         "head": _copies((c.vocab, c.hidden), 2 * c.vocab * c.hidden)}
    nbytes = {k: v[0].numel() * 2 for k, v in w.items()}
    if R <= 8:
        def project(a, wt, out, pdl, gamma=None, resid=None, swiglu=False):
            gemv(a, wt, out, gamma=gamma, resid=resid, swiglu=swiglu, pdl=pdl)
    else:  # as FastLoop._project: row norm + split-K tensor-core projection
        xn = torch.empty_like(x)

        def project(a, wt, out, pdl, gamma=None, resid=None, swiglu=False):
            if gamma is not None:
                a = rows_rmsnorm(a, gamma, xn, pdl=pdl)
            gemm_skinny(a, packed(wt, swiglu), out, resid=resid, swiglu=swiglu, pdl=pdl)

        packs = {}

        def packed(wt, swiglu):  # the loop packs its weights once (FastWeights.skinny_weights)
            if id(wt) not in packs:
                packs[id(wt)] = pack_weights(wt, swiglu)
            return packs[id(wt)]

    def pick(k, i):
        return w[k][i % len(w[k])]

    cases = {}
    if R > 8:  # the row norm alone, and cuBLAS on the same projections (an anchor)
        cases["rows_norm"] = (0, lambda i, pdl: rows_rmsnorm(x, gamma, xn, pdl=pdl))
        for k, a in (("qkv", x), ("wo", attn), ("gate_up", x), ("down", mlp), ("head", x)):
            cases[f"cublas_{k}"] = (nbytes[k], lambda i, pdl, k=k, a=a: a @ pick(k, i).t())
    return cases | {
        "qkv_norm": (nbytes["qkv"], lambda i, pdl: project(x, pick("qkv", i), qkv, pdl,
                                                            gamma=gamma)),
        "attention": (0, lambda i, pdl: depth_attention(qkv, gamma[:D], gamma[:D], cos, sin, kc,
                                                        vc, i % 16, attn, q_heads=c.q_heads,
                                                        kv_heads=c.kv_heads, pdl=pdl)),
        "wo_residual": (nbytes["wo"], lambda i, pdl: project(attn, pick("wo", i), x, pdl,
                                                              resid=x)),
        "gate_up_swiglu": (nbytes["gate_up"], lambda i, pdl: project(x, pick("gate_up", i), mlp,
                                                                      pdl, gamma=gamma,
                                                                      swiglu=True)),
        "down_residual": (nbytes["down"], lambda i, pdl: project(mlp, pick("down", i), x, pdl,
                                                                  resid=x)),
        "head_norm_f32": (nbytes["head"], lambda i, pdl: project(x, pick("head", i),
                                                                  logits[:, i % 15], pdl,
                                                                  gamma=gamma)),
        "draw": (0, lambda i, pdl: depth_draw(logits[:, i % 15], codes[:, i % 15], table, embeds,
                                              x, used[:, 1 + i % 15], i % 15, mode="sample",
                                              temperature=smp.temperature, top_k=smp.top_k,
                                              seed=smp.seed, offset=smp.offset, pdl=pdl)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    measurements = []
    wts = random_weights(seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(wts)
    lines = []
    for R in args.rows:
        for name, (nbytes, fn) in kernel_cases(R).items():
            on = _graph_time_us(lambda i: fn(i, True))
            off = on if name.startswith("cublas") else _graph_time_us(lambda i: fn(i, False))
            measurements.append({"rows": R, "kernel": name, "pdl_us": on, "no_pdl_us": off,
                                 "weight_bytes": nbytes,
                                 "pdl_tbps": nbytes / on / 1e6 if nbytes else None})
            lines.append(f"{R:>3} {name:<16} {on:8.2f} {off:8.2f} "
                         f"{(nbytes / on / 1e6 if nbytes else 0):7.2f}")
            print(lines[-1], flush=True)
        g = torch.Generator(device="cuda").manual_seed(R)
        h = torch.randn(R, 2048, device="cuda", generator=g).to(torch.bfloat16)
        g0 = torch.randint(0, 2048, (R,), device="cuda", generator=g)
        for pdl in (True, False):
            fl = FastLoop(fw, R, Sampler(R, seeds=list(range(R)), device="cuda"),
                          plan=variant_plan(R, FrameVariant(pdl=pdl)))
            t = bench(lambda: fl(h, g0), warmup_ms=100, rep_ms=500).median_us
            measurements.append({"rows": R, "kernel": "frame", "pdl": pdl, "us": t})
            lines.append(f"{R:>3} frame pdl={pdl}: {t:.0f} us")
            print(lines[-1], flush=True)
    summary = Rs.make_summary(
        "depth-kernels", parameters={"rows": args.rows, "launches_per_graph": LAUNCHES,
                                     "weights_rotated_beyond_bytes": 2 * L2_BYTES},
        measurements=measurements,
        headline={"frame_us": {f"{m['rows']}{'' if m['pdl'] else ' no-pdl'}": round(m["us"], 1)
                               for m in measurements if m["kernel"] == "frame"}},
        gates={}, seeds={"weights": 0})
    path = Rs.write(summary, None)
    print("rows kernel            pdl_us   nopdl_us  TB/s")
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
