"""Measured ceilings of this GPU: copy, read and write bandwidth, and the bf16 matrix rate.

METHOD: measure the two ceilings once on the device and judge kernels against those, not the
datasheet. Copy counts bytes read + written (torch ``copy_``), read is a full-tensor sum, write is
``fill_``; each at several sizes well past the 60 MB L2, timed by CUDA-graph replay. The matrix
rate is a bf16 8192³ ``torch.mm`` on random normal data (random data draws more power than zeros).
"""
from __future__ import annotations

import torch

from experiments._common import need_gpu, parser, progress, run_main
from workbench import results as R
from workbench.timing import COPY_CEILING_BPS, bench

SIZES_MB = (256, 1024, 4096)


def main(argv=None) -> int:
    return run_main(_main, argv)


def _main(argv) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    need_gpu("ceilings")
    rows = []
    for mb in SIZES_MB[:2] if args.quick else SIZES_MB:
        n = mb * 2**20 // 2
        a = torch.randn(n, device="cuda").to(torch.bfloat16)
        b = torch.empty_like(a)
        t_copy = bench(lambda: b.copy_(a), graph=True)
        t_read = bench(lambda: a.sum(dtype=torch.float32), graph=True)
        t_write = bench(lambda: b.fill_(1.0), graph=True)
        row = {"mbytes": mb,
               "copy_tbps": 2 * n * 2 / t_copy.median_us / 1e6,
               "read_tbps": n * 2 / t_read.median_us / 1e6,
               "write_tbps": n * 2 / t_write.median_us / 1e6,
               "copy": t_copy.as_dict(), "read": t_read.as_dict(), "write": t_write.as_dict()}
        rows.append(row)
        progress(f"{mb} MB: copy {row['copy_tbps']:.2f}, read {row['read_tbps']:.2f}, "
                 f"write {row['write_tbps']:.2f} TB/s")
        del a, b
        torch.cuda.empty_cache()
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_mm = bench(lambda: x @ y, graph=True, calls_per_graph=5)
    tflops = 2 * 8192**3 / t_mm.median_us / 1e6
    best_copy = max(r["copy_tbps"] for r in rows)
    headline = {"copy_tbps": round(best_copy, 3),
                "read_tbps": round(max(r["read_tbps"] for r in rows), 3),
                "write_tbps": round(max(r["write_tbps"] for r in rows), 3),
                "bf16_mm_tflops": round(tflops, 1)}
    gates = {"copy_within_10pct_of_anchor": R.gate(
        abs(best_copy * 1e12 - COPY_CEILING_BPS) / COPY_CEILING_BPS < 0.1,
        f"{best_copy:.2f} TB/s vs the 4.24 TB/s anchor")}
    summary = R.make_summary("ceilings", parameters={"sizes_mb": list(SIZES_MB)},
                             measurements=rows + [{"bf16_mm_8192": t_mm.as_dict(),
                                                   "tflops": tflops}],
                             headline=headline, gates=gates)
    path = R.write(summary, args.results_dir)
    print(R.format_table([[r["mbytes"], r["copy_tbps"], r["read_tbps"], r["write_tbps"]]
                          for r in rows], ["MB", "copy TB/s", "read TB/s", "write TB/s"]))
    print(f"bf16 mm 8192^3: {tflops:.0f} TFLOP/s; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
