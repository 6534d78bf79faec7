"""P2 parity: whole H3 projections through the ring, every chunk bit-identical to P0 (#39).

The issue's full-projection parity: 37,810 rows of qkv, out and fc1 at blocks 0, 24 and 49 of
the synthetic H3 (models.h3.FULL, seed 0), on the real activations that enter those
projections at step 0 from the seed's noise. Per (block, projection): P0's whole projection
(Nvfp4Linear p0: amax -> g, the whole activation quantized, one gemm_nvfp4 over all rows; for
``out`` with its fused gated residual add, as the model calls it) and, per ring capacity (the
p2 backend's default, 2048, and 512), the same packed weight behind the p2 backend (the ring:
the same g, chunk by chunk into the ring, the whole call's GEMM config on every chunk). fc2 is
pinned to P0 (the seed's rule) and not a case.

Checks, per (block, projection, capacity):
* the chunk plan ends in a partial chunk (37,810 is a multiple of neither 2048 nor 512: 946 and
  434 rows), asserted before any GPU work, so the last partial chunk is always among the rows
  checked;
* every chunk's rows equal P0's bit for bit (bf16 compared as int16, so NaN cannot hide); the
  first differing chunk, its first differing row and the count of differing chunks if not;
* sha256 of the whole P2 output equals that of P0's;
* every element was written: both outputs are stored into caller buffers poisoned first with two
  different NaN patterns (P0 0xFFFF, P2 0x7FC1; Nvfp4Linear's ``out=``), so an unwritten row
  can neither match the other path nor pass unseen (poison left in P0's output is counted), and
  every output is poisoned again before it is freed, so a later output handed the same block by
  the caching allocator cannot pass on stale bits.

The activations: the p0 model's forward from the seed's noise at step 0 (embed, then blocks 0..49
on p0, a recording wrap keeping the inputs of qkv, out and fc1 at the three blocks; block 49 runs
whole, its fc2 included). At full size that is ~50 block forwards, ~0.15-0.2 s each on the H200
(h3-trajectory: 7.7 s a 50-block step, b40ca94), after packing the 50 blocks' weights (~104 s on
that host: the weights are drawn on the CPU generator; ~7.8 GB packed on the GPU, kept). With
``$WB_WEIGHT_CACHE`` the packed weights come from disk where this tree has models.weight_cache
(branch wip/ladder, not on wip/p2 when this was written: then the variable is noted and ignored).

Memory on the H200: packed weights ~7.8 GB, the nine recorded inputs and out's three residuals
~4.9 GB (37,810 x 5,376 bf16, 0.41 GB each), and per case P0's and P2's outputs (qkv: 37,810 x
21,504 bf16, 1.63 GB each); a block's inputs and every output are freed (and the cache emptied)
as soon as its cases are done. Expected runtime on the H200 (estimate, not measured): ~4 min
(weights ~104 s, forwards and first compiles ~1 min, the 27 outputs' sha256 ~28 GB on the host
~30 s); one device call (10 min).

    python3 -m experiments.p2_parity [--quick] [--capacities 2048 512]
    wb run p2-parity [--quick]

``--quick``: the scaled H3 (models.h3.QUICK: 3 blocks, 256 tokens), blocks 0, 1 and 2, a
128-row ring (2 chunks: a chunk boundary crossed) and the default 2048 (one partial chunk).
Summary ``p2-parity.json``: a row per (block, projection, capacity); gates: every case
bit-identical chunk by chunk, checksums equal, every element written, every case run, a partial
last chunk and a chunk boundary covered for each projection.
"""
from __future__ import annotations

import hashlib
import os
import time

import torch

from experiments._common import need_gpu, parser, progress, run_main
from schedules.p2_ring import DEFAULT_CAPACITY, check_capacity, chunk_plan
from workbench import WorkbenchError
from workbench import results as R

NAME = "p2-parity"
PROJECTIONS = ("qkv", "out", "fc1")  # the streamed ones; fc2 stays on P0
FULL_BLOCKS = (0, 24, 49)  # the issue's: first, middle, last of the 50
FULL_CAPACITIES = (DEFAULT_CAPACITY, 512)
QUICK_CAPACITIES = (128, DEFAULT_CAPACITY)  # 256 tokens: 2 chunks of 128; one partial of 256
STEP = 0
# bf16 NaN patterns the outputs are poisoned with (int16 views): different for the two paths,
# so rows neither wrote still differ, and neither is a value a finite projection stores
POISON_P0 = -1  # 0xFFFF
POISON_P2 = 0x7FC1


def parity_blocks(cfg) -> tuple:
    """First, middle and last block of ``cfg``: (0, 24, 49) at full size, (0, 1, 2) quick."""
    return tuple(sorted({0, (cfg.blocks - 1) // 2, cfg.blocks - 1}))


def default_capacities(quick: bool) -> tuple:
    return QUICK_CAPACITIES if quick else FULL_CAPACITIES


def case_list(blocks, capacities, projections=PROJECTIONS) -> list[dict]:
    """Every (block, projection, capacity) the run checks, in the order it runs them."""
    return [{"block": b, "projection": p, "capacity": c}
            for b in blocks for p in projections for c in capacities]


def check_plan(M: int, capacity: int, require_partial: bool):
    """(the ring's chunk plan of rows [0, M), whether its last chunk is partial). The plan must
    tile [0, M) exactly; with ``require_partial`` (the full run: 37,810 rows) its last chunk must
    be partial, so the parity covers one. WorkbenchError otherwise, before any GPU work."""
    try:
        check_capacity(capacity)
    except (TypeError, ValueError) as e:
        raise WorkbenchError(f"capacity: {e}") from None
    plan = chunk_plan(0, M, capacity)
    starts = [c.start for c in plan]
    if (starts != list(range(0, M, capacity)) or plan[-1].stop != M
            or any(c.rows != capacity for c in plan[:-1])):
        raise WorkbenchError(f"the chunk plan of {M} rows at capacity {capacity} does not tile "
                             "the rows")
    partial = plan[-1].rows < capacity
    if require_partial and not partial:
        raise WorkbenchError(f"{M} rows at capacity {capacity}: the plan has no partial last "
                             "chunk, so the parity would not cover one (choose a capacity that "
                             f"does not divide {M})")
    return plan, partial


def poisoned(shape, device, bits: int) -> torch.Tensor:
    """An empty bf16 tensor whose every element holds the NaN pattern ``bits``."""
    t = torch.empty(*shape, dtype=torch.bfloat16, device=device)
    t.view(torch.int16).fill_(bits)
    return t


def poison_and_free(*tensors) -> None:
    """Overwrite outputs with NaN before they are dropped: the caching allocator may hand the
    same block to the next output, which must not find a correct answer waiting there."""
    seen = set()
    for t in tensors:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            t.view(torch.int16).fill_(POISON_P0)


def sha256_hex(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes, row-major (bf16 as stored)."""
    c = t.detach().to("cpu").contiguous()
    return hashlib.sha256(c.view(torch.uint8).numpy()).hexdigest()


def compare_chunks(y: torch.Tensor, want: torch.Tensor, plan) -> dict:
    """Chunk by chunk, bf16 bits (int16 views): the number of chunks, how many differ, the first
    differing chunk with its rows, its first differing row and its differing elements."""
    if tuple(y.shape) != tuple(want.shape):
        return {"chunks": len(plan), "bad_chunks": len(plan), "bad_chunk_indices": [],
                "bit_identical": False,
                "first_bad": {"shape": [list(y.shape), list(want.shape)]}}
    bad, first = [], None
    for ch in plan:
        a = y[ch.start:ch.stop].view(torch.int16)
        b = want[ch.start:ch.stop].view(torch.int16)
        if torch.equal(a, b):
            continue
        bad.append(ch.index)
        if first is None:
            diff = a != b
            row = ch.start + int(diff.any(dim=1).nonzero()[0, 0])
            first = {"chunk": ch.index, "rows": [ch.start, ch.stop], "row": row,
                     "elements": int(diff.sum()), "last_chunk": ch.index == len(plan) - 1}
    return {"chunks": len(plan), "bad_chunks": len(bad), "bad_chunk_indices": bad[:32],
            "bit_identical": not bad, "first_bad": first}


def describe_bad(row: dict) -> str:
    f = row.get("first_bad") or {}
    where = f"block {row['block']} {row['projection']} capacity {row['capacity']}"
    if "chunk" not in f:
        return f"{where}: {f or 'outputs differ'}"
    return (f"{where}: chunk {f['chunk']} rows [{f['rows'][0]}, {f['rows'][1]})"
            f"{' (the last)' if f['last_chunk'] else ''}, first row {f['row']}, "
            f"{f['elements']} elements differ; {row['bad_chunks']} of {row['chunks']} chunks")


def run_cases(runner, inputs: dict, blocks, capacities, *, require_partial: bool,
              projections=PROJECTIONS, say=progress) -> list[dict]:
    """Every case of :func:`case_list`: per (block, projection) P0 once, then P2 at each
    capacity, compared chunk by chunk and by sha256. ``runner``: ``p0(block, role, inp, out)``
    and ``p2(block, role, inp, capacity, out)`` storing into ``out`` and returning it,
    ``sync()``, ``release()`` (free cached memory); ``inputs``: (block, role) -> {"x", "gate",
    "residual"} (a block's entries are dropped once its cases are done)."""
    plans, rows = {}, []
    for block in blocks:
        for role in projections:
            inp = inputs.get((block, role))
            if inp is None:
                raise WorkbenchError(f"no recorded input for block {block} {role}")
            x = inp["x"]
            M = x.shape[0]
            runner.sync()
            t0 = time.perf_counter()
            out0 = poisoned((M, runner.n(block, role)), x.device, POISON_P0)
            want = runner.p0(block, role, inp, out0)
            runner.sync()
            p0_s = time.perf_counter() - t0
            base = {"block": block, "projection": role, "M": M, "N": want.shape[1],
                    "K": x.shape[1], "epilogue": None if inp.get("gate") is None
                    else "gate_residual", "input_sha256": sha256_hex(x),
                    "p0_sha256": sha256_hex(want), "p0_in_out": want is out0,
                    "p0_unwritten": int((want.view(torch.int16) == POISON_P0).sum()),
                    "p0_s": p0_s}
            for cap in capacities:
                if (M, cap) not in plans:
                    plans[M, cap] = check_plan(M, cap, require_partial)
                plan, partial = plans[M, cap]
                out2 = poisoned(tuple(want.shape), x.device, POISON_P2)
                runner.sync()
                t0 = time.perf_counter()
                y = runner.p2(block, role, inp, cap, out2)
                runner.sync()
                p2_s = time.perf_counter() - t0
                cmp = compare_chunks(y, want, plan)
                row = {**base, "capacity": cap, "last_chunk_rows": plan[-1].rows,
                       "partial_last_chunk": partial, **cmp, "p2_sha256": sha256_hex(y),
                       "p2_in_out": y is out2, "p2_s": p2_s}
                row["checksums_equal"] = row["p2_sha256"] == row["p0_sha256"]
                rows.append(row)
                say(f"block {block} {role} capacity {cap}: {cmp['chunks']} chunks (last "
                    f"{plan[-1].rows} rows{', partial' if partial else ''}), "
                    + ("every chunk bit-identical" if cmp["bit_identical"] else describe_bad(row))
                    + f", sha256 {'equal' if row['checksums_equal'] else 'DIFFER'} "
                    f"({row['p2_sha256'][:12]}); p0 {p0_s:.2f} s, p2 {p2_s:.2f} s")
                poison_and_free(y, out2)
                del y, out2
            poison_and_free(want, out0)
            del want, out0
            runner.sync()
        for role in projections:  # the block's activations are no longer needed
            inputs.pop((block, role), None)
        runner.release()
    return rows


def headline_and_gates(rows: list, expected: list, projections=PROJECTIONS) -> tuple:
    """Headline (cases, how many bit-identical, the first failure, P0's checksums) and gates:
    every case bit-identical chunk by chunk, checksums equal, every element written, every
    expected case run, a partial last chunk and a chunk boundary covered per projection."""
    bad = [r for r in rows if not r["bit_identical"]]
    ran = {(r["block"], r["projection"], r["capacity"]) for r in rows}
    want = {(c["block"], c["projection"], c["capacity"]) for c in expected}
    missing = sorted(want - ran)
    unwritten = [r for r in rows if r["p0_unwritten"] or not r["p0_in_out"] or not r["p2_in_out"]]
    sums = [r for r in rows if not r["checksums_equal"]]
    no_partial = [p for p in projections
                  if not any(r["partial_last_chunk"] for r in rows if r["projection"] == p)]
    no_boundary = [p for p in projections
                   if not any(r["chunks"] >= 2 for r in rows if r["projection"] == p)]
    gates = {
        "bit_identical": R.gate(bool(rows) and not bad,
                                f"{len(rows) - len(bad)} of {len(rows)} cases equal to P0 in "
                                "every chunk" + ("" if not bad else ": " + "; ".join(
                                    describe_bad(r) for r in bad[:4]))),
        "checksums_equal": R.gate(bool(rows) and not sums,
                                  f"{len(rows) - len(sums)} of {len(rows)} sha256 equal"),
        "every_element_written": R.gate(
            bool(rows) and not unwritten,
            "both paths stored every element into their poisoned buffers" if not unwritten
            else "; ".join(f"block {r['block']} {r['projection']} capacity {r['capacity']}: "
                           f"{r['p0_unwritten']} P0 elements unwritten, P0 in out "
                           f"{r['p0_in_out']}, P2 in out {r['p2_in_out']}"
                           for r in unwritten[:4])),
        "cases_complete": R.gate(not missing, f"{len(want & ran)} of {len(want)} cases ran"
                                 + (f"; missing {missing[:6]}" if missing else "")),
        "partial_last_chunk": R.gate(bool(rows) and not no_partial,
                                     "every projection checked with a partial last chunk"
                                     if not no_partial else f"none for {no_partial}"),
        "chunk_boundary_crossed": R.gate(bool(rows) and not no_boundary,
                                         "every projection checked over 2+ chunks"
                                         if not no_boundary else f"none for {no_boundary}"),
    }
    headline = {
        "cases": len(rows), "cases_bit_identical": len(rows) - len(bad),
        "all_bit_identical": bool(rows) and not bad and not sums,
        "first_failure": describe_bad(bad[0]) if bad else None,
        "rows": rows[0]["M"] if rows else None,
        "p0_sha256": {f"{r['block']}/{r['projection']}": r["p0_sha256"] for r in rows},
    }
    return headline, gates


class ModelRunner:
    """The GPU side: the p0 model's linears (P0) and the same packed weights behind the p2
    backend at a given ring capacity (P2), both through Nvfp4Linear with ``out=``."""

    def __init__(self, model):
        self.model = model

    def n(self, block, role) -> int:
        return self.model.cfg.shapes()[role][0]

    def p0(self, block, role, inp, out):
        lin = self.model.linears(block)[role]
        return lin(inp["x"], gate=inp["gate"], residual=inp["residual"], out=out)

    def p2(self, block, role, inp, capacity, out):
        lin = self.model.linears(block)[role].with_backend("p2")
        if lin.backend != "p2":
            raise WorkbenchError(f"{role} resolves to {lin.backend}, not the ring")
        lin.ring_capacity = capacity
        return lin(inp["x"], gate=inp["gate"], residual=inp["residual"], out=out)

    def sync(self) -> None:
        torch.cuda.synchronize()

    def release(self) -> None:
        torch.cuda.empty_cache()

    def peak_bytes(self) -> int:
        return torch.cuda.max_memory_allocated()


def capture_inputs(model, blocks, step: int = STEP, projections=PROJECTIONS, say=progress):
    """(block, role) -> {"x", "gate", "residual"}: what ``model``'s forward from the seed's noise
    at ``step`` passes to each projection of ``blocks``; runs blocks 0..max(blocks) only."""
    from models.h3 import initial_latent

    wanted, inputs = set(blocks), {}

    def record(block, role, lin):
        if block not in wanted or role not in projections:
            return lin

        def rec(a, rows=None, *, gate=None, residual=None):
            if rows is not None:
                raise WorkbenchError(f"block {block} {role} was called on a row slice")
            inputs[(block, role)] = {"x": a, "gate": gate, "residual": residual}
            return lin(a, gate=gate, residual=residual)
        return rec

    m = model.derived(wrap=record)
    x = m.embed(initial_latent(m.cfg, m.seed).to(m.device), step)
    t0 = time.perf_counter()
    for i in range(max(blocks) + 1):
        x = m.block(i, x)
        if i in wanted or i % 10 == 9:
            say(f"forward: block {i + 1}/{max(blocks) + 1} ({time.perf_counter() - t0:.1f} s)")
    del x
    missing = [(b, r) for b in blocks for r in projections if (b, r) not in inputs]
    if missing:
        raise WorkbenchError(f"the forward never called {missing}")
    return inputs


def weight_cache_kwargs() -> tuple[dict, str | None]:
    """H3Model's ``weight_cache=`` from $WB_WEIGHT_CACHE where this tree has models.weight_cache
    (wip/ladder's), and a note when the variable is set but cannot be honoured here."""
    env = os.environ.get("WB_WEIGHT_CACHE")
    try:
        from models import weight_cache
    except ImportError:
        return {}, (f"WB_WEIGHT_CACHE={env} ignored: this tree has no models.weight_cache; "
                    "weights packed in process" if env else None)
    cache = weight_cache.from_env()
    return ({} if cache is None else {"weight_cache": cache}), None


def build_runner(cfg, blocks, seed: int):
    """The p0 H3 model on the GPU, its weights packed (blocks 0..max(blocks)), the recorded
    inputs: (runner, inputs, info for the summary)."""
    from models.h3 import H3Model

    kw, note = weight_cache_kwargs()
    if note:
        progress(note)
    model = H3Model(cfg, seed=seed, backend="p0", device="cuda", **kw)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    last = max(blocks)
    for b in range(last + 1):
        model.linears(b)
        if b % 10 == 9 or b == last:
            progress(f"weights of block {b + 1}/{last + 1} packed "
                     f"({time.perf_counter() - t0:.0f} s)")
    pack_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    inputs = capture_inputs(model, blocks)
    torch.cuda.synchronize()
    info = {"weights_pack_s": pack_s, "forward_s": time.perf_counter() - t0,
            "weight_cache": "loaded" if kw else (note or "unset")}
    return ModelRunner(model), inputs, info


def _main(argv) -> int:
    from models.h3 import FULL, QUICK

    p = parser(__doc__.splitlines()[0])
    p.add_argument("--capacities", type=int, nargs="+", default=None,
                   help="ring capacities (multiples of 128; default 2048 512, quick 128 2048)")
    args = p.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    blocks = parity_blocks(cfg)
    caps = tuple(args.capacities or default_capacities(args.quick))
    require_partial = not args.quick
    for c in caps:  # the plans (partial last chunk at full size) before any GPU work
        check_plan(cfg.tokens, c, require_partial)
    cases = case_list(blocks, caps)
    need_gpu(NAME)
    progress(f"{'QUICK' if args.quick else 'FULL'} H3: {cfg.tokens} rows, blocks {blocks}, "
             f"capacities {caps}, {len(cases)} cases")
    runner, inputs, info = build_runner(cfg, blocks, args.seed)
    rows = run_cases(runner, inputs, blocks, caps, require_partial=require_partial)
    headline, gates = headline_and_gates(rows, cases)
    headline["peak_bytes"] = runner.peak_bytes()
    notes = {"method": "P0 (Nvfp4Linear p0, whole projection) against the p2 backend (the "
                       "ring) on the same packed weight and the recorded step-0 activations; "
                       "bf16 outputs compared chunk by chunk as int16 and by sha256; both "
                       "stored into NaN-poisoned buffers"}
    if isinstance(info.get("weight_cache"), str) and info["weight_cache"].startswith("WB_"):
        notes["weight_cache"] = info["weight_cache"]
    summary = R.make_summary(
        NAME, parameters={"config": "QUICK" if args.quick else "FULL", "rows": cfg.tokens,
                          "blocks": list(blocks), "projections": list(PROJECTIONS),
                          "capacities": list(caps), "step": STEP, "seed": args.seed,
                          "backend_reference": "p0", "backend_under_test": "p2"},
        measurements=rows + [{"setup": info}], headline=headline, gates=gates,
        seeds={"model": args.seed}, notes=notes,
        quick=f"QUICK H3, {len(cases)} cases" if args.quick else None)
    path = R.write(summary, args.results_dir)
    print(R.format_table([[r["block"], r["projection"], r["capacity"], r["chunks"],
                           r["last_chunk_rows"], "equal" if r["bit_identical"] else "DIFFER",
                           r["p0_sha256"][:12], r["p2_sha256"][:12]] for r in rows],
                         ["block", "proj", "capacity", "chunks", "last rows", "bits",
                          "p0 sha256", "p2 sha256"]))
    print(f"wrote {path} (verdict {R.verdict_text(summary)})")
    return 0


def main(argv=None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
