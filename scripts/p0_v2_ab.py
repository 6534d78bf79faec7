"""A/B of P0's two designs on the H200: ``p0`` (both operands expanded to f16 in smem per tile)
against ``swap_ab`` (weights as register-sourced wgmma A from the register-order prepack,
activations expanded once per CTA tile), beside cuBLAS bf16 on the dequantized operands.

    python3 scripts/p0_v2_ab.py [--quick] [--ms M ...] [--ablations] [--out DIR]

Per H3 projection and M: every config's output checked on 32 sampled rows against the exact
oracle (fp32 bound) and a rerun bit-identical; then CUDA-graph medians with operand sets rotated
past L2. The swap_ab configs vary the K split (small M; the CTA pairs sharing the activation's
TMA that v6 compared, ``mc2``, lost and left the code). Ablations of swap_ab (no activation expansion, no wgmma) say
which half limits it. Writes
``p0-v2-ab.json`` (provenance, all rows) under --out or $WB_RESULTS_DIR and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from configs.arch import K_BLOCK
from kernels.nvfp4.gemm import default_config, gemm_nvfp4
from kernels.nvfp4.gemm_shell import P0Variant, SwapAbStudy
from kernels.nvfp4.prepack import prepack
from numerics import gemm_oracle as G
from numerics import nvfp4
from validators.gemm_operands import make_operand
from workbench.timing import bench, rotation_count

PROJECTIONS = {"qkv": (21504, 5376), "out": (5376, 5376), "fc1": (14336, 5376),
               "fc2": (5376, 14336), "wide": (7168, 5376)}


def _operands(M, N, K, seed):
    """((a_q, a_s, g_a), (b_q, b_s, g_b), the weight's prepack); g as fp32 device tensors, so
    that a captured call copies nothing from the host."""
    a = make_operand("normal", M, K, seed, "cuda")
    b = make_operand("normal", N, K, seed + 1, "cuda")
    g = [torch.tensor([float(x[2])], dtype=torch.float32, device="cuda") for x in (a, b)]
    return (a[0], a[1], g[0]), (b[0], b[1], g[1]), prepack(b[0], b[1])


def _configs(M, N, K, args):
    """(label, config): P0's design as the chooser builds it, the chooser's pick with the
    prepack, and the swap-AB design per K split."""
    out = [("p0 default", default_config(M, N, K)),
           ("chosen", default_config(M, N, K, prepacked=True))]
    tiles = -(-M // 128) * -(-N // 128)
    kb = -(-K // K_BLOCK)
    splits = sorted({1, *[s for s in (2, 3, 4) if tiles * s <= 2 * 132 and kb // s >= 8]})
    if M > 1024:
        splits = [1]
    for sp in splits:
        out.append((f"swap_ab s{sp} mc1", SwapAbStudy(tokens=128, stages=8, splits=sp).build()))
    if args.ablations:
        sp = max(splits)
        for name, v in (("no expand", P0Variant(skip_dequant=True)),
                        ("no mma", P0Variant(skip_mma=True))):
            out.append((f"swap_ab s{sp} mc1 {name}",
                        SwapAbStudy(tokens=128, splits=sp, variant=v).build()))
    return out


def _check(cfg, a, b, pre, M, N, K, seed):
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, out=out, config=cfg, prepacked=pre)
    again = gemm_nvfp4(*a, *b, config=cfg, prepacked=pre)
    same = bool(torch.equal(out.view(torch.int16), again.view(torch.int16)))
    rows = torch.randperm(M, generator=torch.Generator().manual_seed(seed))[:32].sort().values
    d, real, bound = G.reference_gemm(a[0], a[1], b[0], b[1], float(a[2]), float(b[2]), M, N,
                                      K, row_ids=rows.cuda())
    got = out[rows.cuda()].double()
    return {"within_bound": bool(((got - real).abs() <= bound).all()),
            "exact_fraction": float((got == d.double()).float().mean()),
            "rerun_identical": same}, out


def run(args) -> list:
    ms = args.ms or ([128, 2048] if args.quick else [128, 512, 2048, 8192])
    rows = []
    for M in ms:
        for name, (N, K) in PROJECTIONS.items():
            if args.quick and name == "wide":
                continue
            t0 = time.time()
            per_set = (M + N) * (K // 2 + K // 16)
            sets = rotation_count(per_set, factor=2.0, cap=4)
            ops = [_operands(M, N, K, 100 * i + M + N) for i in range(sets)]
            a, b, pre = ops[0]
            ref = None
            deq = [(nvfp4.dequantize(o[0][0], o[0][1], float(o[0][2]), (M, K)),
                    nvfp4.dequantize(o[1][0], o[1][1], float(o[1][2]), (N, K))) for o in ops]
            t_ref = bench(lambda x, w: torch.nn.functional.linear(x, w), deq, graph=True,
                          warmup_ms=10, rep_ms=60 if args.quick else 150).as_dict()
            del deq
            out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            for label, cfg in _configs(M, N, K, args):
                row = {"projection": name, "M": M, "N": N, "K": K, "config": label,
                       "describe": cfg.describe(), "cublas_bf16_us": t_ref["median_us"]}
                try:
                    if cfg.variant is None:  # a measurement build's bits are wrong by design
                        chk, y = _check(cfg, a, b, pre, M, N, K, seed=M + N)
                        row.update(chk)
                        if ref is None:
                            ref = y
                        row["equal_to_p0_default"] = bool(torch.equal(
                            y.view(torch.int16), ref.view(torch.int16)))
                    t = bench(lambda a, b, pre, cfg=cfg: gemm_nvfp4(
                        *a, *b, out=out, config=cfg, prepacked=pre), ops, graph=True,
                        warmup_ms=10, rep_ms=60 if args.quick else 150).as_dict()
                    row["timing"] = t
                    row["us"] = t["median_us"]
                    row["over_cublas_bf16"] = t_ref["median_us"] / t["median_us"]
                except Exception as e:  # a config that fails is a row, not a crash
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                rows.append(row)
                print(f"{name:>5} M={M:<5} {label:<26} "
                      + (f"{row['us']:8.1f} us  x{row['over_cublas_bf16']:.2f} of cuBLAS "
                         f"({t_ref['median_us']:.1f})  bound={row.get('within_bound')} "
                         f"rerun={row.get('rerun_identical')}" if "us" in row
                         else row.get("error", "?")), flush=True)
            del ops
            torch.cuda.empty_cache()
            print(f"   ({time.time() - t0:.0f} s)", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="M = 128 and 2048, 4 projections")
    p.add_argument("--ms", type=int, nargs="+", default=None, help="the M values to run")
    p.add_argument("--ablations", action="store_true",
                   help="also time swap-AB without its activation expansion / its wgmmas")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("p0_v2_ab: needs the H200", file=sys.stderr)
        return 2
    out_dir = args.out or Path(os.environ.get("WB_RESULTS_DIR", "."))
    if (out_dir / "p0-v2-ab.json").exists():  # refuse before the run, not after it
        print(f"p0_v2_ab: {out_dir / 'p0-v2-ab.json'} exists; not overwritten", file=sys.stderr)
        return 1
    rows = run(args)
    out_dir.mkdir(parents=True, exist_ok=True)
    prov = {"commit": os.environ.get("WB_GIT_COMMIT", "unknown")[:7],
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python3 scripts/p0_v2_ab.py " + " ".join(argv or sys.argv[1:])}
    path = out_dir / "p0-v2-ab.json"
    if path.exists():
        print(f"p0_v2_ab: {path} exists; not overwritten", file=sys.stderr)
        return 1
    path.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
