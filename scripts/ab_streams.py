"""Same-run frame A/B: one R-row fast loop against the rows split into parts, each part its own
fast loop on its own stream, all captured in one CUDA graph (``--rows 64 --parts 32,32
--parts 16,16,16,16``).

The question (notes/fast-loop.md v10l): the frame at 64 rows is latency-bound (~1 TB/s of
4.8), and rows are independent, so do two half-row chains interleave on the GPU faster than one
full chain? Each part's rows draw with their own seeds, as in the whole loop (the draw is keyed
by seed, offset and row), so its codes are comparable; the script reports how many agree.
"""
import argparse

import torch

from models.codepredictor import random_weights
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
from workbench.results import provenance_line
from workbench.timing import bench


class StreamParts:
    """The rows in parts, one eager FastLoop and one stream a part, captured as one graph."""

    def __init__(self, fw, parts: list):
        self.parts = parts
        starts = [sum(parts[:i]) for i in range(len(parts))]
        self.loops = [FastLoop(fw, r, Sampler(r, seeds=list(range(s, s + r)), device="cuda"),
                               graph=False) for s, r in zip(starts, parts)]
        self.streams = [torch.cuda.Stream() for _ in parts]
        offsets = [fl.sampler.offset.clone() for fl in self.loops]
        for _ in range(2):  # compile and warm up outside the graph
            for fl in self.loops:
                fl._run_frame()
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            cap = torch.cuda.current_stream()
            for s, fl in zip(self.streams, self.loops):
                s.wait_stream(cap)
                with torch.cuda.stream(s):
                    fl._run_frame()
            for s in self.streams:
                cap.wait_stream(s)
        for fl, off in zip(self.loops, offsets):
            fl.sampler.offset.copy_(off)

    def __call__(self, h, g0):
        start = 0
        for fl, r in zip(self.loops, self.parts):
            fl.h[:r].copy_(h[start:start + r])
            fl.g0[:r].copy_(g0[start:start + r])
            start += r
        self.graph.replay()
        return torch.cat([fl.codes[:r] for fl, r in zip(self.loops, self.parts)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--parts", action="append", default=[], help="comma-separated part rows")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(provenance_line({"weights": 0}), flush=True)
    w = random_weights(seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    R = args.rows
    g = torch.Generator(device="cuda").manual_seed(R)
    h = torch.randn(R, w.config.talker_hidden, device="cuda", generator=g).to(torch.bfloat16)
    g0 = torch.randint(0, 2048, (R,), device="cuda", generator=g)
    whole = FastLoop(fw, R, Sampler(R, seeds=list(range(R)), device="cuda"))
    runs = {"whole": lambda: whole(h, g0).codes}
    for text in args.parts:
        parts = [int(p) for p in text.split(",")]
        if sum(parts) != R:
            raise SystemExit(f"parts {parts} do not add up to {R} rows")
        sp = StreamParts(fw, parts)
        runs[f"parts {text}"] = lambda sp=sp: sp(h, g0)
    ref = runs["whole"]().clone()  # each loop's first frame draws at the same offsets
    for name, fn in list(runs.items())[1:]:
        agree = float((fn() == ref).float().mean())
        print(f"{name}: codes agreeing with the whole loop's (first frames) {agree:.3f}",
              flush=True)
    times = {name: [] for name in runs}
    for rnd in range(args.rounds):
        for name, fn in runs.items():
            times[name].append(bench(fn, warmup_ms=100, rep_ms=400).median_us)
            print(f"round {rnd} {name}: {times[name][-1]:.0f} µs", flush=True)
    for name, ts in times.items():
        print(f"{R} rows {name}: median of rounds {sorted(ts)[len(ts) // 2]:.0f} µs")


if __name__ == "__main__":
    main()
