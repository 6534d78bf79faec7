"""Issue rate of the weight-conversion instructions on one SM: F2FP (cvt e4m3x2), PRMT, LOP3, HMUL2.

P0 v3's first measurement (notes/p0-gemm.md, "conversion rates"): how many of each instruction one
SM retires per clock, so the register-A mainloop's conversion budget per wgmma is arithmetic, not
a guess. kernels/nvfp4/conversion_probe.py runs 8 independent chains of one instruction per thread,
1024 threads per CTA, one CTA per SM, timed by clock64 inside the kernel (no launch overhead in the
figure). Rate = thread-instructions / cycles, per SM; the median CTA.
"""
from __future__ import annotations

import torch

from device.runtime import cached_compile, current_stream, cute_modules, pointer_args
from experiments._common import need_gpu, parser, progress, run_main
from kernels.nvfp4.conversion_probe import CHAINS, OPS, PTRS, ConversionRateProbe
from workbench import results as R

cutlass, cute = cute_modules()

ITERS = 4096


def measure(op: str, iters: int, repeats: int) -> dict:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    probe = ConversionRateProbe(op)
    out = torch.empty(sms * probe.threads, dtype=torch.int32, device="cuda")
    cycles = torch.full((sms,), -1, dtype=torch.int64, device="cuda")
    args = pointer_args(PTRS, (out, cycles))
    compiled = cached_compile(("conversion_probe", op), lambda: cute.compile(
        probe, *args, cutlass.Int32(iters), cutlass.Int32(sms), current_stream()))
    rates = []
    for _ in range(repeats + 1):  # the first launch warms up
        cycles.fill_(-1)
        compiled(*args, cutlass.Int32(iters), cutlass.Int32(sms), current_stream())
        torch.cuda.synchronize()
        c = cycles.cpu()
        if (c <= 0).any():
            raise RuntimeError(f"{op}: a CTA wrote no cycle count")
        rates.append(probe.threads * iters * CHAINS / c.double().median().item())
    rates = sorted(rates[1:])
    lanes = OPS[op][2]
    return {"op": op, "instr_per_clk_per_sm": rates[len(rates) // 2],
            "lanes_per_clk_per_sm": rates[len(rates) // 2] * lanes,
            "spread": [rates[0], rates[-1]], "iters": iters, "ctas": sms,
            "threads": probe.threads, "chains": CHAINS}


def main(argv=None) -> int:
    return run_main(_main, argv)


def _main(argv) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    need_gpu("conversion-rate")
    iters, repeats = (ITERS // 4, 3) if args.quick else (ITERS, 7)
    rows = []
    for op in OPS:
        row = measure(op, iters, repeats)
        rows.append(row)
        progress(f"{op}: {row['instr_per_clk_per_sm']:.1f} instructions/clk/SM")
    headline = {r["op"]: round(r["instr_per_clk_per_sm"], 1) for r in rows}
    summary = R.make_summary("conversion-rate", parameters={"iters": iters, "repeats": repeats,
                                                            "quick": args.quick},
                             measurements=rows, headline=headline, gates={})
    path = R.write(summary, args.results_dir)
    print(R.format_table([[r["op"], r["instr_per_clk_per_sm"], r["lanes_per_clk_per_sm"]]
                          for r in rows], ["op", "instr/clk/SM", "lanes/clk/SM"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
