"""Where the host time of one planned ``Nvfp4Linear.__call__`` (p0) goes (GPU only).

experiments/host_overhead.py times whole calls against their targets; this splits the planned
call (a signature seen before: models.nvfp4_linear._P0Plan) into its steps, each timed alone
the same way (back-to-back calls in chunks, the device drained between chunks, the median
chunk): the plan key (``_p0_key``), the output's allocation, each launch through its FFI
entry as the plan makes it (amax, quantize-expand, the GEMM via ``kernels.nvfp4.gemm.launch``)
and the whole call. Steps need not add up exactly (the call interleaves them), but a step
that is most of the call is where to cut. Prints a table and writes ``host-breakdown.json``
into $WB_RESULTS_DIR (or the current folder); refuses to overwrite one.

    python3 scripts/host_breakdown.py [--calls 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from experiments.host_overhead import CHUNK, M, K, N, host_us_per_call


def _steps(calls: int) -> dict:
    from models import nvfp4_linear as L

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, K, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda", generator=gen) / K**0.5).to(torch.bfloat16)
    linear = L.Nvfp4Linear(w, backend="p0")
    for _ in range(3):  # the checked call, then the planned ones
        linear(x)
    torch.cuda.synchronize()
    key, p = linear._last
    if p is None or key != L._p0_key(x, None, None, None):
        raise SystemExit("host_breakdown: the call did not make a plan (a changed signature?)")
    ws, g = p.ws, p.gemm
    a_args = (x, *p.amax_args)
    q_args = (x, *p.q_args)
    out = torch.empty(g.r1 - g.r0, g.scalars[1], dtype=torch.bfloat16, device="cuda")
    steps = {
        "plan key (_p0_key)": lambda: L._p0_key(x, None, None, None),
        "output torch.empty": lambda: torch.empty(g.r1 - g.r0, g.scalars[1],
                                                  dtype=torch.bfloat16, device=x.device),
        "amax entry": lambda: p.amax_entry(p.amax_config, p.amax_config.key, a_args,
                                           p.amax_scalars),
        "quantize-expand entry": lambda: p.q_entry(p.q_config, p.q_key, q_args, p.q_scalars),
        "gemm launch (out given)": lambda: p.gemm_launch(
            g, p.a_q, p.a_s, ws.g, linear.w_q, linear.w_s, linear._g_w_dev, out, None, None,
            linear._w_pre, p.work, p.counters, a16=p.a16),
        "plan.launch (3 launches + output)": lambda: p.launch(
            x, linear.w_q, linear.w_s, linear._g_w_dev, linear._w_pre, None, None),
        "Nvfp4Linear.__call__ (p0)": lambda: linear(x),
    }
    return {name: host_us_per_call(fn, calls) for name, fn in steps.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_breakdown: needs the H200", file=sys.stderr)
        return 2
    path = Path(os.environ.get("WB_RESULTS_DIR", ".")) / "host-breakdown.json"
    if path.exists():  # refuse before the run, not after it
        print(f"host_breakdown: {path} exists; not overwritten", file=sys.stderr)
        return 1
    from device import ffi
    ffi.require()
    rows = _steps(max(CHUNK, args.calls))
    for name, r in rows.items():
        print(f"{name:36s} {r['median_us']:8.2f} µs  (chunks {r['min_us']:.2f}-{r['max_us']:.2f})")
    prov = {"commit": os.environ.get("WB_GIT_COMMIT", "unknown")[:7],
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python3 scripts/host_breakdown.py " + " ".join(argv or sys.argv[1:]),
            "shape": {"M": M, "N": N, "K": K}, "host_path": ffi.path()}
    path.write_text(json.dumps({"provenance": prov, "steps": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
