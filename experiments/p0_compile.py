"""P0 compile report: registers, spills, shared memory and instruction census per configuration.

Compiles every P0 configuration the entry point can choose (schedules/plan.py: the f16 builds,
the swap-AB one with 1-4 K splits and on stream-K, the 256-token one on the tile loop and on
stream-K; the p0 and packed swap-AB designs listed here before session 27 left the code) for
sm_90a without a GPU and records what ptxas produced: registers per thread at launch (65536 /
threads; setmaxnreg then moves them between the roles), stack frame and local loads (spills),
dynamic shared memory the configuration asks for, and the instructions that make the design
(wgmma shape, TMA loads, E4M3 conversions, f16 multiplies, wgmma groups kept in flight). Also
the small-M GEMV. ``--quick``: three P0 and two GEMV configurations instead of seven and five.
CPU only: these are compiler facts, not timings.
"""
from __future__ import annotations

import re

from experiments._common import parser, progress, run_main
from schedules import plan
from workbench import results as R
from workbench.compile import compile_report, ensure_arch_env

# (BlockscaledGemmSm90 builder, its keywords), as default_config builds them
_WIDE = dict(stages=plan.WIDE_F16.stages, buffers=plan.F16_BUFFERS, tokens=plan.WIDE_F16.tile_n)
_SWAP = dict(stages=plan.SWAP_AB.stages, buffers=plan.F16_BUFFERS)
P0_CONFIGS = [("wide_f16", dict(_WIDE, stream_k=sk)) for sk in (False, True)] + [
    ("swap_ab_f16", dict(_SWAP, splits=sp)) for sp in range(1, plan.MAX_SPLITS + 1)] + [
    ("swap_ab_f16", dict(_SWAP, stream_k=True))]
GEMV_CONFIGS = [(1, 1024), (8, 1024), (1, 2048), (1, 3072), (8, 3072)]
QUICK_P0 = [P0_CONFIGS[0], P0_CONFIGS[4], P0_CONFIGS[6]]  # M >= 2048; swap-AB s3; stream-K
QUICK_GEMV = [GEMV_CONFIGS[0], GEMV_CONFIGS[-1]]


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text or ""))


def _label(config: dict) -> str:
    if "tile" not in config:  # the GEMV
        return str(config)
    m, n, _ = config["tile"]
    return (f"{config['design']} {m}x{n} stages={config['stages']} splits={config['splits']}"
            + (" stream-k" if config.get("stream_k") else ""))


def main(argv=None) -> int:
    return run_main(_main, argv)


def _main(argv) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    ensure_arch_env()
    # imported only now: CuTe DSL fixes its target arch when cutlass is first imported
    from kernels.depth import gemv_small_m as GV
    from kernels.nvfp4 import gemm_shell as P0

    if args.quick:
        p0_configs, gemv_configs = QUICK_P0, QUICK_GEMV
    else:
        p0_configs, gemv_configs = P0_CONFIGS, GEMV_CONFIGS
    progress(f"{'quick: ' if args.quick else ''}{len(p0_configs)} P0 and {len(gemv_configs)} "
             "GEMV configurations")
    rows, gates = [], {}
    for build, kw in p0_configs:
        cfg = getattr(P0.BlockscaledGemmSm90, build)(**kw)
        cap = 65536 // cfg.threads // 8 * 8  # registers a thread at launch
        progress(f"P0 {build} {kw}")
        r = compile_report(cfg, *P0.compile_args())
        rows.append({"kernel": "p0", "config": cfg.describe(), "registers": r.registers,
                     "frame_bytes": r.frame_bytes, "spill_loads": r.spill_loads,
                     "smem_bytes": cfg.smem_bytes,
                     "wgmma_shape": sorted(set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", r.sass or ""))),
                     "hgmma": _count(r"\bHGMMA\b", r.sass), "tma_loads": _count(r"UTMALDG", r.sass),
                     "e4m3_to_f16x2": _count(r"F2FP\.F16\.E4M3", r.sass),
                     "hmul2": _count(r"\bHMUL2\b", r.sass),
                     # swap-AB retires each k-block's group before the next conversion
                     "wgmma_groups_in_flight": getattr(cfg.consumer, "mma_in_flight", 0),
                     "calls": _count(r"CALL\.ABS", r.sass)})
        ok = r.spill_bytes == 0 and r.registers <= cap and rows[-1]["calls"] == 0
        gates[f"p0 {build} {kw}: no spills, <= {cap} registers, no calls"] = R.gate(
            ok, f"{r.registers} registers, frame {r.frame_bytes} B, {r.spill_loads} LDL")
    for M, K in gemv_configs:
        progress(f"GEMV M={M} K={K}")
        r = compile_report(GV.GemvSmallM(M, K), *GV.compile_args(M, K))
        rows.append({"kernel": "gemv_small_m", "config": {"M": M, "K": K},
                     "registers": r.registers, "frame_bytes": r.frame_bytes,
                     "spill_loads": r.spill_loads, "ld_global_v4": r.census["ld.global.v4"]})
        gates[f"gemv M={M} K={K}: no spills"] = R.gate(r.spill_bytes == 0,
                                                        f"{r.registers} registers")
    summary = R.make_summary(
        "p0-compile", parameters={"arch": "sm_90a", "quick": args.quick,
                                  "p0_configs": p0_configs, "gemv_configs": gemv_configs},
        measurements=rows, headline={"p0_registers": {
            f"{r['config']['design']} {r['config'].get('tile')}" + (
                f" splits={r['config']['splits']}" if r["config"].get("splits", 1) > 1 else "")
            + (" stream-k" if r["config"].get("stream_k") else ""):
            r["registers"] for r in rows if r["kernel"] == "p0"}},
        gates=gates, seeds={}, notes={
            "source": "compiler output on a CPU machine (no GPU)",
            "registers": "the per-thread allocation at launch: 168 for the 256-token f16 "
                         "build (65536 / 384 threads, rounded to 8; setmaxnreg then gives the "
                         "producer warpgroup 40 and the two consumers 232: 40·128 + 232·256 = "
                         "64512), 128 for the swap-AB f16 build (512 threads; each role's "
                         "share in the config's roles)."})
    path = R.write(summary, args.results_dir)
    print(R.format_table([[r["kernel"], _label(r["config"]), r["registers"], r["frame_bytes"],
                           r["spill_loads"]] for r in rows],
                         ["kernel", "config", "regs", "frame B", "LDL"]))
    scope = "quick: a subset of the configurations" if args.quick else "all configurations"
    print(f"wrote {path} (verdict {summary['verdict']}; {scope})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
