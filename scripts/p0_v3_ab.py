"""P0 v3 measurements 1(a), 1(c), the pipelined consumer and stream-K on the H200, in one run
(notes/p0-gemm.md, "P0 v3, measurements 1(a) and 1(c)" and "Stream-K and the pipelined
consumer": the predictions were written before each run).

Session 27 removed the designs that expanded the packed activation in every CTA (the P0
design, the packed swap-AB and V3Study(activation="expand")): their rows left this script, and
"production" is now the f16 swap-AB build (BlockscaledGemmSm90.swap_ab_f16) through gemm_nvfp4
with the activation's f16 expansion and the weight's prepack. ``git show e8e774c:scripts/
p0_v3_ab.py`` has the rows as they were measured (notes/p0-gemm.md, session 27).

(p) the mainloop and the schedule at M = 128 (qkv, fc1, out, wide, fc2): the production build
through gemm_nvfp4 (the chooser's K split, k_splits); the TMA'd f16 activation with the serial
consumer and 4 f16 buffers (the control for the buffers); the pipelined consumer
(PipelinedRegisterAWgmmaConsumer: convert step b + 1 under wgmma(b), two k16 groups in flight)
with 2 and with 4 buffers; the f16 serial and pipelined builds on device.tiles.StreamKSchedule
(every CTA the same share of all tiles' k-blocks; their own bits, checked against the oracle's
bound by the tests). over_production = time / production's (whole calls: the schedules differ).

(L) M = 2048 (qkv, fc1, out, fc2, wide): the production default there (gemm_nvfp4's
default_config: the 256-token f16 build) against the swap-AB f16 build at one K split (128 x
128 tiles, 4 buffers, on the tile loop and on stream-K); each its own bits, within the bound by
the tests.

(W, w) the large-M candidate at M = 2048 (W) and 128 (w), qkv and fc2: three warpgroups (the
f16 activation's TMA in the producer's warpgroup, producers.activation_stage.WeightsAndF16Producer),
the pipelined register-A consumer, 128 or 256 tokens a CTA (m64n128k16 / m64n256k16 at up to
232 registers). Run last: a kernel fault loses the process's CUDA context, so the run stops
there (``context_lost`` in the provenance) with every finished job's rows already written.

(S256, S512, S1024) qkv, out and fc2 at M = 256, 512 and 1024: the swap-AB f16 build (the
chooser's split) and on stream-K, the 256-token build on the tile loop and on stream-K, with
the anchors: where the f16 chooser should switch (schedules/plan.py F16_SWAP_AB_MAX_WAVES).

Parts p, L and S also time the public peers on the same operand sets in this process: cuBLAS
bf16 (the activation as bf16 against the dequantized weight) and quack-kernels' gemm_w4a16 on
the same NVFP4 weights (experiments.p0_baseline's repack; the row is missing, and the run says
why, where quack does not import). --no-anchors leaves them out.

    python3 scripts/p0_v3_ab.py [--seconds 170] [--parts p L W w c a] [--no-anchors] [--out DIR]

(a) the split-K fixup at M = 128 (out, fc2, 7168x5376; splits 2 and 3): the production store
through gemm_nvfp4 (fresh workspace and a zero-filled counter buffer every call), the same
kernel launched on a persistent, once-zeroed counter buffer (the kernel re-arms its counters,
so the fill is not needed), the DSMEM reduction inside a K-split cluster (``fixup="dsmem"``:
the S splits of a tile one cluster, partials exchanged in shared memory, no workspace or
counter; production's bits; notes/p0-gemm.md, session 26) and no fixup at all
(``fixup="skip"``: wrong, timing only); splits 1 beside them. fixup_us = a variant's time - the
skip build's. The vectorised fixup measured here at 8438956 won and is the production store
since; the scalar one it replaced is in git.

(c) the register-A consumer at M = 128 (qkv, out, fc1, fc2, 7168x5376; the chooser's K split):
the production build (4 f16 buffers) and the study's f16 build at 2 buffers (the f16 tile made
once here by torch: e2m1 · scale, exactly what expand_nvfp4 writes), both with the serial
consumer. ns_per_kblock = the time over
the k-blocks one CTA runs in sequence (ceil(work items / CTAs) x k-blocks per split);
over_production = a variant's ns_per_kblock / the production build's.

The per-k16 interleaved consumer (InterleavedRegisterAWgmmaConsumer, 1 or 2 k16 groups in
flight, and its no-conversion ablation) was measured here at 8438956: it lost, 1.4-1.6x slower
than the serial consumer (the per-k16 commit and wait is the cost; the ablation carries it too,
so it is no floor), and was removed with its rows: notes/p0-gemm.md, "P0 v3, measurements 1(a)
and 1(c)", and ``git show 8438956:consumers/register_a_wgmma.py``.

Every exact variant's output (into a NaN-poisoned buffer) must equal the production build's
bits on the same operands, and a rerun its own. Timing: workbench.timing.bench, CUDA-graph
replay after warm-up, operand sets rotated past L2. Jobs run in priority order until the
--seconds budget is spent (those not run are listed). Writes ``p0-v3-ab.json`` under --out or
$WB_RESULTS_DIR and prints a table.
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
from device.runtime import cluster_ctas, sm_count
from device.waits import synchronize
from kernels.nvfp4.gemm import _mailbox_address, default_config, gemm_nvfp4, k_splits
from kernels.nvfp4.gemm_shell import ENTRY, BlockscaledGemmSm90, V3Study, entry_buffers
from kernels.nvfp4.prepack import prepack
from numerics import nvfp4
from validators.gemm_operands import make_operand
from workbench.timing import bench, rotation_count

PROJECTIONS = {"qkv": (21504, 5376), "out": (5376, 5376), "fc1": (14336, 5376),
               "fc2": (5376, 14336), "wide": (7168, 5376)}
SMALL_M, LARGE_M = 128, 2048
SWEEP_M = {"S256": 256, "S512": 512, "S1024": 1024}  # part S: where the f16 builds cross
# priority order: session 21's rows (p) first, then 8438956's (c) and (a)
JOBS = (("p", "qkv"), ("p", "fc1"), ("p", "out"), ("p", "wide"), ("p", "fc2"),
        ("L", "qkv"), ("L", "fc1"), ("L", "out"), ("L", "fc2"), ("L", "wide"),
        ("W", "qkv"), ("W", "fc2"), ("w", "qkv"), ("w", "fc2"),
        ("W", "fc1"), ("W", "out"), ("W", "wide"),
        *((part, name) for part in SWEEP_M for name in ("qkv", "out", "fc2")),
        ("c", "out"), ("c", "qkv"), ("a", "out"), ("c", "fc2"), ("a", "fc2"), ("c", "fc1"),
        ("a", "wide"), ("c", "wide"))
FIXUP_SPLITS = (2, 3)


def operands(M, N, K, seed):
    """((a_q, a_s, g_a), (b_q, b_s, g_b), the weight's prepack, the f16 activation e2m1 · s);
    g as fp32 device tensors (a captured call copies nothing from the host)."""
    a = make_operand("normal", M, K, seed, "cuda")
    b = make_operand("normal", N, K, seed + 1, "cuda")
    g = [torch.tensor([float(x[2])], dtype=torch.float32, device="cuda") for x in (a, b)]
    x16 = nvfp4.dequantize(a[0], a[1], 1.0, (M, K), dtype=torch.float16).contiguous()
    return (a[0], a[1], g[0]), (b[0], b[1], g[1]), prepack(b[0], b[1]), x16


class StudyLaunch:
    """A config launched straight through the FFI entry (what gemm_nvfp4 does after its
    checks), on a persistent split-K workspace and a counter buffer zeroed once (every launch
    re-arms its counters); the f16 activation in the ``a`` slot."""

    def __init__(self, cfg, M: int, N: int, K: int):
        self.cfg, self.key, self.M, self.N, self.K = cfg, cfg.static_key(), M, N, K
        words, tiles = cfg.workspace_floats(M, N, K, sm_count())
        if words:
            self.work = torch.empty(words, dtype=torch.float32, device="cuda")
            self.counters = torch.zeros(tiles, dtype=torch.int32, device="cuda")
        else:
            self.work = self.counters = None

    def __call__(self, a, b, pre, x16, out):
        a_q = x16.view(torch.uint8)
        if a_q.numel() != self.M * self.K * 2:
            raise ValueError(f"the f16 activation has {a_q.numel()} bytes, not M x K x 2 for "
                             f"M = {self.M}, K = {self.K}")
        ENTRY(self.cfg, self.key, entry_buffers(a_q, a[1], pre, a[2], b[2], out,
                                                _mailbox_address(), self.work, self.counters),
              (self.M, self.N, self.K // 32,
               cluster_ctas(self.cfg.cluster_n * self.cfg.cluster_k)))
        return out


def production(M, N, K, splits):
    """gemm_nvfp4 with the production swap-AB f16 build at ``splits`` (fresh workspace and
    zero-filled counters every call), the prepack and the f16 activation given."""
    cfg = BlockscaledGemmSm90.swap_ab_f16(splits=splits)

    def call(a, b, pre, x16, out):
        return gemm_nvfp4(*a, *b, out=out, config=cfg, prepacked=pre, a16=x16)
    return cfg, call


def variants(part, M, N, K):
    """[(label, config, callable, exact)] of one job."""
    rows = []
    if part == "a":
        for sp in (1, *FIXUP_SPLITS):
            cfg, call = production(M, N, K, sp)
            rows.append((f"s{sp} production", cfg, call, True))
            if sp == 1:
                continue
            rows.append((f"s{sp} production, counters kept", cfg, StudyLaunch(cfg, M, N, K), True))
            cfg = V3Study(splits=sp, fixup="dsmem", buffers=4).build()
            rows.append((f"s{sp} fixup dsmem cluster", cfg, StudyLaunch(cfg, M, N, K), True))
            cfg = V3Study(splits=sp, fixup="skip", buffers=4).build()
            rows.append((f"s{sp} fixup skip", cfg, StudyLaunch(cfg, M, N, K), False))
        return rows
    if part == "L":  # M = 2048: the production default there is the 256-token f16 build
        cfg = default_config(M, N, K)

        def call(a, b, pre, x16, out):
            return gemm_nvfp4(*a, *b, out=out, prepacked=pre, a16=x16)
        rows.append(("default production", cfg, call, True))
        # the swap-AB f16 build at M = 2048 (128 x 128 tiles, one K split), on the tile loop
        # and on stream-K (each its own bits against the default's; within the bound by the
        # tests)
        for study, label in (
                (V3Study(splits=1, activation="f16_tma", buffers=4), "s1 swap-AB f16 serial b4"),
                (V3Study(stream_k=True, activation="f16_tma", buffers=4),
                 "stream-k swap-AB f16 serial b4")):
            cfg = study.build()
            rows.append((label, cfg, StudyLaunch(cfg, M, N, K), False))
        return rows
    if part in SWEEP_M:  # between M = 128 and 2048: the f16 builds' switch point
        rows = []
        for study, label in ((V3Study(splits=k_splits(M, N, K, sm_count()),
                                      activation="f16_tma", buffers=4), "swap-AB f16"),
                             (V3Study(stream_k=True, activation="f16_tma", buffers=4),
                              "swap-AB f16 stream-k"),
                             (V3Study(activation="f16_tma_3wg", tokens=256,
                                      consumer="pipelined", buffers=4), "3wg t256"),
                             (V3Study(activation="f16_tma_3wg", tokens=256, stream_k=True,
                                      consumer="pipelined", buffers=4), "3wg t256 stream-k")):
            cfg = study.build()
            rows.append((label, cfg, StudyLaunch(cfg, M, N, K), False))
        return rows
    if part in ("W", "w"):  # the three-warpgroup builds, last: a fault ends the run
        for tokens, stream_k in ((128, False), (256, False), (256, True)):
            study = V3Study(activation="f16_tma_3wg", consumer="pipelined", buffers=4,
                            tokens=tokens, stream_k=stream_k)
            cfg = study.build()
            # another design (and at 256 another wgmma shape): its own bits, within the bound
            label = f"3wg f16 pipelined t{tokens}" + (" stream-k" if stream_k else "")
            rows.append((label, cfg, StudyLaunch(cfg, M, N, K), False))
        return rows
    if part == "p":
        sp = k_splits(M, N, K, sm_count())
        cfg, call = production(M, N, K, sp)
        rows.append((f"s{sp} production", cfg, call, True))
        pipe = dict(consumer="pipelined")
        for study, label in (
                (V3Study(splits=sp, activation="f16_tma", buffers=4), f"s{sp} f16 serial b4"),
                (V3Study(splits=sp, activation="f16_tma", buffers=2, **pipe),
                 f"s{sp} f16 pipelined b2"),
                (V3Study(splits=sp, activation="f16_tma", buffers=4, **pipe),
                 f"s{sp} f16 pipelined b4"),
                (V3Study(stream_k=True, activation="f16_tma", buffers=4, **pipe),
                 "stream-k f16 pipelined b4"),
                (V3Study(stream_k=True, activation="f16_tma", buffers=4),
                 "stream-k f16 serial b4")):
            cfg = study.build()
            # stream-K has its own bits (its own summation order); the rest the production ones
            rows.append((label, cfg, StudyLaunch(cfg, M, N, K), not study.stream_k))
        return rows
    sp = k_splits(M, N, K, sm_count())
    cfg, call = production(M, N, K, sp)
    rows.append((f"s{sp} production", cfg, call, True))
    study = V3Study(splits=sp, activation="f16_tma")
    cfg = study.build()
    rows.append((f"s{sp} f16 serial", cfg, StudyLaunch(cfg, M, N, K), study.exact))
    return rows


def anchors(ops, N, K, out):
    """The public peers on the job's operand sets, timed in this process: cuBLAS bf16 (x16 as
    bf16 @ the dequantized weight's transpose) and quack-kernels' gemm_w4a16 on the same NVFP4
    weights (experiments.p0_baseline's repack), when quack imports: [(label, fn, arg_sets)]."""
    from experiments.p0_baseline import _quack, quack_nvfp4_weight
    rows = []
    cub = [(x16.to(torch.bfloat16), nvfp4.dequantize_operand(b[0], b[1], (N, K)))
           for _a, b, _pre, x16 in ops]
    rows.append(("cublas bf16", lambda x, w: torch.matmul(x, w.T, out=out), cub))
    qk, _version, why = _quack()
    if qk is None:
        print(f"   quack not run: {why}", flush=True)
        return rows
    qs = []
    for (x, _w), (_a, b, _pre, _x16) in zip(cub, ops):
        blob, sf = qk.prepare_w4_weight(*quack_nvfp4_weight(b[0], b[1], N, K), wformat="nvfp4")
        qs.append((x, blob, sf, float(b[2])))
    rows.append(("quack w4a16", lambda x, blob, sf, g: qk.gemm_w4a16(
        x, blob, sf, tensor_scale=g, out=out, wformat="nvfp4"), qs))
    return rows


def kblocks_per_cta(cfg, M, N, K, sms):
    """k-blocks one CTA runs in sequence: its work items x the k-blocks of a split (stream-K:
    its share of all tiles' k-blocks)."""
    if cfg.stream_k:
        total = -(-M // cfg.tile_m) * -(-N // cfg.tile_n) * -(-K // K_BLOCK)
        return -(-total // min(total, sms))
    work = -(-M // cfg.tile_m) * -(-N // cfg.tile_n) * cfg.splits
    k_per_split = -(-(-(-K // K_BLOCK)) // cfg.splits)
    return -(-work // min(work, sms)) * k_per_split


class ContextLost(RuntimeError):
    """A kernel faulted (illegal address, trap): the CUDA context is gone for this process."""


def run_job(part, name, args, rows):
    N, K = PROJECTIONS[name]
    M = SWEEP_M.get(part) or (LARGE_M if part in ("L", "W") else SMALL_M)
    per_set = (M + N) * (K // 2 + K // 16) + M * K * 2
    sets = rotation_count(per_set, factor=2.0, cap=4)
    ops = [operands(M, N, K, 100 * i + M + N) for i in range(sets)]
    a, b, pre, x16 = ops[0]
    ref = {}
    for label, cfg, call, exact in variants(part, M, N, K):
        row = {"part": part, "projection": name, "M": M, "N": N, "K": K, "config": label,
               "splits": cfg.splits, "exact_promised": exact, "describe": cfg.describe()}
        try:
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            call(a, b, pre, x16, out)
            again = call(a, b, pre, x16, torch.empty_like(out))
            synchronize()  # a trapped kernel's mailbox report becomes the error
            bits, bits2 = out.view(torch.int16), again.view(torch.int16)
            if exact:
                row["rerun_identical"] = bool(torch.equal(bits, bits2))
                row["no_nan_left"] = not bool(out.isnan().any())
                base = ref.setdefault(cfg.splits, bits) if "production" in label else \
                    ref.get(cfg.splits)
                row["equal_to_production"] = None if base is None else bool(
                    torch.equal(bits, base))
            res = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            t = bench(lambda a, b, pre, x16, call=call: call(a, b, pre, x16, res), ops,
                      graph=True, warmup_ms=5, rep_ms=args.rep_ms).as_dict()
            row["timing"], row["us"] = t, t["median_us"]
            row["kblocks_per_cta"] = kblocks_per_cta(cfg, M, N, K, sm_count())
            row["ns_per_kblock"] = 1e3 * t["median_us"] / row["kblocks_per_cta"]
        except Exception as e:  # a variant that fails is a row, not a crash
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            if type(e).__name__ == "AcceleratorError":  # the context is lost: no later job runs
                rows.append(row)
                raise ContextLost(row["error"]) from e
        rows.append(row)
        print(f"({part}) {name:>4} {label:<34} " + (
            f"{row['us']:8.1f} us {row['ns_per_kblock']:7.0f} ns/kblock  "
            f"equal={row.get('equal_to_production')} rerun={row.get('rerun_identical')} "
            f"no_nan={row.get('no_nan_left')}" if "us" in row else row["error"]), flush=True)
    if args.anchors and (part in ("p", "L") or part in SWEEP_M):
        res = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        for label, fn, sets in anchors(ops, N, K, res):
            row = {"part": part, "projection": name, "M": M, "N": N, "K": K, "config": label,
                   "splits": 0, "exact_promised": False, "anchor": True}
            try:
                fn(*sets[0])
                t = bench(fn, sets, graph=True, warmup_ms=5, rep_ms=args.rep_ms).as_dict()
                row["timing"], row["us"] = t, t["median_us"]
            except Exception as e:  # pragma: no cover - an anchor that fails is a row
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            rows.append(row)
            print(f"({part}) {name:>4} {label:<34} " + (
                f"{row['us']:8.1f} us" if "us" in row else row["error"]), flush=True)
        del res
    del ops
    torch.cuda.empty_cache()


def derive(rows):
    """fixup_us (part a: minus the skip build of the same shape and split) and
    over_production (part c: ns per k-block over the production build's)."""
    for r in rows:
        if "us" not in r:
            continue
        twin = "skip" if r["part"] == "a" else "production"
        base = next((x for x in rows if x["part"] == r["part"] and "us" in x
                     and x["projection"] == r["projection"]
                     and (x["splits"] == r["splits"] or r["part"] == "p")
                     and twin in x["config"]), None)
        if base is None:
            continue
        if r["part"] == "a" and r["splits"] > 1:
            r["fixup_us"] = r["us"] - base["us"]
        elif r["part"] == "c":
            r["over_production"] = r["ns_per_kblock"] / base["ns_per_kblock"]
        elif r["part"] in ("p", "L"):  # whole calls: the schedules differ in k-blocks a CTA
            r["over_production"] = r["us"] / base["us"]


def table(rows) -> str:
    lines = [f"{'part':<4} {'proj':<5} {'config':<34} {'us':>8} {'ns/kblk':>8} "
             f"{'fixup_us':>8} {'/prod':>7} {'exact':>6}"]
    for r in rows:
        head = f"{r['part']:<4} {r['projection']:<5} {r['config']:<34}"
        if "us" not in r:
            lines.append(f"{head} {r.get('error', '')}")
            continue
        fixup = f"{r['fixup_us']:8.1f}" if "fixup_us" in r else " " * 8
        ratio = f"{r['over_production']:7.2f}" if "over_production" in r else " " * 7
        ok = ("-" if not r["exact_promised"] else
              str(bool(r.get("rerun_identical")) and bool(r.get("no_nan_left"))
                  and r.get("equal_to_production") is not False))
        nsk = f"{r['ns_per_kblock']:8.0f}" if "ns_per_kblock" in r else " " * 8
        lines.append(f"{head} {r['us']:8.1f} {nsk} {fixup} {ratio} "
                     f"{ok:>6}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=170.0,
                   help="start no job after this many seconds (default 170)")
    p.add_argument("--parts", nargs="+", choices=("p", "L", "W", "w", "a", "c", *SWEEP_M),
                   default=["p", "L", "c", "a"])
    p.add_argument("--rep-ms", type=float, default=40.0, help="timed replay per measurement")
    p.add_argument("--projections", nargs="+", choices=tuple(PROJECTIONS), default=None,
                   help="only these projections (default: all of each part)")
    p.add_argument("--no-anchors", dest="anchors", action="store_false",
                   help="parts p and L without the cuBLAS bf16 and quack W4A16 rows")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("p0_v3_ab: needs the H200", file=sys.stderr)
        return 2
    out_dir = args.out or Path(os.environ.get("WB_RESULTS_DIR", "."))
    path = out_dir / "p0-v3-ab.json"
    if path.exists():  # refuse before the run, not after it
        print(f"p0_v3_ab: {path} exists; not overwritten", file=sys.stderr)
        return 1
    t0, rows, done, skipped, per_job = time.time(), [], [], [], 0.0
    out_dir.mkdir(parents=True, exist_ok=True)
    lost = None

    def write():  # after every job, so a fault or a kill keeps what was measured
        prov = {"commit": os.environ.get("WB_GIT_COMMIT", "unknown")[:7],
                "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": "python3 scripts/p0_v3_ab.py " + " ".join(argv or sys.argv[1:]),
                "jobs_run": done, "jobs_skipped": skipped, "seconds": time.time() - t0,
                "context_lost": lost}
        path.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1))

    for part, name in JOBS:
        if part not in args.parts or (args.projections and name not in args.projections):
            continue
        elapsed = time.time() - t0
        if lost or elapsed + per_job > args.seconds:
            skipped.append(f"{part}:{name}")
            continue
        try:
            run_job(part, name, args, rows)
        except ContextLost as e:
            lost = f"{part}:{name}: {e}"
            print(f"context lost at {lost}; later jobs not run", flush=True)
        done.append(f"{part}:{name}")
        per_job = max(per_job, (time.time() - t0 - elapsed) * 0.8)
        print(f"   ({time.time() - t0:.0f} s)", flush=True)
        derive(rows)
        write()
    derive(rows)
    print(table(rows))
    if skipped:
        print(f"not run: {', '.join(skipped)}")
    write()
    (out_dir / "p0-v3-ab.txt").write_text(table(rows) + "\n")
    print(f"wrote {path}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
