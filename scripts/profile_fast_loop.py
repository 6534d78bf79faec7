"""Kernel breakdown of one fast-loop frame on the GPU: ``--rows 1 8 64 [--graph] [--variant ...]``.

Without ``--graph`` an eager frame (kernel time by name). With it, a replay of the captured frame,
as the benchmark runs it (its CuTe DSL kernels named by their role in the layer): under programmatic
dependent launch the kernels overlap, so besides each kernel's own time it reports how far each one
moved the frame's end (its end minus the latest end before it, summed by kernel kind: what the frame
would lose without it), the measure that sums to the frame's span.
"""
import argparse
import re

import torch
from torch.profiler import ProfilerActivity, profile

from models.codepredictor import random_weights
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
from schedules.plan_variant import variant_plan
from scripts.ab_frame import frame_variant
from workbench.results import provenance_line, results_dir, write_record


def kernel_kind(name: str) -> str:
    """A short, stable name for a kernel: CuTe DSL kernels by their class (the mangled names
    carry the static config; a second kernel method, e.g. ``kernel_tma``, names it too), the
    rest by their first 60 characters."""
    m = re.search(r"kernel_cutlass_kernel(?:_[a-z0-9]+)?_kernels[a-z0-9_]*?([A-Z][A-Za-z0-9]*)"
                  r"_object_at", name)
    return m.group(1) if m else name[:60]


def frame_roles(cfg, input_proj: bool = False) -> list:
    """The CuTe DSL kernels of a one-chain tensor-core frame (FastLoop._frame_kernels) in start
    order, each by its role: the skinny input projection first when it runs (``input_proj``);
    positions 0 and 1 as "prefill" (their chains run side by side on two streams, so their
    kernels interleave; position 0's last layer ends at its attention, position 1 ends at its
    draw); then per position from 2 on a layer's norm_in / qkv / attention / wo / norm_post /
    gate_up / down (layer 0 starts at its attention: the draw gathered its QKV rows) and the
    final norm, the head and the draw."""
    layer = ["norm_in", "qkv", "attention", "wo", "norm_post", "gate_up", "down"]
    head = ["norm_final", "heads", "draw"]
    cut = len(layer) - layer.index("attention") - 1  # position 0's last layer after attention
    prefill = 2 * cfg.layers * len(layer) - cut + len(head)
    roles = ["input_proj"] * input_proj + ["prefill"] * prefill
    for _ in range(2, cfg.positions):
        roles += layer[layer.index("attention"):] + layer * (cfg.layers - 1) + head
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--graph", action="store_true", help="profile a replay of the captured frame")
    ap.add_argument("--variant", default="", help="FrameVariant knobs (as ab_frame's)")
    ap.add_argument("--tag", default="", help="suffix of the JSON file's name (with --graph)")
    args = ap.parse_args()
    try:
        variant = frame_variant(args.variant)
    except ValueError as e:
        ap.error(str(e))
    print(provenance_line({"weights": 0}), flush=True)
    w = random_weights(seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    report = {}
    for R in args.rows:
        h = torch.randn(R, 2048, device="cuda").to(torch.bfloat16)
        g0 = torch.randint(0, 2048, (R,), device="cuda")
        fl = FastLoop(fw, R, Sampler(R, seeds=list(range(R)), device="cuda"),
                      graph=args.graph, plan=variant_plan(R, variant))
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
        print(f"R={R} ({fl.run_rows} kernel rows, parts {fl.plan.parts or 'none'}, "
              f"{'graph' if args.graph else 'eager'}): {len(ev)} kernels per frame, "
              f"{tot:.0f} us of kernel time")
        if not args.graph:
            by = {}
            for e in ev:
                n, t = by.get(e.name[:70], (0, 0.0))
                by[e.name[:70]] = (n + 1, t + e.device_time)
            for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:14]:
                print(f"  {t:8.0f} us  {n:4d}x  {k}")
            continue
        spans = [(kernel_kind(e.name), e.time_range.start, e.time_range.end) for e in ev]
        if not (fl.plan.gemv or fl.plan.parts):
            spans = label_roles(spans, frame_roles(fw.config, fl.plan.input_proj == "skinny"))
        rows = end_increments(spans)
        span = max(s[2] for s in spans) - min(s[1] for s in spans)
        print(f"  span {span:.0f} us; by how much each kind moved the frame's end:")
        for kind, r in sorted(rows.items(), key=lambda kv: -kv[1]["moved"]):
            print(f"  {r['moved']:8.0f} us moved  {r['own']:8.0f} us own  {r['count']:4d}x  "
                  f"{kind}  ({r['moved'] / r['count']:.2f} us each)")
        report[str(R)] = {"span_us": span, "kinds": rows}
    if args.graph:
        name = f"fast-loop-profile{'-' + args.tag if args.tag else ''}"
        if (results_dir() / f"{name}.json").exists():
            raise SystemExit(f"{results_dir() / name}.json exists: pass another --tag")
        out = write_record(name, {"variant": args.variant, "rows": report},
                           seeds={"weights": 0})
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
