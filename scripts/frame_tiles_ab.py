"""A/B of the depth frame's projection-tile knobs (experiments._frame_studies.TileStudy) on the
H200, in the projection study (random weights, attention and embedding tasks wait and signal
only).

    python3 scripts/frame_tiles_ab.py [--rows R ...] [--quick] [--out DIR]

Per row count and variant: the outputs checked against float64 within the derived bound,
a CUDA-graph median of the frame, and one traced run's critical chain split (handoff, stage-0
landing, compute, epilogue, signal) with the per-type medians. Variants, all on the plan's
ring of 16 KB pages (schedules.plan.FRAME_RING): the plan's (K stages by
schedules.plan.frame_k_stage), K stages of 256 ("b2_p16k"), two ablations of the plan's (no wgmma;
no wait for the weight pages: timing only, though its outputs can come out right where a tile
lands on the same pages at every position; it also lets the loader re-arm a page's barrier
while that page's copy may still be in flight, so its times are an estimate), and K stages of
512 (rows <= 32: their buffers do not fit at 64). The variants that lost their A/B (4 KB pages,
as many activation buffers as fit, every thread waiting for a stage, two accumulator chains)
left the code; their record is in notes/depth-frame.md and results/logs/. Writes
``frame-tiles-ab.json`` (provenance, all rows) under --out or $WB_RESULTS_DIR and prints a
table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from experiments.frame_protocol import _tile_times, critical_chain
from experiments._frame_studies import ProjectionStudy, TileStudy, TileStudyKernel, TileStudyRun
from kernels.depth.frame import FrameBuild
from schedules.depth_frame import FrameOptions, build
from schedules.plan import FRAME_RING
from workbench.timing import bench

# (tile knobs, the schedule's ring: pages x bytes)
RING = (FRAME_RING["ring_pages"], FRAME_RING["page_bytes"])
VARIANTS = {"plan": (TileStudy(), RING),  # schedules.plan.frame_k_stage
            "b2_p16k": (TileStudy(k_stage=256), RING),
            "p16k_no_mma": (TileStudy(ablate="no_mma"), RING),
            "p16k_no_page_wait": (TileStudy(ablate="no_page_wait"), RING),
            "p16k_k512": (TileStudy(k_stage=512), RING)}


def _fits(rows: int, variant) -> str | None:
    """Why the kernel refuses this variant at ``rows`` (None: it builds)."""
    study, (pages, page_bytes) = variant
    try:
        TileStudyKernel(FrameBuild(512, 2, False, pages, page_bytes, rows=rows), study=study)
    except ValueError as e:
        return str(e)
    return None


def _row(rows: int, label: str, variant, quick: bool) -> dict:
    study, (pages, page_bytes) = variant
    s = build(options=FrameOptions(rows=rows, ring_pages=pages, page_bytes=page_bytes))
    data = ProjectionStudy(s, seed=rows)
    run = TileStudyRun(s, weights=data.packed, io=data.io(), study=study)
    run.launch()
    run.synchronize()
    checks = run.check()
    worst = data.check()
    ok = bool(worst.pop("ok"))
    t = bench(run.launch, graph=True, calls_per_graph=5, warmup_ms=20,
              rep_ms=100 if quick else 300).as_dict()
    buffers = run.kernel.act_buffers
    del run
    traced = TileStudyRun(s, trace=True, weights=data.packed, io=data.io(), study=study)
    traced.launch()
    traced.synchronize()
    stamps = traced.task_stamps()
    return {"rows": rows, "variant": label, "act_buffers": buffers, "ablate": study.ablate,
            "ring": [pages, page_bytes],
            "checks": checks, "within_bound": ok, "worst_error_ratio": max(worst.values()),
            "frame_us": t["median_us"], "timing": t, "critical_chain": critical_chain(s, stamps),
            "tile_times": _tile_times(s, stamps)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16, 64])
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=os.environ.get("WB_RESULTS_DIR", "."))
    args = p.parse_args()
    out = []
    for r in args.rows:
        for label in args.variants:
            print(f"[{time.strftime('%H:%M:%S')}] rows {r} {label}", flush=True)
            why = _fits(r, VARIANTS[label])  # e.g. K stages of 512 at 64 rows do not fit
            if why is not None:
                print(f"  refused: {why}", flush=True)
                out.append({"rows": r, "variant": label, "refused": why})
                continue
            out.append(_row(r, label, VARIANTS[label], args.quick))
            x = out[-1]
            print(f"  {x['frame_us']:.1f} us, ok {x['within_bound']} "
                  f"({x['worst_error_ratio']:.3f}), chain {x['critical_chain']}", flush=True)
    prov = {"commit": os.environ.get("WB_GIT_COMMIT", "unknown")[:7],
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(["python3", "scripts/frame_tiles_ab.py", *sys.argv[1:]])}
    path = Path(args.out) / "frame-tiles-ab.json"
    if path.exists():
        raise SystemExit(f"{path} exists: refusing to overwrite it")
    path.write_text(json.dumps({"provenance": prov, "rows": out}, indent=1))
    keys = ("handoff_us", "landing_us", "compute_us", "epilogue_us", "signal_us")
    print(f"{'rows':>4} {'variant':>16} {'buf':>3} {'frame us':>9} {'ok':>3}  "
          "chain handoff/landing/compute/epilogue/signal us")
    for x in out:
        if "refused" in x:
            print(f"{x['rows']:>4} {x['variant']:>16} refused: {x['refused']}")
            continue
        c = x["critical_chain"]
        print(f"{x['rows']:>4} {x['variant']:>16} {x['act_buffers']:>3} {x['frame_us']:>9.1f} "
              f"{'yes' if x['within_bound'] else 'NO':>3}  "
              + "/".join(f"{c[k]:.0f}" for k in keys))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
