"""Kernel breakdown of one fast-loop frame on the GPU: ``--rows 1 8 64 [--graph] [--variant ...]``.

Without ``--graph`` an eager frame (kernel time by name). With it, a replay of the captured frame,
as the benchmark runs it (its CuTe DSL kernels named by their role in the layer): under programmatic
dependent launch the kernels overlap, so besides each kernel's own time it reports how far each one
moved the frame's end (its end minus the latest end before it, summed by kernel kind: what the frame
would lose without it), the measure that sums to the frame's span.
"""
import argparse
import json
import os
import re

import torch
from torch.profiler import ProfilerActivity, profile

from models.codepredictor import random_weights
from models.fast_loop import GEMV_MAX_ROWS, FastLoop, FastWeights
from models.sampler import Sampler
from workbench.results import provenance, provenance_line


def kernel_kind(name: str) -> str:
    """A short, stable name for a kernel: CuTe DSL kernels by their class (the mangled names
    carry the static config; a second kernel method, e.g. ``kernel_tma``, names it too), the
    rest by their first 60 characters."""
    m = re.search(r"kernel_cutlass_kernel(?:_[a-z0-9]+)?_kernels[a-z0-9_]*?([A-Z][A-Za-z0-9]*)"
                  r"_object_at", name)
    return m.group(1) if m else name[:60]


def frame_roles(cfg, draw_norm: bool = True, qkv_table: bool = False) -> list:
    """The frame's CuTe DSL kernels in launch order (FastLoop._frame_kernels above
    GEMV_MAX_ROWS rows, without fold_norm), each by its role: a layer's norm / qkv / attention /
    wo / norm / gate_up / down (position 0's last layer ends at its attention), and from
    position 1 on the final norm, the head and the draw; ``prefill="serial"`` only (with
    "overlap" positions 0 and 1 interleave). ``draw_norm`` (FastLoop's): the draws normalise
    layer 0's input from position 2 on; ``qkv_table``: they gather its QKV rows (layer 0 starts
    at the attention)."""
    layer = ["norm_in", "qkv", "attention", "wo", "norm_post", "gate_up", "down"]
    roles = []
    skip = 2 if qkv_table else 1 if draw_norm else 0  # layer 0's kernels the draw took over
    for p in range(cfg.positions):
        for li in range(cfg.layers):
            kernels = layer[skip:] if li == 0 and p >= 2 else layer
            roles += kernels[:kernels.index("attention") + 1] \
                if p == 0 and li == cfg.layers - 1 else kernels
        roles += ["norm_final", "heads", "draw"] if p else []
    return roles


def label_roles(spans, roles) -> list:
    """(kind, start, end) events -> the same with the CuTe DSL kernels' kinds suffixed by their
    role (``frame_roles``) in start order; unchanged when their count is not the roles'."""
    ours = [i for i, s in sorted(enumerate(spans), key=lambda e: e[1][1])
            if s[0].startswith(("GemmSkinny", "RowsRmsNorm", "DepthAttention", "DepthSampler"))]
    if len(ours) != len(roles):
        return spans
    out = list(spans)
    for i, role in zip(ours, roles):
        out[i] = (f"{spans[i][0]}:{role}", *spans[i][1:])
    return out


def end_increments(events) -> dict:
    """events: (kind, start, end) in any order -> {kind: {"count", "own", "moved"}}: the
    kernels' own durations and, in start order, how far each moved the latest end before it
    (an idle gap before a kernel counts as its own: its launch); the "moved" sums add up to the
    span from the first start to the last end."""
    out, latest = {}, None
    for kind, start, end in sorted(events, key=lambda e: (e[1], e[2])):
        moved = max(0.0, end - (start if latest is None else latest))
        latest = end if latest is None else max(latest, end)
        row = out.setdefault(kind, {"count": 0, "own": 0.0, "moved": 0.0})
        row["count"] += 1
        row["own"] += end - start
        row["moved"] += moved
    return out


def main():
    from scripts.ab_frame import parse_variant

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--graph", action="store_true", help="profile a replay of the captured frame")
    ap.add_argument("--variant", default="", help="FastLoop keyword arguments (as ab_frame's)")
    ap.add_argument("--tag", default="", help="suffix of the JSON file's name (with --graph)")
    args = ap.parse_args()
    kw = parse_variant(args.variant)
    print(provenance_line({"weights": 0}), flush=True)
    w = random_weights(seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    report = {}
    for R in args.rows:
        h = torch.randn(R, 2048, device="cuda").to(torch.bfloat16)
        g0 = torch.randint(0, 2048, (R,), device="cuda")
        fl = FastLoop(fw, R, Sampler(R, seeds=list(range(R)), device="cuda"),
                      graph=args.graph, **kw)
        for _ in range(2):
            fl(h, g0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            if args.graph:  # the frame alone (no input copies, no host gap before the replay)
                fl.graph.replay()
            else:
                fl(h, g0)
            torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
        tot = sum(e.device_time for e in ev)
        print(f"R={R} ({fl.path}, {'graph' if args.graph else 'eager'}): {len(ev)} kernels "
              f"per frame, {tot:.0f} us of kernel time")
        if not args.graph:
            by = {}
            for e in ev:
                n, t = by.get(e.name[:70], (0, 0.0))
                by[e.name[:70]] = (n + 1, t + e.device_time)
            for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:14]:
                print(f"  {t:8.0f} us  {n:4d}x  {k}")
            continue
        spans = [(kernel_kind(e.name), e.time_range.start, e.time_range.end) for e in ev]
        if fl.run_rows > GEMV_MAX_ROWS and not fl.fold_norm and fl.prefill == "serial":
            spans = label_roles(spans, frame_roles(fw.config, getattr(fl, "draw_norm", False),
                                                   fl.qkv_table))
        rows = end_increments(spans)
        span = max(s[2] for s in spans) - min(s[1] for s in spans)
        print(f"  span {span:.0f} us; by how much each kind moved the frame's end:")
        for kind, r in sorted(rows.items(), key=lambda kv: -kv[1]["moved"]):
            print(f"  {r['moved']:8.0f} us moved  {r['own']:8.0f} us own  {r['count']:4d}x  "
                  f"{kind}  ({r['moved'] / r['count']:.2f} us each)")
        report[str(R)] = {"span_us": span, "kinds": rows}
    if args.graph:
        out = os.path.join(os.environ.get("WB_RESULTS_DIR", "results"),
                           f"fast-loop-profile{'-' + args.tag if args.tag else ''}.json")
        if os.path.exists(out):
            raise SystemExit(f"{out} exists: pass another --tag")
        with open(out, "w") as f:
            json.dump({"provenance": provenance(), "variant": kw, "rows": report}, f, indent=1)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
