"""Host time per eager call of the NVFP4 entry points, against their targets (GPU only).

What is timed: the host's share of one eager call (argument checks, the TVM-FFI dispatch, the
launch) at tiny shapes, where the GPU work (~5 µs a call) never binds: ``calls`` calls back to
back, timed in chunks of CHUNK with the device drained between chunks (so no chunk waits on a
full launch queue), the median chunk's µs per call. Targets (the gates): amax into an
AmaxWorkspace and quantize_nvfp4 into given buffers <= 10 µs, gemm_nvfp4 into a given output
<= 10 µs (the production call: the weight's prepack and the activation's f16 expansion given,
as Nvfp4Linear passes them; without them gemm_nvfp4 expands and prepacks per call, a
convenience this row does not time), Nvfp4Linear.__call__ on p0 (amax + quantize + GEMM,
allocating its output) <= 30 µs.
Reported beside them, not gated: amax and quantize_nvfp4 allocating their outputs, the amax
launch alone (AmaxRunner), and every call's figure on the pointer path (the launch path before
TVM-FFI). Every case repeats one signature, so after the warmup each entry takes its fast path
(checks cached per signature, alignment checked per call).

Host time moves with the host's load: a busy machine misses the targets that a quiet one meets,
which is why these figures live in a summary with gates and not in a test's assertions.
``--quick``: fewer calls a case (QUICK_CALLS), the same cases and gates.
"""
from __future__ import annotations

import statistics
import time

import torch

from device import ffi
from experiments._common import need_gpu, parser, progress, run_main
from kernels.nvfp4.amax import AmaxRunner, AmaxWorkspace, amax
from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import expand_nvfp4, quantize_nvfp4
from models.nvfp4_linear import Nvfp4Linear, p0_unavailable_reason
from numerics import nvfp4
from validators.gemm_operands import make_operand
from workbench import WorkbenchError
from workbench import results as R

CALLS, QUICK_CALLS = 2000, 400  # timed calls a case (the pointer path: a fifth of them)
CHUNK = 100  # calls between device drains: 100 x (a few launches) stays under the launch queue
WARMUP = 50
M, N, K = 128, 256, 256  # tiny: GPU work ~5 µs a call, so host time is what shows
TARGETS_US = {"amax(x, out=)": 10.0, "quantize_nvfp4(x, g, out=)": 10.0,
              "gemm_nvfp4(out=)": 10.0, "Nvfp4Linear.__call__ (p0)": 30.0}
NOTES = {
    "prediction": "fast path (signature caches, g written by the amax kernel): amax(x, out=) "
                  "7-9 µs, quantize_nvfp4(x, g, out=) 9-12 µs, gemm_nvfp4(out=) 11-14 µs, "
                  "Nvfp4Linear.__call__ (p0) 24-30 µs (notes/p0-gemm.md, 'Host time per "
                  "eager call'). Before it (841dde6): 30.5 (amax allocating), 17.2, 22.5, 183.6.",
}


def host_us_per_call(fn, calls: int) -> dict:
    """Host µs per call of ``fn()``: WARMUP untimed calls, then ``calls`` calls in chunks of
    CHUNK, the device drained after each chunk; the chunks' median, min and max."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    chunks = []
    for _ in range(max(1, calls // CHUNK)):
        t0 = time.perf_counter()
        for _ in range(CHUNK):
            fn()
        chunks.append((time.perf_counter() - t0) / CHUNK * 1e6)
        torch.cuda.synchronize()
    return {"median_us": round(statistics.median(chunks), 2), "min_us": round(min(chunks), 2),
            "max_us": round(max(chunks), 2), "calls": CHUNK * len(chunks), "chunk": CHUNK}


def _cases():
    """call name -> make(): the call to time, made under the host path in force (a bound
    launcher such as AmaxRunner's keeps the path it was made under); tensors made once."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, K, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    g = nvfp4.global_scale(x).reshape(1)
    q = torch.empty(M, K // 2, dtype=torch.uint8, device="cuda")
    s = torch.empty(nvfp4.scale_shape(M, K), dtype=torch.uint8, device="cuda")
    a, b = make_operand("normal", M, K, 1, "cuda"), make_operand("normal", N, K, 2, "cuda")
    ga, gb = (torch.tensor([o[2]], dtype=torch.float32, device="cuda") for o in (a, b))
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    pre, a16 = prepack(b[0], b[1]), expand_nvfp4(a[0], a[1])  # as Nvfp4Linear holds them
    w = (torch.randn(N, K, device="cuda", generator=gen) / K**0.5).to(torch.bfloat16)
    linear = Nvfp4Linear(w, backend="p0")
    ws = AmaxWorkspace(x.dtype, "cuda")
    calls = {"amax(x, out=)": lambda: amax(x, out=ws),
             "amax(x) allocating": lambda: amax(x),
             "quantize_nvfp4(x, g, out=)": lambda: quantize_nvfp4(x, g, out=(q, s)),
             "quantize_nvfp4(x, g) allocating": lambda: quantize_nvfp4(x, g),
             "gemm_nvfp4(out=)": lambda: gemm_nvfp4(a[0], a[1], ga, b[0], b[1], gb, out=out,
                                                    prepacked=pre, a16=a16),
             "Nvfp4Linear.__call__ (p0)": lambda: linear(x)}
    cases = {name: (lambda fn=fn: fn) for name, fn in calls.items()}
    cases["amax launch alone (AmaxRunner)"] = lambda: AmaxRunner(x).launch
    return cases


def main(argv=None) -> int:
    return run_main(_main, argv)


def _main(argv) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    need_gpu("host-overhead")
    reason = p0_unavailable_reason()
    if reason:
        raise WorkbenchError(f"experiment 'host-overhead': {reason}")
    ffi.require()
    calls = QUICK_CALLS if args.quick else CALLS
    pointer_calls = max(CHUNK, calls // 5)  # the slow path: fewer calls, one chunk at least
    cases = _cases()
    rows, gates, headline = [], {}, {}
    for name, make in cases.items():
        progress(f"{name}: {calls} calls on {ffi.path()}")
        fast = host_us_per_call(make(), calls)
        with ffi.pointer_path():
            progress(f"{name}: {pointer_calls} calls on the pointer path")
            slow = host_us_per_call(make(), pointer_calls)
        target = TARGETS_US.get(name)  # None: reported, not gated
        rows.append({"call": name, "path": ffi.path(), "host": fast, "pointer_path": slow,
                     "target_us": target})
        headline[name] = fast["median_us"]
        headline[f"{name} pointer path"] = slow["median_us"]
        if target is not None:
            gates[f"{name}<={target:g}us"] = R.gate(
                fast["median_us"] <= target, f"{fast['median_us']:.1f} µs per call (chunks "
                f"{fast['min_us']:.1f}-{fast['max_us']:.1f}); pointer path "
                f"{slow['median_us']:.1f}")
    summary = R.make_summary(
        "host-overhead",
        parameters={"shape": {"M": M, "N": N, "K": K}, "calls": calls, "chunk": CHUNK,
                    "warmup": WARMUP, "targets_us": TARGETS_US, "host_path": ffi.path(),
                    "timing": "host perf_counter over chunks of back-to-back eager calls, "
                              "the device drained between chunks; the median chunk"},
        measurements=rows, headline=headline, gates=gates,
        quick=f"{calls} of {CALLS} calls a case" if args.quick else None,
        notes=dict(NOTES, outcome="; ".join(
            f"{r['call']} {r['host']['median_us']:.1f} µs"
            + (f" (target {r['target_us']:g})" if r["target_us"] else "") for r in rows)))
    path = R.write(summary, args.results_dir)
    print(R.format_table([[r["call"], r["host"]["median_us"], r["target_us"] or "-",
                           r["pointer_path"]["median_us"]] for r in rows],
                         ["call", "host_us", "target_us", "pointer_us"]))
    print(f"wrote {path}")
    return 0 if summary["verdict"] == "pass" else 1


if __name__ == "__main__":
    raise SystemExit(main())
