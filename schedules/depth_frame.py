"""Static per-CTA task lists for the depth frame, their validator, encoding and a simulator.

One launch runs a whole CodePredictor frame (16 depth positions x 5 layers, 15 heads and draws) on
``grid`` co-resident CTAs in 2-CTA clusters. The host builds everything here once per
(config, row bucket, options); the kernel only walks its CTA's list.

Phases, in dependency order (432 for the 1.7B shapes with pre-projected embedding tables):
``proj`` (P·h, position 0), then for each position p: ``embed`` (p >= 1: draw g_{p-1} from
head p-1's logits unless p == 1, and gather the pre-projected embedding as x_p), 5 layers of
``qkv, attn, o, gateup, down``, and ``head`` (p >= 1); finally ``embed`` 16 draws g15 and adds
its embedding to the Talker sum. 1 + 16·25 + 15 + 16 = 432. With ``norm_once`` (a study switch)
a ``norm`` phase precedes each qkv, gate/up and head phase (175 more: 607): one task an 8-row
group writes its rows' RMS-normalised input once, and the projection waits on it.

Tiles (weights stream through a shared-memory ring of ``ring_pages`` pages of ``page_bytes``):
qkv 32 output features x K 1024 (128 tiles, 16 per kv head: its 2 q heads, k, v); attn one q head
x 8 rows; o and down 16 features, K split across the two CTAs of a cluster (64 tiles, 128 tasks;
rank 1 writes its partial into rank 0's shared memory, rank 0 adds the two in a fixed order,
then stores and signals); gateup 64 weight rows (32 gate + 32 up); head 16 features; proj as o.

Global counters (zeroed by the host before each launch), one per (phase, group):

=================  =============================  ==================================  ===========
counter            writer (one red.release each)  reader (ld.acquire spin)            expected
=================  =============================  ==================================  ===========
qkv, kv head h     qkv tasks of kv head h         attn tasks of q heads 2h, 2h+1      16
                   (``per_head_waits``; else one  (else: every attn task)             (else 128)
                   counter for the phase)
attn               every attn task                o tasks (both ranks); at position   tasks
                                                  0 also position 1's attn tasks
                                                  (``wait2``: the K and V they read)
o, down, proj      rank 0 of each split tile      next phase                          tiles
gateup, head       every task                     next phase                          tasks
norm               every norm task                its projection (qkv, gateup, head)  tasks
embed p            every embed task               qkv of layer 0 at p                 tasks
=================  =============================  ==================================  ===========

Cluster-local waits (shared-memory mbarriers, not global counters): rank 0's split task k waits
for rank 1's partial k; rank 1's split task k waits until rank 0 has consumed partial k - S
(S = ``combine_slots`` buffers), so a live partial is never overwritten.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from configs.arch import SMEM_PER_CTA_MAX
from configs.codepredictor import QWEN3_TTS_1P7B, CodePredictorConfig
from schedules.plan import frame_k_stage

PROJ, QKV, ATTN, O, GATEUP, DOWN, HEAD, EMBED, NORM = range(9)
TYPE_NAMES = ("proj", "qkv", "attn", "o", "gateup", "down", "head", "embed", "norm")
# the projections whose input is RMS-normalised (``norm_once``: a NORM phase before each)
NORMALISED = (QKV, GATEUP, HEAD)
SPLIT_TYPES = (PROJ, O, DOWN)
CHUNKED = (O, DOWN)  # the consumers that may wait per chunk (their inputs are not normalised)
LOCAL_NONE, LOCAL_PARTIAL, LOCAL_SLOT = 0, 1, 2
MAX_COLOCATED = 132  # H200: 132 SMs, one ~213 KB CTA per SM
SMEM_OTHER = 85 * 1024  # activation tiles, combine buffers, barriers (the seed used 213 KB in all)


class ScheduleError(ValueError):
    """A schedule that must not run (the message names the violated rule)."""


@dataclass(frozen=True)
class FrameOptions:
    rows: int = 64
    grid: int = 132
    ring_pages: int = 32
    page_bytes: int = 4096
    per_head_waits: bool = True
    split_o_down: bool = True
    combine_slots: int = 2
    max_tasks_per_cta: int = 512  # capacity of the encoded table the kernel reads
    max_coresident: int = MAX_COLOCATED
    # a study switch (issue #37 item 1, off until measured on the H200): a NORM phase of one
    # task per 8-row group before every normalised projection (qkv, gate/up, head) publishes
    # its normalised input once, and the projection's tiles copy it instead of each
    # normalising all of it again (notes/depth-frame.md, session 21)
    norm_once: bool = False
    # rows an embedding task: 8 (greedy and given draws), or 1 (the sampled draw, whose task
    # draws its row with the whole CTA: notes/depth-frame.md, session 27)
    embed_rows: int = 8
    # per-chunk waits (issue #37 item 5, off until measured on the H200): the attention
    # (positions >= 1) and gate/up phases signal one counter a K chunk of their consumer
    # (schedules.plan.frame_k_stage(rows) elements: one activation stage), and each o / down
    # K stage waits for its own chunk only, so the tile starts while the rest of the producer
    # phase finishes (notes/depth-frame.md, session 28)
    chunk_waits: bool = False


@dataclass
class Phase:
    index: int
    type: int
    layer: int
    pos: int
    n_tiles: int
    out_features: int
    k: int
    split: bool
    counters: list[int] = field(default_factory=list)
    feeds: int = -1  # NORM: the projection type whose input it normalises (the next phase)
    # chunk_waits: K elements of the consumer's input each of ``counters`` covers (counter j:
    # features j·chunk_k ..); 0: the counters are not by chunk
    chunk_k: int = 0

    @property
    def name(self) -> str:
        kind = TYPE_NAMES[self.type] + (f">{TYPE_NAMES[self.feeds]}" if self.type == NORM else "")
        return f"{kind}[l{self.layer},p{self.pos}]"


@dataclass
class Task:
    phase: int
    type: int
    tile: int
    half: int  # -1 unsplit, 0 / 1 = cluster rank of a split tile
    cta: int = -1
    wait: int = -1  # global counter id or -1
    wait_expect: int = 0
    # a second counter (attention at position 1: position 0's attention of the layer, whose
    # K and V it attends over; nothing else orders position 0 before position 1)
    wait2: int = -1
    wait2_expect: int = 0
    local_wait: int = LOCAL_NONE
    local_dep: tuple[int, int] | None = None  # (cta, index) the local wait refers to
    slot: int = -1
    signal: int = -1
    weight_bytes: int = 0
    page_first: int = -1
    n_pages: int = 0
    issue_before: int = -1  # index in this CTA's list before which the weight copy is issued
    chunk_of: list[int] = field(default_factory=list)  # producer tiles this task's K chunks need
    # chunk waits (FrameOptions.chunk_waits): K stage s waits for counter wait + s (consecutive
    # chunk counters of one phase, each expecting wait_expect); 0: one wait before the task
    wait_chunks: int = 0


@dataclass
class Schedule:
    config: CodePredictorConfig
    options: FrameOptions
    phases: list[Phase]
    ctas: list[list[Task]]
    counter_expect: list[int]
    counter_names: list[str]

    @property
    def n_tasks(self) -> int:
        return sum(len(t) for t in self.ctas)


def _phase_list(cfg: CodePredictorConfig, opt: FrameOptions) -> list[Phase]:
    rg = -(-opt.rows // 8)
    h = cfg.hidden
    specs = {  # type: (tiles, out features, K, split)
        PROJ: (h // 16, h, cfg.talker_hidden, opt.split_o_down),
        QKV: (cfg.qkv_dim // 32, cfg.qkv_dim, h, False),
        ATTN: (cfg.q_heads * rg, cfg.q_dim, 0, False),
        O: (h // 16, h, cfg.q_dim, opt.split_o_down),
        GATEUP: (2 * cfg.intermediate // 64, 2 * cfg.intermediate, h, False),
        DOWN: (h // 16, h, cfg.intermediate, opt.split_o_down),
        HEAD: (cfg.vocab // 16, cfg.vocab, h, False),
        EMBED: (rg if opt.embed_rows == 8 else opt.rows, h, 0, False),
        NORM: (rg, h, 0, False),  # one task an 8-row group: all 1024 features of its rows
    }
    phases = []

    def add(t, layer=-1, pos=-1):
        if opt.norm_once and t in NORMALISED:
            n, out, k, split = specs[NORM]
            phases.append(Phase(len(phases), NORM, layer, pos, n, out, k, split, feeds=t))
        n, out, k, split = specs[t]
        phases.append(Phase(len(phases), t, layer, pos, n, out, k, split))

    add(PROJ, pos=0)
    for p in range(cfg.positions):
        if p >= 1:
            add(EMBED, pos=p)
        for layer in range(cfg.layers):
            for t in (QKV, ATTN, O, GATEUP, DOWN):
                add(t, layer, p)
        if p >= 1:
            add(HEAD, pos=p)
    add(EMBED, pos=cfg.positions)
    return phases


def _chunk_k(cfg: CodePredictorConfig, opt: FrameOptions) -> int:
    """K elements of a chunk counter (``chunk_waits``: the consumer's activation stage,
    schedules.plan.frame_k_stage), 0 without chunk waits. Every producer task must write
    within one chunk and every consumer task (half) take whole chunks."""
    if not opt.chunk_waits:
        return 0
    try:
        ks = frame_k_stage(opt.rows)
    except ValueError as e:
        raise ScheduleError(f"chunk_waits: {e}") from None
    halves = 2 if opt.split_o_down else 1
    if ks % cfg.head_dim or ks % 32 or cfg.q_dim % (halves * ks) or \
            cfg.intermediate % (halves * ks):
        raise ScheduleError(f"chunk_waits: chunks of {ks} K elements do not divide the o / "
                            "down tiles or split an attention head or a gate/up tile")
    return ks


def _chunked_producer(ph: Phase) -> bool:
    """Whether ``chunk_waits`` gives ``ph`` one counter a chunk: gate/up, and attention from
    position 1 on (at position 0 it also feeds position 1's attention through ``wait2``,
    which needs the whole phase)."""
    return ph.type == GATEUP or (ph.type == ATTN and ph.pos >= 1)


def _input_features(ph: Phase, cfg: CodePredictorConfig) -> int:
    """Features of the input that ``ph`` (attention or gate/up) writes for its consumer."""
    return cfg.q_dim if ph.type == ATTN else cfg.intermediate


def _written(ph: Phase, cfg: CodePredictorConfig, tile: int) -> tuple[int, int]:
    """[lo, hi) features of the consumer's input that tile ``tile`` of ``ph`` writes:
    attention, its q head's (tile % q_heads); gate/up, its 32 act features."""
    if ph.type == ATTN:
        hq = tile % cfg.q_heads
        return hq * cfg.head_dim, (hq + 1) * cfg.head_dim
    return 32 * tile, 32 * tile + 32


def _chunk_of_tile(ph: Phase, cfg: CodePredictorConfig, tile: int, ks: int) -> int:
    lo, hi = _written(ph, cfg, tile)
    assert lo // ks == (hi - 1) // ks, "a producer task writes within one chunk"
    return lo // ks


def _weight_bytes(ph: Phase, half: int) -> int:
    if ph.type in (ATTN, EMBED, NORM):
        return 0
    per_tile = ph.out_features // ph.n_tiles * ph.k * 2
    return per_tile // 2 if half >= 0 else per_tile


def build(cfg: CodePredictorConfig = QWEN3_TTS_1P7B, options: FrameOptions | None = None
          ) -> Schedule:
    """Phases, tasks, CTA assignment, counters, combine protocol and the weight-ring plan."""
    opt = options or FrameOptions()
    if opt.grid < 2 or opt.grid % 2:
        raise ScheduleError(f"grid {opt.grid}: the frame needs an even number of CTAs (2-CTA "
                            "clusters), at least 2")
    if opt.grid > opt.max_coresident:
        raise ScheduleError(f"grid {opt.grid} exceeds co-residency ({opt.max_coresident} CTAs): "
                            "CTAs that spin on each other must all be resident")
    if not 1 <= opt.rows <= 128:
        raise ScheduleError(f"rows {opt.rows}: buckets are 1..128")
    if opt.ring_pages * opt.page_bytes + SMEM_OTHER > SMEM_PER_CTA_MAX:
        raise ScheduleError(f"ring of {opt.ring_pages} x {opt.page_bytes} B plus "
                            f"{SMEM_OTHER // 1024} KB of other shared memory exceeds "
                            f"{SMEM_PER_CTA_MAX // 1024} KB")
    if opt.embed_rows not in (1, 8):
        raise ScheduleError(f"embed_rows {opt.embed_rows}: 8, or 1 (the sampled draw)")
    phases = _phase_list(cfg, opt)
    ks = _chunk_k(cfg, opt)
    ctas: list[list[Task]] = [[] for _ in range(opt.grid)]
    counter_expect: list[int] = []
    counter_names: list[str] = []

    def new_counter(name, expect):
        counter_expect.append(expect)
        counter_names.append(name)
        return len(counter_expect) - 1

    # counters each phase signals
    for ph in phases:
        if ph.type == QKV and opt.per_head_waits:
            per = ph.n_tiles // cfg.kv_heads
            ph.counters = [new_counter(f"{ph.name}.kv{g}", per) for g in range(cfg.kv_heads)]
        elif ks and _chunked_producer(ph):
            ph.chunk_k = ks
            expect = [0] * (_input_features(ph, cfg) // ks)
            for t in range(ph.n_tiles):
                expect[_chunk_of_tile(ph, cfg, t, ks)] += 1
            ph.counters = [new_counter(f"{ph.name}.c{j}", e) for j, e in enumerate(expect)]
        else:
            ph.counters = [new_counter(ph.name, ph.n_tiles)]

    def producer_of(ph: Phase) -> Phase | None:
        """The phase whose completion this phase waits on (None: host inputs only)."""
        if ph.type == PROJ or (ph.type == EMBED and ph.pos == 1):
            return None
        if opt.norm_once and (ph.type == NORM or ph.type in NORMALISED):
            # a NORM phase waits on what its projection would have; the projection on it
            return _h_writer(ph) if ph.type == NORM else phases[ph.index - 1]
        if ph.type == QKV and ph.layer == 0:
            return next(q for q in phases if q.pos == ph.pos and
                        (q.type == EMBED if ph.pos >= 1 else q.type == PROJ))
        if ph.type == EMBED:
            return next(q for q in phases if q.type == HEAD and q.pos == ph.pos - 1)
        if ph.type == HEAD:
            return next(q for q in phases if q.type == DOWN and q.pos == ph.pos and
                        q.layer == cfg.layers - 1)
        return phases[ph.index - 1]

    def _h_writer(norm: Phase) -> Phase:
        """What the NORM phase's projection would have waited on (the last writer of h)."""
        q = phases[norm.index + 1]
        if q.type == QKV and q.layer == 0:
            return next(x for x in phases if x.pos == q.pos and
                        (x.type == EMBED if q.pos >= 1 else x.type == PROJ))
        return phases[norm.index - 1]  # o (gate/up), down (qkv l >= 1, head)

    cursor = 0
    for ph in phases:
        prod = producer_of(ph)
        made: list[Task] = []
        if ph.split:
            n_clusters = opt.grid // 2
            for t in range(ph.n_tiles):
                c = (cursor + t) % n_clusters
                for half in (0, 1):
                    made.append(Task(ph.index, ph.type, t, half, cta=2 * c + half))
            cursor += ph.n_tiles
        else:
            for t in range(ph.n_tiles):
                made.append(Task(ph.index, ph.type, t, -1, cta=(2 * cursor + t) % opt.grid))
            cursor += ph.n_tiles // 2 + 1
        for task in made:
            ctas[task.cta].append(task)
            task.weight_bytes = _weight_bytes(ph, task.half)
            if ph.split and task.half == 1:
                task.signal = -1  # rank 0 combines and signals
            elif ph.type == QKV and opt.per_head_waits:
                task.signal = ph.counters[task.tile // (ph.n_tiles // cfg.kv_heads)]
            elif ph.chunk_k:
                task.signal = ph.counters[_chunk_of_tile(ph, cfg, task.tile, ph.chunk_k)]
            else:
                task.signal = ph.counters[0]
            if prod is None:
                continue
            if ph.type == ATTN and prod.type == QKV and opt.per_head_waits:
                kv = (task.tile % cfg.q_heads) // (cfg.q_heads // cfg.kv_heads)
                task.wait = prod.counters[kv]
            elif prod.chunk_k:
                # K stage s of the task waits for chunk first + s: its K range's producers
                k_task = ph.k // 2 if task.half >= 0 else ph.k
                task.wait_chunks = k_task // prod.chunk_k
                task.wait = prod.counters[max(task.half, 0) * task.wait_chunks]
            else:
                task.wait = prod.counters[0]
            task.wait_expect = counter_expect[task.wait]
            task.chunk_of = list(range(prod.n_tiles))
            if ph.type == ATTN and ph.pos == 1:
                kv_src = next(q for q in phases if q.type == ATTN and q.pos == 0 and
                              q.layer == ph.layer)
                task.wait2 = kv_src.counters[0]
    # fix signals of split phases: expected count is tiles, signalled by rank 0 only (a split
    # phase has one counter: per-head or chunk counters would need each its own count)
    for ph in phases:
        if ph.split:
            assert len(ph.counters) == 1, f"{ph.name}: a split phase with several counters"
            counter_expect[ph.counters[0]] = ph.n_tiles
    for lst in ctas:
        for task in lst:
            if task.wait >= 0:
                task.wait_expect = counter_expect[task.wait]
                assert all(counter_expect[task.wait + j] == task.wait_expect
                           for j in range(task.wait_chunks)), "chunk counters of one expect"
            if task.wait2 >= 0:
                task.wait2_expect = counter_expect[task.wait2]
    _plan_combine(ctas, opt)
    _plan_ring(ctas, opt)
    return Schedule(cfg, opt, phases, ctas, counter_expect, counter_names)


def _plan_combine(ctas: list[list[Task]], opt: FrameOptions) -> None:
    """Slots and cluster-local waits of split tiles (rank 0 <- rank 1 partials)."""
    for c in range(len(ctas) // 2):
        r0 = [(i, t) for i, t in enumerate(ctas[2 * c]) if t.half == 0]
        r1 = [(i, t) for i, t in enumerate(ctas[2 * c + 1]) if t.half == 1]
        for k, ((i0, t0), (i1, t1)) in enumerate(zip(r0, r1)):
            t0.slot = t1.slot = k % opt.combine_slots
            t0.local_wait, t0.local_dep = LOCAL_PARTIAL, (2 * c + 1, i1)
            if k >= opt.combine_slots:
                t1.local_wait, t1.local_dep = LOCAL_SLOT, (2 * c, r0[k - opt.combine_slots][0])


def _plan_ring(ctas: list[list[Task]], opt: FrameOptions) -> None:
    """Pages of every weight tile in a circular ring, each copy issued as early as pages allow."""
    for lst in ctas:
        last_user = [-1] * opt.ring_pages
        ptr = 0
        for i, task in enumerate(lst):
            if task.weight_bytes == 0:
                continue
            n = -(-task.weight_bytes // opt.page_bytes)
            if n > opt.ring_pages:
                raise ScheduleError(f"{TYPE_NAMES[task.type]} tile needs {n} pages; the ring has "
                                    f"{opt.ring_pages}")
            pages = [(ptr + j) % opt.ring_pages for j in range(n)]
            task.page_first, task.n_pages = ptr % opt.ring_pages, n
            task.issue_before = min(i, max(last_user[p] + 1 for p in pages))
            for p in pages:
                last_user[p] = i
            ptr += n


# --- validation -----------------------------------------------------------------------------
def task_pages(task: Task, ring_pages: int) -> list[int]:
    return [(task.page_first + j) % ring_pages for j in range(task.n_pages)]


def violations(s: Schedule) -> list[str]:
    """Every rule the schedule breaks (empty when it is safe to run)."""
    out: list[str] = []
    opt = s.options
    if opt.grid < 2 or opt.grid % 2 or opt.grid > opt.max_coresident:
        out.append(f"grid {opt.grid} is not an even number of CTAs within co-residency")
    for c, lst in enumerate(s.ctas):
        if len(lst) > opt.max_tasks_per_cta:
            out.append(f"CTA {c} has {len(lst)} tasks; the table holds {opt.max_tasks_per_cta} "
                       "(grid too small for this schedule)")
    # 1. waits matched by exactly the signals they count
    signals = [0] * len(s.counter_expect)
    for lst in s.ctas:
        for t in lst:
            if t.signal >= 0:
                signals[t.signal] += 1
    for cid, (got, want) in enumerate(zip(signals, s.counter_expect)):
        if got != want:
            out.append(f"counter {s.counter_names[cid]} gets {got} signals but expects {want}")
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            for w, e in ((t.wait, t.wait_expect), (t.wait2, t.wait2_expect)):
                if w >= 0 and e != s.counter_expect[w]:
                    out.append(f"CTA {c} task {i} waits for {e} on {s.counter_names[w]}, which "
                               f"gets {s.counter_expect[w]}")
    # 1b. attention at position 1 waits for position 0's attention of its layer (the K and V
    # it attends over); later positions are ordered after earlier ones by the draw chain
    attn0 = {ph.layer: ph.counters[0] for ph in s.phases if ph.type == ATTN and ph.pos == 0}
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            ph = s.phases[t.phase]
            if t.type == ATTN and ph.pos == 1 and t.wait2 != attn0.get(ph.layer):
                out.append(f"CTA {c} task {i}: {ph.name} does not wait for position 0's "
                           "attention of its layer, whose K and V it reads")
    # 1c. norm_once: every normalised projection waits on the NORM phase just before it, and
    # that NORM phase on the writer of h its projection would have waited on
    if opt.norm_once:
        for ph in s.phases:
            if ph.type not in NORMALISED:
                continue
            norm = s.phases[ph.index - 1] if ph.index else None
            if norm is None or norm.type != NORM or norm.feeds != ph.type or (
                    norm.layer, norm.pos) != (ph.layer, ph.pos):
                out.append(f"{ph.name} has no NORM phase before it (norm_once)")
                continue
            for c, lst in enumerate(s.ctas):
                for i, t in enumerate(lst):
                    if t.phase == ph.index and t.wait != norm.counters[0]:
                        out.append(f"CTA {c} task {i}: {ph.name} does not wait for "
                                   f"{norm.name}, which writes its normalised input")
    elif any(ph.type == NORM for ph in s.phases):
        out.append("NORM phases in a schedule built without norm_once")
    # 1d. chunk waits: a chunk counter counts the producer tasks that write its K range; a
    # task waiting on one waits, stage by stage, on exactly the chunks of its own K range;
    # nothing waits on part of a phase otherwise
    out += _chunk_violations(s)
    # 2. weight copies never land on pages a running or waiting task still reads
    for c, lst in enumerate(s.ctas):
        last_user = {}
        for i, t in enumerate(lst):
            if t.n_pages == 0:
                continue
            if not 0 <= t.issue_before <= i:
                out.append(f"CTA {c} task {i}: copy issued before task {t.issue_before}")
            for p in task_pages(t, opt.ring_pages):
                u = last_user.get(p, -1)
                if u >= t.issue_before:
                    out.append(f"CTA {c} task {i}: its copy (issued before task {t.issue_before})"
                               f" overwrites page {p} that task {u} still reads")
                last_user[p] = i
    # 3. a split tile's halves on one cluster; 4. combine buffer never overwritten while live
    halves: dict[tuple[int, int], dict[int, int]] = {}
    for c, lst in enumerate(s.ctas):
        for t in lst:
            if t.half >= 0:
                halves.setdefault((t.phase, t.tile), {})[t.half] = c
    for (ph, tile), h in halves.items():
        if set(h) != {0, 1} or h[0] // 2 != h[1] // 2 or h[0] % 2 != 0 or h[1] % 2 != 1:
            out.append(f"split tile {tile} of phase {ph} is not on ranks 0/1 of one cluster: {h}")
    for c in range(len(s.ctas) // 2):
        r0 = [(i, t) for i, t in enumerate(s.ctas[2 * c]) if t.half == 0]
        r1 = [(i, t) for i, t in enumerate(s.ctas[2 * c + 1]) if t.half == 1]
        if [(t.phase, t.tile) for _, t in r0] != [(t.phase, t.tile) for _, t in r1]:
            out.append(f"cluster {c}: ranks run their split tiles in different orders")
            continue
        for k, (_, t1) in enumerate(r1):
            if k >= opt.combine_slots and (t1.local_wait != LOCAL_SLOT or t1.local_dep !=
                                            (2 * c, r0[k - opt.combine_slots][0])):
                out.append(f"cluster {c}: partial {k} may overwrite slot {t1.slot} while partial "
                           f"{k - opt.combine_slots} is live")
        for k, (_, t0) in enumerate(r0):
            if t0.local_wait != LOCAL_PARTIAL or t0.local_dep != (2 * c + 1, r1[k][0]):
                out.append(f"cluster {c}: rank 0 adds partial {k} without waiting for it")
    # 5. no deadlock for the static per-CTA order
    cyc = _find_cycle(s)
    if cyc:
        out.append(f"deadlock: {cyc}")
    return out


def _chunk_violations(s: Schedule) -> list[str]:
    out: list[str] = []
    cfg = s.config
    owner = {cid: ph for ph in s.phases for cid in ph.counters}
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            ph = s.phases[t.phase]
            pp = owner.get(t.signal)
            if pp is not None and pp.chunk_k:
                lo, hi = _written(pp, cfg, t.tile)
                if t.signal != pp.counters[0] + lo // pp.chunk_k or (hi - 1) // pp.chunk_k != \
                        lo // pp.chunk_k:
                    out.append(f"CTA {c} task {i}: {ph.name} tile {t.tile} writes features "
                               f"{lo}..{hi - 1} but signals {s.counter_names[t.signal]}")
            if t.wait2 >= 0 and owner.get(t.wait2) is not None and owner[t.wait2].chunk_k:
                out.append(f"CTA {c} task {i}: its second wait is one chunk of "
                           f"{owner[t.wait2].name}")
            if t.wait < 0:
                if t.wait_chunks:
                    out.append(f"CTA {c} task {i}: {t.wait_chunks} chunk waits and no counter")
                continue
            pp = owner.get(t.wait)
            if pp is None or not pp.chunk_k:
                if t.wait_chunks > 1:
                    out.append(f"CTA {c} task {i}: {t.wait_chunks} chunk waits on "
                               f"{s.counter_names[t.wait]}, which is not a chunk counter")
                continue
            k_task = ph.k // 2 if t.half >= 0 else ph.k
            first = pp.counters[0] + max(t.half, 0) * k_task // pp.chunk_k
            if ph.type not in CHUNKED or t.wait != first or \
                    t.wait_chunks * pp.chunk_k != k_task:
                out.append(f"CTA {c} task {i}: {ph.name} (half {t.half}) waits on "
                           f"{max(t.wait_chunks, 1)} chunk(s) of {pp.name} from "
                           f"{s.counter_names[t.wait]}, not on the chunks of its K range")
            for j in range(t.wait_chunks):
                if t.wait + j >= len(s.counter_expect) or t.wait_expect != \
                        s.counter_expect[t.wait + j]:
                    out.append(f"CTA {c} task {i}: chunk wait {j} expects {t.wait_expect}, "
                               "not its counter's count")
                    break
    return out


def validate(s: Schedule) -> Schedule:
    v = violations(s)
    if v:
        raise ScheduleError(f"{len(v)} rule(s) broken; first: {v[0]}")
    return s


def dependency_edges(s: Schedule):
    """(from, to) pairs over task nodes (cta, index) and counter nodes ("ctr", id): program
    order, signal -> counter -> wait, and cluster-local waits. Linear in the number of tasks."""
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            if i:
                yield (c, i - 1), (c, i)
            if t.signal >= 0:
                yield (c, i), ("ctr", t.signal)
            for j in range(max(t.wait_chunks, 1) if t.wait >= 0 else 0):
                yield ("ctr", t.wait + j), (c, i)  # a chunked task: each of its chunks
            if t.wait2 >= 0:
                yield ("ctr", t.wait2), (c, i)
            if t.local_dep is not None:
                yield t.local_dep, (c, i)


def topological_order(s: Schedule) -> list | None:
    """Task nodes (cta, index) in an order every dependency respects; None if there is a cycle."""
    indeg: dict = {(c, i): 0 for c, lst in enumerate(s.ctas) for i in range(len(lst))}
    indeg.update({("ctr", k): 0 for k in range(len(s.counter_expect))})
    succ: dict = {n: [] for n in indeg}
    for a, b in dependency_edges(s):
        if a not in indeg or b not in indeg:
            continue
        succ[a].append(b)
        indeg[b] += 1
    ready = [n for n, d in indeg.items() if d == 0]
    order = []
    while ready:
        n = ready.pop()
        order.append(n)
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    if len(order) != len(indeg):
        return None
    return [n for n in order if n[0] != "ctr"]


def _find_cycle(s: Schedule) -> str | None:
    if topological_order(s) is not None:
        return None
    for c, lst in enumerate(s.ctas):  # the common case: waiting on work later on the same CTA
        for i, t in enumerate(lst):
            if t.local_dep and t.local_dep[0] == c and t.local_dep[1] >= i:
                return f"CTA {c} task {i} waits on its own later task {t.local_dep[1]}"
    return "the wait graph has a cycle (some CTA waits on work that transitively waits on it)"


# --- encoding -------------------------------------------------------------------------------
FIELDS = ("type", "phase", "tile", "half", "wait", "wait_expect", "local_wait", "local_dep_cta",
          "local_dep_index", "slot", "signal", "page_first", "n_pages", "issue_before", "wait2",
          "wait2_expect", "wait_chunks")


def encode(s: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """int32 table [grid, max_tasks, len(FIELDS)] (unused rows: type -1) and counts [grid]."""
    opt = s.options
    table = np.full((opt.grid, opt.max_tasks_per_cta, len(FIELDS)), -1, dtype=np.int32)
    counts = np.array([len(lst) for lst in s.ctas], dtype=np.int32)
    if counts.max(initial=0) > opt.max_tasks_per_cta:
        raise ScheduleError(f"a CTA has {counts.max()} tasks; the table holds "
                            f"{opt.max_tasks_per_cta}")
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            dep = t.local_dep or (-1, -1)
            table[c, i] = (t.type, t.phase, t.tile, t.half, t.wait, t.wait_expect, t.local_wait,
                           dep[0], dep[1], t.slot, t.signal, t.page_first, t.n_pages,
                           t.issue_before, t.wait2, t.wait2_expect, t.wait_chunks)
    return table, counts


def decode(table: np.ndarray, counts: np.ndarray) -> list[list[dict]]:
    """Task lists back from the table (for tests): one dict of FIELDS per task."""
    return [[dict(zip(FIELDS, map(int, table[c, i]))) for i in range(int(counts[c]))]
            for c in range(table.shape[0])]
