"""Times the skinny projection (kernels/depth/gemm_skinny.py) over the loop's shapes, row counts and
K-slice counts, each in a CUDA graph of back-to-back launches with the weights rotated beyond L2
(as scripts/bench_depth_kernels.py); cuBLAS on the same shapes in the same run. Prints a table
(projection, rows, splits, warps, m_split, µs, cuBLAS µs, TB/s of weights) and writes the
summary ``skinny-sweep.json`` (headline: the best µs per projection and rows, and cuBLAS over
it) into the run folder or ``$WB_RESULTS_DIR``, through the workbench writer.

    python3 scripts/sweep_skinny.py --rows 16 64 128 --splits 0 8 --warps 4 8
"""
import argparse
import itertools

import torch

from kernels.depth.gemm_skinny import MAX_SPLITS, gemm_skinny, pack_weights
from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from models.fast_loop import projection_shapes
from scripts.bench_depth_kernels import _copies, _graph_time_us
from workbench import results as R

NAMES = ("qkv", "wo", "gate_up", "down", "head")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--splits", type=int, nargs="+", default=[0],
                    help="K slices per tile (0: the kernel's default)")
    ap.add_argument("--warps", type=int, nargs="+", default=[0],
                    help="warps per CTA, 4 or 8 (0: the kernel's default, tile_warps)")
    ap.add_argument("--m-split", type=int, nargs="+", default=[0],
                    help="warps per 16 weight rows, each taking that share of the a rows (0: "
                    "the kernel's default, warps_per_group)")
    ap.add_argument("--no-pdl", action="store_true")
    args = ap.parse_args()
    rows_out = []
    for name, (n, k, swiglu) in zip(NAMES, projection_shapes(CFG)):
        wn = 2 * n if swiglu else n
        ws = [pack_weights(t, swiglu) for t in _copies((wn, k), wn * k * 2)]
        for M in args.rows:
            a = torch.randn(M, k, device="cuda").to(torch.bfloat16)
            out = torch.empty(M, n, device="cuda", dtype=torch.bfloat16)
            cublas = _graph_time_us(lambda i: a @ ws[i % len(ws)].data.t())
            for sp, wp, ms in itertools.product(args.splits, args.warps, args.m_split):
                if sp and (sp > MAX_SPLITS or k % (128 * sp)):
                    continue
                us = _graph_time_us(lambda i, sp=sp, wp=wp, ms=ms: gemm_skinny(
                    a, ws[i % len(ws)], out, swiglu=swiglu, pdl=not args.no_pdl,
                    splits=sp or None, warps=wp or None, m_split=ms or None))
                rows_out.append({"proj": name, "rows": M, "splits": sp, "warps": wp,
                                 "m_split": ms, "us": us, "cublas_us": cublas,
                                 "tbps": wn * k * 2 / us / 1e6})
                print(f"{name:8} {M:4} {sp:3} {wp:2} {ms} {us:7.2f} {cublas:7.2f} "
                      f"{rows_out[-1]['tbps']:5.2f}", flush=True)
    write_summary(args, rows_out)


def write_summary(args, rows_out: list[dict]) -> None:
    """The sweep as a results summary: no gates (a measurement, verdict 'not-run'), the best
    configuration per projection and row count as the headline."""
    if not rows_out:
        raise SystemExit("sweep_skinny: no (splits, K) combination was valid: nothing measured")
    best: dict[str, dict] = {}
    for r in rows_out:
        key = f"{r['proj']}@{r['rows']}"
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    summary = R.make_summary(
        "skinny-sweep", parameters=dict(vars(args)), measurements=rows_out,
        headline={"best_us": {k: round(r["us"], 2) for k, r in best.items()},
                  "cublas_over_best": {k: round(r["cublas_us"] / r["us"], 3)
                                       for k, r in best.items()}},
        gates={})
    print(f"wrote {R.write(summary)}")


if __name__ == "__main__":
    main()
