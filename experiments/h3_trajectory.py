"""The canonical H3 trajectory at full size on one backend: 12 sampler steps of the 50-block,
hidden-5376 synthetic H3 (models.h3.FULL, 37,810 tokens), every linear an Nvfp4Linear.

Records the trajectory checksum (sha256 of the final latent's bf16 bytes: the ladder's
headline, comparable between p0, p1 and p2), wall time per step, peak GPU memory, and what the
full-size ladder costs (``--reference-block``): one full-size block's exact reference forward,
the oracle of its four linears, and the block on the backend, with the estimate of rungs 3-7
they give (ladder_estimate_s; the ladder resumes over several calls: wb ladder --resume).

    python3 -m experiments.h3_trajectory [--backend p0] [--steps 12] [--reference-block]

Bytes and FLOPs per step (for the floor): 50 blocks x (4 GEMMs, 2·T·Σ N·K = 22.6 TFLOP, plus
attention 4·T²·hidden = 30.7 TFLOP) = 2.66 PFLOP a step at T = 37,810; at the measured
~0.79 PFLOP/s dense f16 wgmma rate a step cannot take less than ~3.4 s.
"""
from __future__ import annotations

import statistics
import time

import torch

from experiments._common import need_gpu, parser, progress, run_main
from models import weight_cache
from models.h3 import FULL, H3Model, checksum, initial_latent
from workbench import results as R

WGMMA_PEAK = 790e12


def _flops_per_step(cfg) -> float:
    T = cfg.tokens
    gemm = 2 * T * sum(n * k for n, k in cfg.shapes().values())
    attention = 4 * T * T * cfg.hidden
    return cfg.blocks * (gemm + attention)


def _reference_block_seconds(model) -> dict:
    """One full-size block timed the ways the ladder's rungs 3-7 pay for it: the exact
    reference backend's forward (``forward_s``, the reference chain), the oracle of its four
    linears on their real inputs (``oracle_s``, with the bound: the legal adversary's chain),
    the GEMM audit of ``model``'s outputs for the same inputs (``audit_s``: one exact GEMM,
    Σ|ab| only where an output is not the correctly rounded one) and the block on ``model``'s
    backend (``backend_s``)."""
    ref = model.derived(backend="reference")
    x = ref.embed(initial_latent(ref.cfg, ref.seed).to(ref.device), 0)
    inputs = {}

    def record(block, role, lin):
        def rec(a, rows=None, **epilogue):
            inputs[role] = a
            return lin(a, rows=rows, **epilogue)
        return rec

    ref.derived(wrap=record).block(0, x)  # untimed: quantization, the inputs of each linear
    outputs = {r: lin(inputs[r]) for r, lin in model.linears(0).items()}  # what is audited
    times = {}
    for name, work in (("forward_s", lambda: ref.block(0, x)),
                       ("oracle_s", lambda: [lin.oracle(inputs[r])
                                             for r, lin in ref.linears(0).items()]),
                       ("audit_s", lambda: [lin.audit(inputs[r], outputs[r])
                                            for r, lin in ref.linears(0).items()]),
                       ("backend_s", lambda: model.block(0, x))):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        work()
        torch.cuda.synchronize()
        times[name] = time.perf_counter() - t0
    return times


def ladder_estimate_s(cfg, t: dict, chains: int = 1) -> float:
    """Rungs 3-7 at full size from one block's times, the trajectory pass's three chains on
    ``chains`` GPUs (1: in turn; 2: the adversary alone, the reference and the model on the
    other; 3: one each): a block-step of the pass takes the reference's forward, the
    adversary's oracle and the model's block plus its audit (and the audit's plain re-runs of
    out and fc2, ~half a block), summed per GPU, the slowest GPU counting. Rungs 3-4: the
    reference's step 0 each, ~6 blocks of oracles and audits. Rungs 1-2, 8, weight packing,
    checkpoints and restarts not included."""
    ref, adv = t["forward_s"], t["oracle_s"]
    got = t.get("audit_s", t["oracle_s"]) + 1.5 * t["backend_s"]
    block = {1: ref + adv + got, 2: max(adv, ref + got), 3: max(ref, adv, got)}[chains]
    return (cfg.steps * cfg.blocks * block + 2 * cfg.blocks * ref
            + 3 * t["oracle_s"] + 3 * t.get("audit_s", t["oracle_s"]))


def _main(argv) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--backend", default="p0", choices=("p0", "reference"))
    p.add_argument("--steps", type=int, default=FULL.steps)
    p.add_argument("--reference-block", action="store_true",
                   help="also time one full-size block of the exact reference backend")
    args = p.parse_args(argv)
    need_gpu("h3-trajectory")
    if not 1 <= args.steps <= FULL.steps:
        raise SystemExit(f"--steps must be 1..{FULL.steps}")
    cache = weight_cache.from_env()  # $WB_WEIGHT_CACHE: load what an earlier run packed
    model = H3Model(FULL, seed=args.seed, backend=args.backend, device="cuda",
                    weight_cache=cache)
    torch.cuda.reset_peak_memory_stats()
    t_build = time.perf_counter()
    for b in range(FULL.blocks):  # quantize every block's weights once (kept packed)
        model.linears(b)
        if b % 10 == 9:
            progress(f"weights of block {b + 1}/{FULL.blocks} packed "
                     f"({time.perf_counter() - t_build:.0f} s)")
    build_s = time.perf_counter() - t_build
    if cache is not None:
        progress(f"weight cache {cache.root}: {cache.loaded} linears loaded, {cache.packed} "
                 f"packed and stored ({build_s:.0f} s)")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()  # the trajectory's own peak, packed weights included
    steps = []

    def on_step(step, latent):
        torch.cuda.synchronize()
        now = time.perf_counter()
        steps.append({"step": step, "seconds": now - on_step.t, "checksum":
                      checksum(latent)["sha256"]})
        progress(f"step {step + 1}/{args.steps}: {now - on_step.t:.2f} s")
        on_step.t = now

    on_step.t = time.perf_counter()
    final = model.trajectory(steps=args.steps, on_step=on_step)
    total = sum(s["seconds"] for s in steps)
    summary_ck = checksum(final)
    peak = torch.cuda.max_memory_allocated()
    flops = _flops_per_step(FULL)
    row = {"backend": args.backend, "steps": args.steps, "per_step": steps,
           "weights_pack_s": build_s,
           "weights_from_cache": cache.loaded if cache is not None else 0, "trajectory_s": total, "peak_bytes": peak,
           "final": summary_ck, "flops_per_step": flops,
           "floor_s_per_step": flops / WGMMA_PEAK}
    if args.reference_block:
        t = _reference_block_seconds(model)
        row["reference_block_s"], row["reference_oracle_block_s"] = t["forward_s"], t["oracle_s"]
        row["audit_block_s"] = t["audit_s"]
        row[f"{args.backend}_block_s"] = t["backend_s"]
        est = {n: ladder_estimate_s(FULL, t, n) for n in (1, 2, 3)}
        row["full_ladder_estimate_s"] = est[1]
        row["full_ladder_estimate_s_by_gpus"] = est
        progress(f"one block: reference forward {t['forward_s']:.2f} s, the oracle of its 4 "
                 f"linears {t['oracle_s']:.2f} s, their audit of {args.backend}'s outputs "
                 f"{t['audit_s']:.2f} s, {args.backend} {t['backend_s']:.2f} s; so rungs 3-7 "
                 f"at full size need ~{est[1] / 60:.0f} min on one GPU, ~{est[2] / 60:.0f} on "
                 f"two, ~{est[3] / 60:.0f} on three (wb ladder --devices)")
    steady = statistics.median(s["seconds"] for s in steps[1:]) if len(steps) > 1 else total
    headline = {"trajectory_checksum": summary_ck["sha256"], "steps": args.steps,
                "trajectory_s": total, "s_per_step": total / len(steps),
                "s_per_step_steady": steady,  # median after the first (compiles, prepacks)
                "peak_bytes": peak}
    gates = {"finite": R.gate(summary_ck["finite"], "the final latent is finite"),
             "canonical": R.gate(args.steps == FULL.steps,
                                 f"{args.steps} of {FULL.steps} steps")}
    summary = R.make_summary(f"h3-trajectory-{args.backend}",
                             parameters={"config": "FULL", "backend": args.backend,
                                         "steps": args.steps, "seed": args.seed},
                             measurements=[row], headline=headline, gates=gates,
                             seeds={"model": args.seed})
    path = R.write(summary, args.results_dir)
    print(R.format_table([[args.backend, args.steps, f"{total:.1f}", f"{total / len(steps):.2f}",
                           f"{flops / WGMMA_PEAK:.2f}", f"{peak / 2**30:.1f}",
                           summary_ck["sha256"][:16]]],
                         ["backend", "steps", "total s", "s/step", "floor s/step", "peak GiB",
                          "checksum"]))
    print(f"wrote {path} (verdict {summary['verdict']})")
    return 0


def main(argv=None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
