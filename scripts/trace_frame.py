"""Per-phase traces of one kind of the fast loop's kernels inside the captured frame:
``--kernel draw|attention --rows 64 [--variant pdl=False] [--label nopdl]`` (one chain unless
the variant, a schedules.plan_variant.FrameVariant's knobs, names parts) ->
the record <kernel>-trace-<rows>[-<label>].json (workbench.results.write_record: into the run
folder or $WB_RESULTS_DIR) and a table.

Traced builds stamp %globaltimer from thread 0 of each CTA: the draws at
kernels.depth.draw.DRAW_TRACE_POINTS (entry, wait_done, logits, selected, drawn, gathered),
one CTA a row; the attention steps at kernels.depth.attention.ATTN_TRACE_POINTS (entry,
wait_done, normed, rotated, scored, softmaxed, stored), one CTA a (row, kv head). Per launch:
the medians over its CTAs of each phase (the time from the previous point), how long the CTAs
were resident before their release (entry -> wait_done), and the span from the first release
to the last CTA's last stamp (the launch's share of the frame's critical path).
"""
import argparse

import torch

from kernels.depth.attention import ATTN_TRACE_POINTS
from kernels.depth.draw import DRAW_TRACE_POINTS
from models.codepredictor import random_weights
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
from schedules.plan_variant import variant_plan
from scripts.ab_frame import frame_variant
from workbench.results import provenance_line, results_dir, write_record


def phase_summary(stamps: torch.Tensor, points=DRAW_TRACE_POINTS) -> list:
    """stamps int64 [launches, CTAs, points] (ns; points named by ``points``, the first two
    entry and wait_done) -> per launch: median µs of each phase over its CTAs, the residency
    before release, and the span from the first release to the last stamp."""
    t = stamps.double() / 1e3
    phases = t.diff(dim=2)  # [launches, CTAs, points - 1]
    out = []
    for d in range(t.shape[0]):
        med = phases[d].median(dim=0).values
        out.append({"resident_before_release_us": float(med[0]),
                    **{f"{points[i + 1]}_us": float(med[i]) for i in range(1, len(points) - 1)},
                    "span_us": float(t[d, :, -1].max() - t[d, :, 1].min())})
    return out


def cta_spread(stamps: torch.Tensor, points) -> dict:
    """One launch's stamps [CTAs, points] (ns) -> quantiles (0, 10, 50, 90, 100 %) over its
    CTAs of each point's time (µs) after the first CTA's release: whether the span comes from
    CTAs that became resident late, were released late, or ran long."""
    t = (stamps.double() - stamps[:, 1].min().double()) / 1e3
    q = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64, device=t.device)
    return {name: [round(float(v), 3) for v in torch.quantile(t[:, i], q)]
            for i, name in enumerate(points)}


def traced_stamps(fl: FastLoop, kernel: str, rows: int):
    """The loop's stamps of ``kernel`` as [launches, CTAs, points] over the real rows, and the
    names of the points."""
    if kernel == "draw":
        return fl.draw_traces[:, :rows], DRAW_TRACE_POINTS
    t = fl.attn_traces[:, :, :rows]  # [positions, layers, rows, kv heads, points]
    return t.reshape(t.shape[0] * t.shape[1], -1, t.shape[-1]), ATTN_TRACE_POINTS


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("draw", "attention"), default="draw")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--variant", default="", help="FrameVariant knobs, as ab_frame's")
    ap.add_argument("--label", default="", help="suffix of the JSON file's name")
    ap.add_argument("--spread", type=int, nargs="*", default=[],
                    help="launches whose per-CTA quantiles to print and keep (cta_spread)")
    args = ap.parse_args()
    trace = {"draw_trace": True} if args.kernel == "draw" else {"attn_trace": True}
    try:
        variant = frame_variant(args.variant, parts=(), **trace)
    except ValueError as e:
        ap.error(str(e))
    R = args.rows
    name = f"{args.kernel}-trace-{R}{'-' + args.label if args.label else ''}"
    if (results_dir() / f"{name}.json").exists():
        raise SystemExit(f"{results_dir() / name}.json exists: pass another --label")
    print(provenance_line({"weights": 0}), flush=True)
    w = random_weights(seed=0, dtype=torch.bfloat16).to(device="cuda")
    g = torch.Generator(device="cuda").manual_seed(R)
    h = torch.randn(R, w.config.talker_hidden, device="cuda", generator=g).to(torch.bfloat16)
    g0 = torch.randint(0, 2048, (R,), device="cuda", generator=g)
    fl = FastLoop(FastWeights(w), R, Sampler(R, seeds=list(range(R)), device="cuda"),
                  plan=variant_plan(R, variant))
    for _ in range(3):
        fl(h, g0)
    torch.cuda.synchronize()
    stamps, points = traced_stamps(fl, args.kernel, R)
    launches = phase_summary(stamps, points)
    names = list(launches[0])
    print("launch  " + "  ".join(f"{n[:-3]:>12}" for n in names))
    for d, r in enumerate(launches):
        print(f"{d:6d}  " + "  ".join(f"{r[n]:12.2f}" for n in names))
    med = {n: sorted(r[n] for r in launches)[len(launches) // 2] for n in names}
    print("median " + "  ".join(f"{n[:-3]}={v:.2f}" for n, v in med.items()))
    spread = {}
    for d in args.spread:
        spread[d] = cta_spread(stamps[d], points)
        print(f"launch {d}, µs after the first release, CTA quantiles 0/10/50/90/100 %:")
        for point, qs in spread[d].items():  # not ``name``: the record's
            print(f"  {point:>10}  " + "  ".join(f"{v:7.2f}" for v in qs))
    out = write_record(name, {"kernel": args.kernel, "rows": R, "variant": args.variant,
                              "points": points, "launches": launches, "median": med,
                              "cta_spread": spread}, seeds={"weights": 0})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
