"""Stress the fast loop's captured frames for bits that depend on timing (notes/fast-loop.md v14a).

Per bucket the default frames (sampled and teacher-forced), each run N times under each
condition and compared bitwise with its reference (codes, logits, KV cache, talker sum). The
frames alternate between two input sets, so every frame follows one of other inputs: a frame
that reads anything before this frame has written it (a stale cache slot, a missed edge) then
reads the other inputs' bits, which a run of identical frames would hide. A reference is the
third of three frames of its inputs in a row. Per bucket, kind and condition it records the
frames run, the frames that differ, where the first differs (group, layer and position, the
talker sum: models.fast_loop.frame_difference) and the fingerprints of both; then writes the
summary fast-loop-stress.json and prints a table.

Conditions (--conditions; "+" combines, e.g. perturbed+busy):
  alone      nothing else runs
  busy       a side stream of this process queues large matmuls beside every frame
  procs      --procs other processes hammer the GPU with matmuls (bounded in time, and
             killed at the condition's end)
  nvfp4      after the NVFP4 quantize and GEMM kernels ran in this process (as the GPU suite's
             nvfp4 tests do); the process keeps that history for the conditions after it
  perturbed  loops built with WB_PERTURB_TIMING (device/ptx.py: a per-CTA random nanosleep
             around every PDL trigger and wait), checked against the default build's
             references: the same bits or a race

``--seconds``: a budget for the whole run, shared evenly by the (condition, bucket, kind)
cases still to run (builds included); a case cut short is reported with the frames it ran, the
summary then 'incomplete'. A frame takes ~1.2-3 ms (1-128 rows), ~2x that perturbed; builds
(kernel compiles and the per-code QKV table, up to ~5 s at 1 row) dominate a short run.

    python3 scripts/stress_fast_loop.py --buckets 1,16,64,128 --frames 300 \\
        --conditions alone,busy,perturbed --seconds 220
The race it found (v14a: slot 0 read before the wait) was shown with an --unfixed build at
ae89a58, since removed: git show ae89a58:scripts/stress_fast_loop.py.
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import sys
import time
from collections import Counter

import torch
from cuda.bindings import driver as cu

from configs.codepredictor import QWEN3_TTS_1P7B, LoopOutput
from device.ptx import PERTURB_DEFAULT_NS, PERTURB_ENV
from experiments._common import need_gpu, parser, progress, run_main
from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
from kernels.nvfp4.quantize import quantize_nvfp4
from models.codepredictor import random_weights
from models.fast_loop import (FastLoop, FastWeights, describe_difference, frame_difference,
                              frame_difference_mask, frame_fingerprint)
from models.sampler import Sampler
from numerics import nvfp4
from schedules.plan import BUCKETS
from validators.gemm_operands import make_operand
from workbench import results as R

KINDS = ("sampled", "forced")
CONDITIONS = ("alone", "busy", "procs", "nvfp4", "perturbed")
HOG_SIZES = (8192, 4096, 2048)  # a different kernel length a hog process


# ---- frames -------------------------------------------------------------------------------
def frame_inputs(cfg, rows: int, kind: str, seed: int) -> tuple:
    """A frame's arguments from CPU generators (the same in every process): (h, g0), and the
    forced codes for "forced"."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, cfg.talker_hidden, generator=g).to("cuda", torch.bfloat16)
    g0 = torch.randint(0, cfg.talker_vocab, (rows,), generator=g).to("cuda")
    if kind == "sampled":
        return h, g0
    codes = torch.randint(0, cfg.vocab, (rows, cfg.heads_drawn), generator=g).to("cuda")
    return h, g0, codes


def build_loop(fw: FastWeights, rows: int, kind: str) -> FastLoop:
    """The bucket's default captured loop: sampled (T 0.9, top-k 50, seeds 300...) or
    teacher-forced."""
    if kind == "forced":
        return FastLoop(fw, rows, teacher_forced=True)
    return FastLoop(fw, rows, Sampler(rows, seeds=list(range(300, 300 + rows)), device="cuda"))


def run_frame(loop: FastLoop, args: tuple) -> LoopOutput:
    """One frame from reset offsets (its outputs are views of the loop's buffers)."""
    if loop.sampler is not None:
        loop.sampler.offset.zero_()
    return loop(*args)


def snapshot(out: LoopOutput) -> LoopOutput:
    return LoopOutput(out.codes.clone(), out.talker_sum.clone(),
                      [(k.clone(), v.clone()) for k, v in out.kv], out.logits.clone())


def copy_into(dst: LoopOutput, out: LoopOutput) -> None:
    for a, b in ((dst.codes, out.codes), (dst.talker_sum, out.talker_sum),
                 (dst.logits, out.logits)):
        a.copy_(b)
    for (k, v), (k1, v1) in zip(dst.kv, out.kv):
        k.copy_(k1)
        v.copy_(v1)


def reference(loop: FastLoop, args: tuple) -> tuple[LoopOutput, dict | None]:
    """The third of three frames of ``args`` in a row (a stale read then reads these inputs'
    own bits) and where the first of them, after other inputs, differed from it (None:
    nowhere)."""
    first = snapshot(run_frame(loop, args))
    run_frame(loop, args)
    ref = snapshot(run_frame(loop, args))
    return ref, frame_difference(ref, first)


class Case:
    """One bucket and kind: its default loop, two input sets and their references (built in a
    quiet GPU), and the loops the conditions build beside it, checked against its references."""

    def __init__(self, fw: FastWeights, rows: int, kind: str):
        self.fw, self.rows, self.kind = fw, rows, kind
        t = time.time()
        self.loop = build_loop(fw, rows, kind)
        self.build_s = time.time() - t
        cfg = fw.config
        self.inputs = [frame_inputs(cfg, rows, kind, rows + 11),
                       frame_inputs(cfg, rows, kind, rows + 12)]
        pairs = [reference(self.loop, a) for a in self.inputs]
        self.refs = [r for r, _ in pairs]
        # the first frame of each input set came after other inputs (or the build's warm-up)
        self.warmup_differences = [d for _, d in pairs]
        self.built = {}

    def loop_for(self, parts: set, perturb_ns: int) -> FastLoop:
        """The default loop, or for "perturbed" one built with the perturbed kernels, for
        "nvfp4" one built after the NVFP4 kernels ran (buffers placed after their
        allocations): built once each."""
        key = (perturb_ns if "perturbed" in parts else 0, "nvfp4" in parts)
        if key == (0, False):
            return self.loop
        if key not in self.built:
            build = perturbed_build(key[0]) if key[0] else contextlib.nullcontext()
            with build:
                self.built[key] = build_loop(self.fw, self.rows, self.kind)
        return self.built[key]


def stress_frames(loop: FastLoop, inputs: list, refs: list, frames: int, *,
                  deadline: float | None = None, before_frame=None, batch: int = 16) -> dict:
    """Run ``frames`` frames of ``loop`` alternating over ``inputs``, each compared bitwise with
    its reference (the comparison queued behind the frame; one host sync a batch); stop early
    at ``deadline`` (time.time()). ``before_frame(i)``: called before frame i is queued.
    Returns frames run, frames differing, each differing frame's index, input and first
    difference, where they first differed (counts), and the first one's fingerprints."""
    n_in = len(inputs)
    ring = [snapshot(refs[0]) for _ in range(min(batch, frames))]
    meta = refs[0]
    width = frame_difference_mask(meta, meta).numel()
    flags = torch.zeros(len(ring), width, dtype=torch.bool, device=meta.codes.device)
    out = {"frames": 0, "differing": 0, "differing_frames": [], "first_at": Counter(),
           "first": None, "fingerprints": None}
    t0, done = time.time(), 0
    while done < frames and (deadline is None or time.time() < deadline):
        n = min(len(ring), frames - done)
        for j in range(n):
            i = done + j
            if before_frame is not None:
                before_frame(i)
            got = run_frame(loop, inputs[i % n_in])
            copy_into(ring[j], got)
            flags[j].copy_(frame_difference_mask(got, refs[i % n_in]))
        if flags.is_cuda:
            torch.cuda.synchronize()
        host = flags[:n].cpu()
        for j in host.any(1).nonzero().flatten().tolist():
            i, ref = done + j, refs[(done + j) % n_in]
            where = describe_difference(host[j], meta.codes.shape[1], len(meta.kv),
                                        meta.kv[0][0].shape[2])
            out["differing"] += 1
            out["first_at"][where["first"]] += 1
            if len(out["differing_frames"]) < 20:
                out["differing_frames"].append({"frame": i, "input": i % n_in, **where})
            if out["first"] is None:
                out["first"] = {"frame": i, "input": i % n_in, **where}
                out["fingerprints"] = {"reference": frame_fingerprint(ref),
                                       "got": frame_fingerprint(ring[j])}
        done += n
    out["frames"] = done
    out["frame_ms"] = (time.time() - t0) * 1e3 / max(done, 1)
    out["first_at"] = dict(out["first_at"])
    return out


# ---- conditions ---------------------------------------------------------------------------
@contextlib.contextmanager
def perturbed_build(ns: int = PERTURB_DEFAULT_NS):
    """Kernels compiled inside are the timing-perturbation build (device.ptx), sleeping up to
    ``ns`` around each PDL point (their compile-cache keys name it)."""
    before = os.environ.get(PERTURB_ENV)
    os.environ[PERTURB_ENV] = str(ns)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PERTURB_ENV, None)
        else:
            os.environ[PERTURB_ENV] = before


class BusyStream:
    """A side stream of this process that gets one 8192^3 and four 2048^3 bf16 matmuls queued
    beside every frame (~2-3 ms of tensor-core work, about a frame's length; the queue is
    drained at each batch's host sync)."""

    def __init__(self):
        self.stream = torch.cuda.Stream()
        g = torch.Generator(device="cuda").manual_seed(5)
        self.big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=g)
        self.small = self.big[:2048, :2048].contiguous()
        self.out_big, self.out_small = torch.empty_like(self.big), torch.empty_like(self.small)
        self.stream.wait_stream(torch.cuda.current_stream())  # the operands are written
        for t in (self.big, self.small, self.out_big, self.out_small):
            t.record_stream(self.stream)  # not reused before the side stream is done

    def __call__(self, i: int) -> None:
        with torch.cuda.stream(self.stream):
            torch.mm(self.big, self.big, out=self.out_big)
            for _ in range(4):
                torch.mm(self.small, self.small, out=self.out_small)


class HogError(RuntimeError):
    """A hog process did not start."""


HOG = """
import sys, time, torch
end, n = time.time() + float(sys.argv[1]), int(sys.argv[2])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.empty_like(a)
torch.cuda.synchronize()
print("ready", flush=True)
while time.time() < end:
    for _ in range(8):
        torch.mm(a, a, out=b)
    torch.cuda.synchronize()
"""


@contextlib.contextmanager
def other_processes(count: int, seconds: float):
    """``count`` processes each running matmuls on the GPU for at most ``seconds`` (each its own
    size, HOG_SIZES), started and ready before the body runs, ended (terminated, then killed)
    after it."""
    procs = []
    try:
        for k in range(count):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", HOG, str(seconds), str(HOG_SIZES[k % len(HOG_SIZES)])],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        for p in procs:
            ready, _, _ = select.select([p.stdout], [], [], 180)
            if not ready or p.stdout.readline().strip() != "ready":
                raise HogError(f"hog process {p.pid} did not start (exit {p.poll()})")
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_nvfp4_kernels(seed: int = 0) -> None:
    """The NVFP4 quantize kernel and the P0 GEMM (default configs and a split-K one with its
    workspace and counters) on random operands: the GPU suite's nvfp4 tests' kernels, as
    history for the frames after them."""
    for M, K in ((64, 256), (512, 4096), (2048, 5376)):
        x = torch.randn(M, K, device="cuda", generator=torch.Generator(device="cuda")
                        .manual_seed(seed + M)).bfloat16()
        quantize_nvfp4(x, nvfp4.global_scale(x).reshape(1), pad_16x=True)
    for (M, N, K), cfg in (((130, 264, 96), None), ((256, 1024, 5376), None),
                           ((300, 520, 1056), BlockscaledGemmSm90.swap_ab_f16(splits=3)),
                           ((128, 5376, 5376), None), ((2048, 5376, 5376), None)):
        a = make_operand("normal", M, K, seed + M, "cuda")
        b = make_operand("normal", N, K, seed + N, "cuda")
        for _ in range(3):
            gemm_nvfp4(*a, *b, config=cfg)
    torch.cuda.synchronize()


# ---- the captured frame's joins (diagnostic) ----------------------------------------------
def _cu(fn, *args):
    res = fn(*args)
    res = res if isinstance(res, tuple) else (res,)
    if int(res[0]) != 0:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)}: {res[0]}")
    return res[1:]


def _node_name(cu, node) -> str:
    """A kernel node's kernel class (DepthAttention, GemmSkinny..., ...) or the node type."""
    kind = _cu(cu.cuGraphNodeGetType, node)[0]
    if kind != cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
        return str(getattr(kind, "name", kind))
    params = _cu(cu.cuGraphKernelNodeGetParams, node)[0]
    name = ""
    for getter, handle in (("cuFuncGetName", getattr(params, "func", None)),
                           ("cuKernelGetName", getattr(params, "kern", None))):
        try:
            if handle is not None and int(handle):
                name = _cu(getattr(cu, getter), handle)[0]
                name = name.decode() if isinstance(name, bytes) else str(name)
                break
        except Exception:  # a diagnostic: any name will do
            continue
    hit = re.search(r"DepthAttention|DepthSampler|GemmSkinnyRegWgmma|GemmSkinnyWgmma|GemmSkinny"
                    r"|GemvSmallM|RowsRmsNorm", name)
    return hit.group(0) if hit else (name[:60] or "kernel")


def graph_joins(fw: FastWeights, rows: int) -> dict:
    """The sampled frame captured again with its graph kept: edges by (type, from port), and
    each node with more than one incoming edge (a stream join: position 1's attentions, the
    last draw, ...) with its sources and their edge types. A programmatic edge from another
    stream's kernel lets the node launch before that kernel completes: it must read nothing
    that kernel writes before its griddepcontrol.wait."""
    loop = FastLoop(fw, rows, Sampler(rows, seeds=list(range(300, 300 + rows)), device="cuda"),
                    graph=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loop._run_frame()  # every kernel compiled and loaded before the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        loop._run_frame()
    g = cu.CUgraph(graph.raw_cuda_graph())
    get = getattr(cu, "cuGraphGetEdges_v2", None) or cu.cuGraphGetEdges
    count = _cu(get, g, 0)[-1]
    res = _cu(get, g, count)
    lists = [x for x in res if isinstance(x, (list, tuple))]
    src, dst = lists[0], lists[1]
    data = lists[2] if len(lists) > 2 else [None] * len(src)
    names, incoming, kinds = {}, {}, Counter()

    def name(node):
        if int(node) not in names:
            names[int(node)] = _node_name(cu, node)
        return names[int(node)]

    for a, b, d in zip(src, dst, data):
        kind = "default" if d is None else f"type{int(d.type)}/port{int(d.from_port)}"
        kinds[kind] += 1
        incoming.setdefault(int(b), (b, []))[1].append((name(a), kind))
    joins = [{"node": name(b), "from": sorted(edges)}
             for b, edges in incoming.values() if len(edges) > 1]
    graph.reset()
    return {"rows": rows, "edges": dict(kinds), "joins": joins,
            "note": "type0 default (full completion); type1 programmatic; port1 programmatic, "
                    "port2 launch order"}


# ---- the run ------------------------------------------------------------------------------
def main(argv=None) -> int:
    return run_main(_main, argv)


def _parse(argv):
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=1000,
                   help="frames per bucket, kind and condition (default 1000; --quick 50)")
    p.add_argument("--buckets", default=",".join(map(str, BUCKETS)),
                   help="row buckets, comma-separated (default: all of schedules.plan.BUCKETS)")
    p.add_argument("--kinds", default=",".join(KINDS), help="sampled, forced or both")
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help=f"comma-separated, each of {CONDITIONS} or several joined by '+'")
    p.add_argument("--seconds", type=float, default=None,
                   help="budget for the whole run; stop cleanly and report what ran")
    p.add_argument("--procs", type=int, default=2, help="hog processes of 'procs' (1-3)")
    p.add_argument("--perturb-ns", type=int, default=PERTURB_DEFAULT_NS,
                   help="the perturbed build's sleep bound (ns)")
    p.add_argument("--batch", type=int, default=16, help="frames a host sync")
    p.add_argument("--edges", action="store_true",
                   help="also list each bucket's stream joins and their edge types")
    args = p.parse_args(argv)
    if args.quick:
        args.frames = min(args.frames, 50)
        if args.buckets == p.get_default("buckets"):
            args.buckets = "1,16,64,128"
    args.buckets = [int(b) for b in args.buckets.split(",")]
    args.kinds = args.kinds.split(",")
    args.conditions = args.conditions.split(",")
    bad = [c for c in args.conditions for part in c.split("+") if part not in CONDITIONS]
    if bad or set(args.kinds) - set(KINDS) or set(args.buckets) - set(BUCKETS) \
            or not 1 <= args.procs <= 3:
        p.error(f"conditions {bad}, kinds {args.kinds}, buckets {args.buckets} or procs "
                f"{args.procs} not known")
    return args


def _main(argv) -> int:
    args = _parse(argv)
    need_gpu("stress-fast-loop")
    start = time.time()
    deadline = None if args.seconds is None else start + args.seconds
    w = random_weights(QWEN3_TTS_1P7B, seed=args.seed, dtype=torch.bfloat16).to("cuda")
    fw = FastWeights(w)
    cases, rows_out, not_run, edges = {}, [], [], []
    for b in args.buckets:  # the default loops and references, nothing else running
        for kind in args.kinds:
            if deadline is not None and time.time() >= deadline:
                break
            case = cases[(b, kind)] = Case(fw, b, kind)
            firsts = [d and d["first"] for d in case.warmup_differences]
            progress(f"{b} rows {kind}: built in {case.build_s:.1f} s; the first frames after "
                     f"other inputs differ at {firsts}")
    plan = [(c, b, k) for c in args.conditions for b in args.buckets for k in args.kinds]
    nvfp4_done = False
    for ci, cond in enumerate(args.conditions):
        parts = set(cond.split("+"))
        todo = [(b, k) for c, b, k in plan if c == cond]
        if deadline is not None and time.time() >= deadline:
            not_run += [f"{cond} {b} rows {k}: the budget ran out" for b, k in todo]
            continue
        if "nvfp4" in parts and not nvfp4_done:
            t = time.time()
            try:
                run_nvfp4_kernels(args.seed)
                nvfp4_done = True
                progress(f"the NVFP4 quantize and GEMM kernels ran ({time.time() - t:.0f} s)")
            except Exception as e:  # recorded: the condition did not run
                not_run += [f"{cond} {b} rows {k}: the NVFP4 kernels failed ({e})"
                            for b, k in todo]
                continue
        busy = BusyStream() if "busy" in parts else None
        with contextlib.ExitStack() as hogs:
            if "procs" in parts:
                try:
                    hogs.enter_context(other_processes(
                        args.procs, (deadline - time.time() + 60) if deadline else 3600))
                except HogError as e:
                    not_run += [f"{cond} {b} rows {k}: {e}" for b, k in todo]
                    continue
            for i, (b, kind) in enumerate(todo):
                if (b, kind) not in cases or (deadline is not None and time.time() >= deadline):
                    not_run.append(f"{cond} {b} rows {kind}: the budget ran out")
                    continue
                case = cases[(b, kind)]
                t = time.time()
                loop = case.loop_for(parts, args.perturb_ns)
                build_s = time.time() - t
                # an even share of what is left for each case still to run
                left = (len(args.conditions) - ci - 1) * len(args.buckets) * len(args.kinds) \
                    + len(todo) - i
                case_deadline = None if deadline is None else \
                    time.time() + (deadline - time.time()) / left
                res = stress_frames(loop, case.inputs, case.refs, args.frames,
                                    deadline=case_deadline, before_frame=busy,
                                    batch=args.batch)
                rows_out.append({"condition": cond, "bucket": b, "kind": kind,
                                 "run_rows": loop.run_rows, "parts": list(loop.plan.parts),
                                 "perturb_ns": args.perturb_ns if "perturbed" in parts else 0,
                                 "build_s": round(build_s, 2), **res,
                                 "warmup_differences": case.warmup_differences})
                if res["frames"] < args.frames:
                    not_run.append(f"{cond} {b} rows {kind}: {res['frames']} of {args.frames} "
                                   "frames within the budget")
                progress(f"{cond} {b} rows {kind}: {res['differing']} of {res['frames']} "
                         f"frames differ ({res['frame_ms']:.2f} ms a frame)"
                         + (f", first at {res['first']['first']}" if res["first"] else ""))
        del busy
        progress(f"condition {ci + 1}/{len(args.conditions)} ({cond}) done at "
                 f"{time.time() - start:.0f} s")
    if args.edges:
        for b in args.buckets:
            try:
                edges.append(graph_joins(fw, b))
            except Exception as e:  # a diagnostic
                edges.append({"rows": b, "error": f"{type(e).__name__}: {e}"})
    return _report(args, rows_out, not_run, edges, time.time() - start)


def _report(args, rows_out: list, not_run: list, edges: list, seconds: float) -> int:
    frames, differing = {}, {}
    for r in rows_out:
        key = f"{r['bucket']}/{r['kind']}"
        frames.setdefault(r["condition"], {})[key] = r["frames"]
        differing.setdefault(r["condition"], {})[key] = r["differing"]
    gates = {f"0 differing frames ({c})": R.gate(
        not any(differing[c].values()),
        f"{sum(differing[c].values())} of {sum(frames[c].values())} frames differ")
        for c in differing}
    summary = R.make_summary(
        "fast-loop-stress",
        parameters={"frames": args.frames, "buckets": args.buckets, "kinds": args.kinds,
                    "conditions": args.conditions, "seconds": args.seconds,
                    "procs": args.procs, "perturb_ns": args.perturb_ns, "batch": args.batch,
                    "inputs": "two sets a bucket, alternating; references: the third of three "
                              "frames of an input set in a row"},
        measurements=rows_out + [{"graph_joins": e} for e in edges],
        headline={"differing": differing, "frames": frames, "seconds": round(seconds)},
        gates=gates, seeds={"weights": args.seed}, not_run=not_run,
        notes={"prediction": "0 differing frames in every bucket and condition (notes/"
                             "fast-loop.md v14a: position 1's attention reads cache slot 0, "
                             "which position 0's stream writes, only after its wait)"})
    path = R.write(summary, args.results_dir)
    print(R.format_table([[r["condition"], r["bucket"], r["kind"], r["frames"], r["differing"],
                           r["first"]["first"] if r["first"] else "-", round(r["frame_ms"], 2)]
                          for r in rows_out],
                         ["condition", "bucket", "kind", "frames", "differ", "first at", "ms"]))
    for e in edges:
        print(f"joins at {e['rows']} rows: {e.get('error') or e['joins']}")
    print(f"wrote {path}")
    return 0 if all(g["pass"] for g in gates.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
