"""External oracle: our NVFP4 quantizers against Comfy Kitchen 0.2.40 on the H200.

Compared, byte for byte, with ``comfy_kitchen.quantize_nvfp4`` (its CUDA backend, the default on
sm_90): numerics.nvfp4.quantize on CUDA (every element) and on CPU (a row slice of each tensor),
and the CuTe DSL quantize kernel when CuTe DSL is importable in the same process. Also the eager
mode against Comfy's eager backend (NaN blocks left out: their codes are undefined there), and
rung 1's hand-derived cases and sweeps run through Comfy itself, which checks the expectations,
not only the code. Only valid scale rows are compared (Comfy's kernel can write garbage into the
padded rows, nvfp4-numerics.md §1.3).

Needs the comfy archive (bash ../shared/gpu/make-archives.sh comfy) on a GPU host.
"""
from __future__ import annotations

import zlib

import torch

from experiments._common import need_gpu, parser, progress, run_main
from numerics import nvfp4
from validators import rung1_adversarial
from validators.tiles import make_tile, tensor_scale_for
from workbench import WorkbenchError
from workbench import results as R

SHAPES = [(37810, 5376), (37810, 14336), (2048, 21504)]
KINDS = ("normal", "lognormal", "ties", "special")
CPU_ROWS = 256


def _comfy():
    try:  # here, not at the top: comfy_kitchen is optional (the oracle extra, GPU host only)
        import comfy_kitchen as ck
    except ImportError as e:
        raise WorkbenchError(f"comfy_kitchen is not importable ({e}); on the GPU host unpack "
                             "the comfy archive from ../shared/gpu first") from None
    return ck


def _cmp(q_a, s_a, q_b, s_b, rows, kb):
    pq = int((q_a[:rows] != q_b[:rows]).sum())
    sa = nvfp4.from_blocked(s_a.view(torch.uint8), rows, kb)
    sb = nvfp4.from_blocked(s_b.view(torch.uint8), rows, kb)
    return pq, int((sa != sb).sum())


def main(argv=None) -> int:
    return run_main(_main, argv)


def _main(argv) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    need_gpu("numerics-comfy-parity")
    ck = _comfy()
    try:  # here, not at the top: the comparison runs without CuTe DSL (not unpacked yet)
        from kernels.nvfp4.quantize import quantize_nvfp4 as kernel
    except Exception as e:  # CuTe DSL not unpacked on this host
        kernel = None
        progress(f"CuTe DSL kernel not compared in this process: {e}")

    def comfy_q(x, g, pad_16x=True):
        q, s = ck.quantize_nvfp4(x, torch.tensor(float(g), dtype=torch.float32,
                                                 device=x.device), pad_16x=pad_16x)
        return q, s

    shapes = [(2048, 5376)] if args.quick else SHAPES
    rows_out = []
    totals = {"elements_compared": 0, "packed_mismatches": 0, "scale_mismatches": 0}
    for (M, K) in shapes:
        for kind in KINDS:
            seed = zlib.crc32(f"{M}x{K}:{kind}:{args.seed}".encode())
            x = make_tile(kind, M, K, torch.bfloat16, seed, device="cuda")
            g = tensor_scale_for(x)
            Mp = -(-M // 16) * 16
            q_c, s_c = comfy_q(x, g)
            row = {"shape": [M, K], "kind": kind, "g": g}
            q_r, s_r = nvfp4.quantize(x, g, pad_16x=True)
            row["ref_cuda"] = _cmp(q_r, s_r, q_c, s_c, Mp, K // 16)
            xs = x[:CPU_ROWS].cpu()
            q_cpu, s_cpu = nvfp4.quantize(xs, g, pad_16x=True)
            row["ref_cpu_rows"] = _cmp(q_cpu, s_cpu, q_c[:CPU_ROWS].cpu(),
                                       _first_rows_scales(s_c, CPU_ROWS, K), CPU_ROWS, K // 16)
            compared = Mp * K + CPU_ROWS * K
            if kernel is not None:
                q_k, s_k = kernel(x, torch.tensor([g], device="cuda"), pad_16x=True)
                row["cute_kernel"] = _cmp(q_k, s_k, q_c, s_c, Mp, K // 16)
                compared += Mp * K
            del q_r, s_r
            for k in ("ref_cuda", "ref_cpu_rows", "cute_kernel"):
                if k in row:
                    totals["packed_mismatches"] += row[k][0]
                    totals["scale_mismatches"] += row[k][1]
            totals["elements_compared"] += compared
            rows_out.append(row)
            progress(f"{M}x{K} {kind}: ref_cuda {row['ref_cuda']}, cpu {row['ref_cpu_rows']}, "
                     f"kernel {row.get('cute_kernel', 'n/a')}")
            torch.cuda.empty_cache()

    # eager mode vs Comfy's eager backend (finite data: NaN codes are undefined there)
    eager_bad = [0, 0]
    for kind in ("normal", "lognormal", "ties"):
        x = make_tile(kind, 1024, 4096, torch.bfloat16, 11, device="cuda")
        g = tensor_scale_for(x)
        with ck.use_backend("eager"):
            q_e, s_e = comfy_q(x, g, pad_16x=False)
        q_m, s_m = nvfp4.quantize(x, g, mode="eager")
        b = _cmp(q_m, s_m, q_e, s_e, 1024, 4096 // 16)
        eager_bad[0] += b[0]
        eager_bad[1] += b[1]
        totals["elements_compared"] += x.numel()

    # rung 1 through Comfy: the hand-derived expectations and sweeps hold for the real kernel
    progress("rung 1 cases and sweeps through Comfy Kitchen")
    rung1 = rung1_adversarial.run(quick=args.quick, device="cuda",
                                  quantize=lambda x, g: comfy_q(x, g, pad_16x=False))
    gates = {
        "packed_bytes_identical": R.gate(totals["packed_mismatches"] == 0,
                                         f"{totals['packed_mismatches']} packed bytes differ"),
        "scale_bytes_identical": R.gate(totals["scale_mismatches"] == 0,
                                        f"{totals['scale_mismatches']} valid scale bytes differ"),
        "elements>=1e8": R.gate(totals["elements_compared"] >= 1e8 or args.quick,
                                f"{totals['elements_compared']:.3g} elements compared"),
        "eager_mode_identical": R.gate(sum(eager_bad) == 0, f"{eager_bad} packed/scale bytes"),
        "rung1_through_comfy": R.gate(rung1.status == "pass", rung1.detail),
        "cute_kernel_compared": R.gate(kernel is not None, "CuTe DSL kernel compared in-process"
                                       if kernel is not None else "CuTe DSL not importable here"),
    }
    summary = R.make_summary(
        "numerics-comfy-parity",
        parameters={"shapes": shapes, "kinds": list(KINDS), "cpu_rows": CPU_ROWS,
                    "comfy_kitchen": getattr(ck, "__version__", "0.2.40")},
        measurements=rows_out + [{"eager_mode": eager_bad},
                                 {"rung1_through_comfy": rung1.checks}],
        headline=totals, gates=gates, seeds={"tiles": args.seed})
    path = R.write(summary, args.results_dir)
    print(R.format_table([[k, v] for k, v in totals.items()], ["headline", "value"]))
    print(f"wrote {path} (verdict {summary['verdict']})")
    return 0 if summary["verdict"] == "pass" else 1


def _first_rows_scales(s, rows, K):
    """The swizzled scale buffer of the first ``rows`` rows (rows a multiple of 128)."""
    kb = K // 16
    full = nvfp4.from_blocked(s.view(torch.uint8), rows, kb).cpu()
    return nvfp4.to_blocked(full)


if __name__ == "__main__":
    raise SystemExit(main())
