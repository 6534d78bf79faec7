"""Per-phase trace of the fast loop's 15 draws inside the captured frame: ``--rows 64
[--variant draw_noise=inline] [--label inline]`` -> results/draw-trace-<rows>[-<label>].json
and a table.

Each draw's CTAs stamp %globaltimer at kernels.depth_sampler.DRAW_TRACE_POINTS (entry, wait_done,
logits, selected, drawn, gathered); per draw, the medians over rows of each phase (the time from
the previous point), how long the CTAs were resident before their release (entry -> wait_done),
and the span from the first release to the last row's gathers (the draw's share of the frame's
critical path, notes/fast-loop.md "Next session (after session 8)", item 2).
"""
import argparse
import json
import os

import torch

from kernels.depth_sampler import DRAW_TRACE_POINTS
from models.codepredictor import random_weights
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
from scripts.ab_frame import parse_variant
from workbench.results import provenance, provenance_line


def phase_summary(stamps: torch.Tensor) -> dict:
    """stamps int64 [draws, rows, points] (ns) -> per draw: median µs of each phase over rows,
    the residency before release, and the span from the first release to the last stamp."""
    t = stamps.double() / 1e3
    phases = t.diff(dim=2)  # [draws, rows, points - 1]
    out = []
    for d in range(t.shape[0]):
        med = phases[d].median(dim=0).values
        out.append({"resident_before_release_us": float(med[0]),
                    **{f"{DRAW_TRACE_POINTS[i + 1]}_us": float(med[i])
                       for i in range(1, len(DRAW_TRACE_POINTS) - 1)},
                    "span_us": float(t[d, :, -1].max() - t[d, :, 1].min())})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--variant", default="", help="FastLoop keyword arguments, as ab_frame's")
    ap.add_argument("--label", default="", help="suffix of the JSON file's name")
    args = ap.parse_args()
    print(provenance_line({"weights": 0}), flush=True)
    w = random_weights(seed=0, dtype=torch.bfloat16).to(device="cuda")
    R = args.rows
    g = torch.Generator(device="cuda").manual_seed(R)
    h = torch.randn(R, w.config.talker_hidden, device="cuda", generator=g).to(torch.bfloat16)
    g0 = torch.randint(0, 2048, (R,), device="cuda", generator=g)
    fl = FastLoop(FastWeights(w), R, Sampler(R, seeds=list(range(R)), device="cuda"), parts=(),
                  draw_trace=True, **parse_variant(args.variant))
    for _ in range(3):
        fl(h, g0)
    torch.cuda.synchronize()
    rows = phase_summary(fl.draw_traces[:, :R])
    names = [k for k in rows[0]]
    print("draw  " + "  ".join(f"{n[:-3]:>12}" for n in names))
    for d, r in enumerate(rows):
        print(f"{d:4d}  " + "  ".join(f"{r[n]:12.2f}" for n in names))
    med = {n: sorted(r[n] for r in rows)[len(rows) // 2] for n in names}
    print("median " + "  ".join(f"{n[:-3]}={v:.2f}" for n, v in med.items()))
    out = os.path.join(os.environ.get("WB_RESULTS_DIR", "results"),
                       f"draw-trace-{R}{'-' + args.label if args.label else ''}.json")
    if os.path.exists(out):
        raise SystemExit(f"{out} exists: move it first")
    with open(out, "w") as f:
        json.dump({"provenance": provenance(), "rows": R, "variant": args.variant,
                   "points": DRAW_TRACE_POINTS, "draws": rows, "median": med}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
