"""The depth frame kernel as one persistent launch: its synchronisation protocol, and its tile
work when built for a step's rows.

The frame kernel (issue #26) is a grid of 2-CTA clusters, each CTA walking its static task list
from :mod:`schedules.depth_frame`. This module is that walk: per task, the waits the schedule
gives it, timestamps, its cluster handoff and its signal. The task bodies (projection.py,
attention.py, embedding.py) run between the waits and the signal when the kernel is built with
``rows`` (host.py builds the whole frame so); built without them it is the protocol alone,
which tests the protocol on the H200 (every wait is bounded and reports what it waited on) and
measures the floor that synchronisation alone puts under a frame.

Per task, in thread 0 of each CTA (in the protocol alone, the other threads only take part in
the cluster barriers):

1. ``wait >= 0`` (and ``wait2 >= 0``): spin with ``ld.acquire.gpu`` until global counter
   ``wait`` reaches ``wait_expect`` (then ``wait2`` ``wait2_expect``)
   (:func:`device.waits.wait_counter`: after 2 s it reports the counter's name, the CTA
   and the task, then traps; the first wait of the launch to time out writes the report). A
   chunked task (``wait_chunks`` > 1: o and down with ``FrameOptions.chunk_waits``) skips this
   wait in builds with tiles: its projection body waits for counter ``wait + s`` before it
   copies K stage s (projection.py). Traced builds also wait for the first chunk here, so
   the task's "counter waited" stamp means its first chunk has come; the later chunks' waits
   fall in its "stage 0 landed" and compute stamps.
2. Split tiles (``half`` 0 / 1, the two CTAs of a cluster; their k-th split task uses combine
   slot k % S):
   * rank 1 (``local_wait`` LOCAL_SLOT from k >= S on) waits until rank 0 has consumed partial
     k - S, then writes its "partial" (the task's id) into rank 0's slot with
     ``st.shared::cluster`` and arrives on rank 0's ``partial[slot]`` (release, cluster scope);
   * rank 0 (LOCAL_PARTIAL) waits on ``partial[slot]`` (acquire, cluster scope), checks that
     the slot holds its own task's id (a mismatch counts in ``errors``), and arrives on rank 1's
     ``slot_free[slot]``.
3. ``signal >= 0``: ``red.release.gpu`` adds 1 to counter ``signal``.

With ``weights`` the CTA also streams every task's weight tile through the shared-memory page
ring the schedule plans (``ring_pages`` pages of ``page_bytes``; a tile takes ``n_pages``
consecutive pages in ring order). One thread is the loader (the protocol alone: thread 0 of
warp 1; with tiles: lane 0 of warp 4, thread 128): per page it waits on ``page_empty[p]``,
announces the bytes on ``page_full[p]`` and issues one 1-D bulk copy; it runs ahead of the
tasks as far as free pages allow, since weights never depend on data. Thread 0 waits on
``page_full`` of its task's pages after the counter wait (with tiles, stage by stage: a
page before the first stage that reads it) and arrives on ``page_empty`` once they are read
(the protocol alone: when the task is done; with tiles: after the last stage that reads
each). Page p's k-th use has parity k & 1 on both barriers.

Shared memory: ``partial[S]`` and ``slot_free[S]`` mbarriers (arrive count 1) and S combine
words. Both are armed cluster-wide before the first task, and neither CTA exits before its
peer (closing cluster barrier). Counters start at 0 (the host zeroes them before each launch).
All CTAs must be co-resident: launch.py's :func:`check_launchable` checks the occupancy API
before launching.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from configs.codepredictor import QWEN3_TTS_1P7B
from kernels.depth.draw import RowDraw
from kernels.depth.frame import projection as T
from kernels.depth.frame.attention import AttentionBodies
from kernels.depth.frame.embedding import (ARGMAX_PASSES, DRAW_NOISE, DRAWS, LANES_PER_ROW,
                                          EmbeddingBodies, frame_row_draw)
from kernels.depth.frame.projection import ProjectionBodies
from kernels.depth.frame.table import PHASE_FIELDS, RESID_NONE
from device.ptx import (arrive_cluster_release, bulk_copy_g2s, fence_proxy_async_global,
                                red_release_gpu_add, st_cluster_u32)
from device.runtime import cute_modules, pointer_args
from device.barriers import Barrier
from device.waits import (TIMEOUT_NS, wait_cluster_parity, wait_counter, wait_parity)
from schedules import depth_frame as F
from schedules.plan import FRAME_ACT_BUFFERS, frame_k_stage

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Int64, Uint32  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402

THREADS = 128  # the protocol alone: thread 0 walks, tidx 32 loads
NF = len(F.FIELDS)
COL = {name: i for i, name in enumerate(F.FIELDS)}
NPF = len(PHASE_FIELDS)
PCOL = {name: i for i, name in enumerate(PHASE_FIELDS)}
TASK_ID_BITS = 16  # a task's id in the combine slot: phase << 16 | tile
# trace builds, per task: start, counter waited, stage 0 landed, last wgmma retired, ready to
# signal, signalled (without tiles the middle two equal "counter waited")
STAMPS = 6


@dataclass(frozen=True)
class FrameBuild:
    """What a :class:`FrameKernel` is built for: ``max_tasks`` rows of the encoded table per
    CTA, ``combine_slots`` (S), ``trace`` (six %globaltimer stamps a task: STAMPS), the page
    ring (``ring_pages`` of ``page_bytes``; 0: no weight streaming) and ``rows``: 0 builds the
    protocol alone (thread 0 walks, tidx 32 loads); 1..64 builds the projection tiles for a
    step of that many rows (projection.py); ``fused`` also the attention and embedding bodies
    and the tiles' norm, residual and ssq steps (the real frame's data flow), ``draw`` the
    embedding's draw mode, for ``config``'s shapes (None: the 1.7B CodePredictor's);
    ``norm_once``: the norm tasks' body (schedules.depth_frame.FrameOptions.norm_once)."""
    max_tasks: int
    combine_slots: int
    trace: bool = False
    ring_pages: int = 0
    page_bytes: int = 0
    rows: int = 0
    fused: bool = False
    draw: str = "greedy"
    config: object = None
    norm_once: bool = False


class FrameTensors(NamedTuple):
    """The launch's global tensors (kernel() wraps the pointers once): the encoded table,
    each CTA's task count, the counters, [combine mismatches, timeout claim], the trace
    stamps, the diagnostics mailbox, the weights and each task's offset into them, the phase
    table and the arena. ``claim`` (the timeout claim, errors[1]) is set by _walk for the
    consumer's waits; the loader (_load) makes its own."""
    mTable: cute.Tensor
    mCounts: cute.Tensor
    mCounters: cute.Tensor
    mErrors: cute.Tensor
    mTrace: cute.Tensor
    mailbox: cute.Tensor
    mWeights: cute.Tensor
    mSources: cute.Tensor
    mPhases: cute.Tensor
    mArena: cute.Tensor
    claim: cute.Tensor = None


class FrameSmem(NamedTuple):
    """The CTA's shared memory (kernel() allocates it): the split handoff's ``partial`` and
    ``slot_free`` mbarriers and ``combine`` words (S each), the page ring (``ring``; R
    ``page_full`` / ``page_empty``), the activation stages (``abuf``, ``act_full``), the combine
    slots' fp32 fragments (``parts``), the norm buffers (``rbuf``: row factors, then gamma) and
    the sampled draw's (``dbuf``). A build without them aliases the ring (``dbuf``: None)."""
    partial: object
    slot_free: object
    combine: cute.Tensor
    page_full: object
    page_empty: object
    ring: object
    act_full: object
    abuf: object
    parts: object
    rbuf: object
    dbuf: object = None


class FrameTask(NamedTuple):
    """One task of the walk: its index ``i`` in the CTA's list, its table ``row`` (word
    offset), ``ty``, ``half`` (-1 whole, 0 / 1 a split tile's), ``task_id`` (phase << 16 |
    tile: what the combine slot carries) and its counter wait (``wait``, ``wait_expect``,
    ``wait_chunks``: > 1, the projection body waits for counter wait + s before it copies K
    stage s; schedules.depth_frame.FrameOptions.chunk_waits)."""
    i: Int32
    row: Int32
    ty: Int32
    half: Int32
    task_id: Int32
    wait: Int32
    wait_expect: Int32
    wait_chunks: Int32


class WalkCursor(NamedTuple):
    """The walk's running counts, carried from task to task: ``at`` pages consumed (the
    unwrapped ring position), ``au`` activation stages consumed, ``split`` this CTA's split
    tasks so far (the k of the module docstring). Immutable: a task returns the advanced one
    (a dynamic loop carries plain values, so the walk unpacks it)."""
    at: Int32
    au: Int32
    split: Int32


class PhaseIO(NamedTuple):
    """A task's phase-table words (table.PHASE_FIELDS), read once at the top of the task:
    ``a_word`` and ``y_word`` always, the fused steps' words in ``fused`` builds (else -1 /
    RESID_NONE); the attention and embedding words only where their bodies run
    (:meth:`word`)."""
    mPhases: cute.Tensor
    ph: Int32
    a_word: Int32
    y_word: Int32
    gamma_word: Int32
    ssq_in_word: Int32
    resid_word: Int32
    resid_kind: Int32
    ssq_out_word: Int32

    @staticmethod
    def read(mPhases: cute.Tensor, ph: Int32, fused: bool) -> "PhaseIO":
        a_word = mPhases[ph * NPF + PCOL["a_word"]]
        y_word = mPhases[ph * NPF + PCOL["y_word"]]
        gamma_word, ssq_in_word = Int32(-1), Int32(-1)
        resid_word, resid_kind, ssq_out_word = Int32(-1), Int32(0), Int32(-1)
        if fused:
            gamma_word = mPhases[ph * NPF + PCOL["gamma_word"]]
            ssq_in_word = mPhases[ph * NPF + PCOL["ssq_in_word"]]
            resid_word = mPhases[ph * NPF + PCOL["resid_word"]]
            resid_kind = mPhases[ph * NPF + PCOL["resid_kind"]]
            ssq_out_word = mPhases[ph * NPF + PCOL["ssq_out_word"]]
        return PhaseIO(mPhases, ph, a_word, y_word, gamma_word, ssq_in_word, resid_word,
                       resid_kind, ssq_out_word)

    def word(self, name: str) -> Int32:
        """Another of the phase's words, read where it is used."""
        return self.mPhases[self.ph * NPF + PCOL[name]]


class FrameKernel(ProjectionBodies, AttentionBodies, EmbeddingBodies):
    """Static config: a :class:`FrameBuild`. The K stage is the plan's
    (schedules.plan.frame_k_stage) and the activation buffers FRAME_ACT_BUFFERS.

    Roles with tiles (160 threads): warps 0-3 are one consumer warpgroup that walks the tasks
    together (thread 0 spins on the counters, issues the activation copies and signals; all 128
    run the wgmmas and take part in the split handoff); warp 4's lane 0 is the loader. Thread
    0 does every mbarrier wait and arrive of the walk (the pages, the activation stages, the
    pair's slots), and named barrier 1 (128 threads) passes them on. Arrive counts: ``partial``,
    ``slot_free``, ``page_full``, ``page_empty`` and ``act_full`` 1 (with transaction bytes on
    the full barriers).

    The walk passes its state as a few objects: :class:`FrameTensors` and :class:`FrameSmem`
    (fixed for the launch), a :class:`FrameTask` and its :class:`PhaseIO` (fixed for a task)
    and the :class:`WalkCursor` a task advances."""

    # every wgmma, page wait and output store (a study may leave one out:
    # experiments/_frame_studies.py, TileStudyKernel and FrameStudyKernel)
    ablate = ""
    # the task types whose bodies compile (None: all); a code-size study compiles some only,
    # the others keeping their waits, pages, pair handoff and signal
    # (experiments._frame_studies.FrameStudyKernel)
    bodies = None

    def _compiles(self, ty: int) -> bool:
        return self.bodies is None or ty in self.bodies

    def __init__(self, build: FrameBuild):
        self.build = build
        max_tasks, combine_slots, trace = build.max_tasks, build.combine_slots, build.trace
        ring_pages, page_bytes, rows = build.ring_pages, build.page_bytes, build.rows
        fused, draw, config, norm_once = build.fused, build.draw, build.config, build.norm_once
        if draw not in DRAWS:
            raise ValueError(f"draw {draw!r}: choose from {DRAWS}")
        cfg = config or QWEN3_TTS_1P7B
        scan = 8 * LANES_PER_ROW * ARGMAX_PASSES  # the greedy argmax's columns a pass round
        if fused and rows and draw == "greedy" and cfg.vocab % scan:
            raise ValueError(f"vocab {cfg.vocab}: the greedy draw scans whole rounds of {scan} "
                             "columns")
        self.vocab, self.hidden, self.talker_hidden = cfg.vocab, cfg.hidden, cfg.talker_hidden
        self.draw, self.talker_vocab = draw, cfg.talker_vocab
        self.max_tasks, self.slots, self.trace = max_tasks, combine_slots, trace
        self.pages, self.page_bytes = ring_pages, page_bytes
        self.rows, self.r8 = rows, T.rows8(rows)  # r8: the chunk-major images' row stride
        # fused: the phase table's norm / residual / ssq fields are live (the real frame's
        # data flow); without it only a_word and y_word are read (the projection study)
        self.fused, self.eps = fused and rows > 0, cfg.rms_eps
        # the norm tasks' body (schedules.depth_frame.FrameOptions.norm_once): compiled only
        # for such schedules, so the default build's code stays as measured
        self.norm_once = norm_once and self.fused
        self.act_buffers = 1
        self.k_stage = self._k_stage(rows)
        if rows:
            T.check_rows(rows)
            if page_bytes % T.STEP_BYTES_MAX or ring_pages == 0:
                raise ValueError(f"projection tiles need the weight ring in pages of a multiple "
                                 f"of {T.STEP_BYTES_MAX} B (got {ring_pages} x {page_bytes})")
            odd = [F.TYPE_NAMES[t] for t, (f, k, _) in T.TASK_SHAPES.items()
                   if f * k * 2 % page_bytes or k % self.k_stage]
            if odd:
                raise ValueError(f"pages of {page_bytes} B or K stages of {self.k_stage} do not "
                                 f"divide the {', '.join(odd)} tiles: a tile must be whole "
                                 "pages and whole stages")
            self.act_buffers = FRAME_ACT_BUFFERS
            if T.act_buffers(rows, combine_slots, ring_pages * page_bytes,
                             self.k_stage) < self.act_buffers:
                raise ValueError(f"{self.act_buffers} activation buffers of "
                                 f"{T.act_stage_bytes(rows, self.k_stage)} B do not fit")
            if draw == "sample" and sample_smem_free(rows, combine_slots, ring_pages * page_bytes,
                                                     self.k_stage, self.act_buffers,
                                                     cfg.vocab) < 0:
                raise ValueError(f"the sampled draw's shared memory does not fit at {rows} rows")
        self.walkers = T.CONSUMERS if rows else 1
        self.threads = T.CONSUMERS + 32 if rows else THREADS
        self.loader = T.CONSUMERS if rows else 32

    def _k_stage(self, rows: int) -> int:
        """K elements of an activation stage: the plan's (schedules.plan.frame_k_stage; a tile
        study may choose another, experiments._frame_studies.TileStudyKernel)."""
        return frame_k_stage(rows) if rows else T.K_STAGE

    @cute.jit
    def __call__(self, table: cute.Pointer, counts: cute.Pointer, counters: cute.Pointer,
                 errors: cute.Pointer, trace: cute.Pointer, mailbox_p: cute.Pointer,
                 weights: cute.Pointer, sources: cute.Pointer, phases: cute.Pointer,
                 arena: cute.Pointer, grid: Int32, n_counters: Int32, phase_words: Int32,
                 arena_words: Int32, stream):
        mTable = cute.make_tensor(table, cute.make_layout(grid * self.max_tasks * NF))
        mCounts = cute.make_tensor(counts, cute.make_layout(grid))
        mCounters = cute.make_tensor(counters, cute.make_layout(n_counters))
        # [combine mismatches, timeout claim]
        mErrors = cute.make_tensor(errors, cute.make_layout(2))
        # [grid, max_tasks, STAMPS] %globaltimer stamps (STAMPS says which)
        mTrace = cute.make_tensor(trace, cute.make_layout(grid * self.max_tasks * STAMPS))
        mailbox = cute.make_tensor(mailbox_p, cute.make_layout(8))
        # each task's weight tile: byte offset into ``weights`` (-1: none)
        mSources = cute.make_tensor(sources, cute.make_layout(grid * self.max_tasks))
        mWeights = cute.make_tensor(weights, cute.make_layout(1))
        # per phase: PHASE_FIELDS (its input and output in the arena); the arena in 32-bit words
        mPhases = cute.make_tensor(phases, cute.make_layout(phase_words))
        mArena = cute.make_tensor(arena, cute.make_layout(arena_words))
        self.kernel(mTable, mCounts, mCounters, mErrors, mTrace, mailbox, mWeights,
                    mSources, mPhases, mArena).launch(
            grid=[grid, 1, 1], block=[self.threads, 1, 1], cluster=[2, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mTable: cute.Tensor, mCounts: cute.Tensor, mCounters: cute.Tensor,
               mErrors: cute.Tensor, mTrace: cute.Tensor, mailbox: cute.Tensor,
               mWeights: cute.Tensor, mSources: cute.Tensor, mPhases: cute.Tensor,
               mArena: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        S = self.slots
        alloc = cutlass.memory.SmemAllocator()
        partial = alloc.allocate_tensor(Int64, cute.make_layout(S), 8).iterator
        slot_free = alloc.allocate_tensor(Int64, cute.make_layout(S), 8).iterator
        combine = alloc.allocate_tensor(Int32, cute.make_layout(S), 4)
        R = max(self.pages, 1)
        page_full = alloc.allocate_tensor(Int64, cute.make_layout(R), 8).iterator
        page_empty = alloc.allocate_tensor(Int64, cute.make_layout(R), 8).iterator
        act_full = alloc.allocate_tensor(Int64, cute.make_layout(self.act_buffers), 8).iterator
        ring = alloc.allocate(R * max(self.page_bytes, 16), 1024)
        abuf = ring
        parts = ring
        if cutlass.const_expr(self.rows > 0):
            abuf = alloc.allocate(self.act_buffers * (T.act_stage_bytes(self.rows, self.k_stage)
                                                      + T.ACT_SLACK), 1024)
            parts = alloc.allocate_tensor(Float32, cute.make_layout(S * T.MAX_ROWS * 16),
                                          16).iterator
        rbuf = parts
        if cutlass.const_expr(self.fused):  # the RMSNorm factors of the task's rows
            # the row factors, then the task's gamma (NORM_K bf16) as words
            rbuf = alloc.allocate_tensor(Float32, cute.make_layout(T.MAX_ROWS + T.NORM_K // 2),
                                         16).iterator
        dbuf = None  # the sampled draw's histograms and survivors (RowDraw.allocate)
        if cutlass.const_expr(self.fused and self.draw == "sample"):
            dbuf = frame_row_draw(self.vocab).allocate(alloc)
        if tidx == 0:
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(partial + s, 1)
                cute.arch.mbarrier_init(slot_free + s, 1)
            if cutlass.const_expr(self.pages > 0):
                for p in cutlass.range_constexpr(R):
                    cute.arch.mbarrier_init(page_full + p, 1)
                    cute.arch.mbarrier_init(page_empty + p, 1)
            for b in cutlass.range_constexpr(self.act_buffers):
                cute.arch.mbarrier_init(act_full + b, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()
        g = FrameTensors(mTable, mCounts, mCounters, mErrors, mTrace, mailbox, mWeights,
                         mSources, mPhases, mArena)
        smem = FrameSmem(partial, slot_free, combine, page_full, page_empty, ring, act_full,
                         abuf, parts, rbuf, dbuf)
        if tidx < self.walkers:
            self._walk(cta, g, smem)
        if cutlass.const_expr(self.pages > 0):
            if tidx == self.loader:
                self._load(cta, g, smem)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

    @cute.jit
    def _load(self, cta: Int32, g: FrameTensors, smem: FrameSmem):
        """The loader: every task's pages in ring order, each behind its page_empty."""
        R, P = self.pages, self.page_bytes
        claim = cute.make_tensor(g.mErrors.iterator + 1, cute.make_layout(1))
        at = Int32(0)  # pages issued so far (the ring position, unwrapped)
        for i in cutlass.range(g.mCounts[cta], unroll=1):
            n = g.mTable[(cta * self.max_tasks + i) * NF + COL["n_pages"]]
            if n > 0:
                src = g.mSources[cta * self.max_tasks + i]
                for j in cutlass.range(n, unroll=1):
                    q, use = (at + j) % R, (at + j) // R
                    # the loader's bound outlasts the tasks': a stall is reported by the
                    # task waiting on its counter, not by the loader behind it
                    wait_parity(smem.page_empty + q, (use & 1) ^ 1, Barrier.PAGE_EMPTY, q,
                                g.mailbox, claim, 2 * TIMEOUT_NS)
                    cute.arch.mbarrier_arrive_and_expect_tx(smem.page_full + q, P)
                    bulk_copy_g2s(smem.ring + q * P, g.mWeights.iterator + src + Int64(j) * P, P,
                                  smem.page_full + q)
                at = at + n

    @cute.jit
    def _walk(self, cta: Int32, g: FrameTensors, smem: FrameSmem):
        """This CTA's tasks in order (every walker thread; thread 0 waits and signals)."""
        tidx, _, _ = cute.arch.thread_idx()
        R = self.pages
        g = g._replace(claim=cute.make_tensor(g.mErrors.iterator + 1, cute.make_layout(1)))
        # locals, not g's fields, in the loop: a tensor stored to in a dynamic loop is carried
        # by it, and a field's store would carry the whole of g
        mTable, mTrace, mailbox, claim = g.mTable, g.mTrace, g.mailbox, g.claim
        # the WalkCursor's counts: a dynamic loop carries plain values
        at = Int32(0)  # pages consumed so far (unwrapped ring position)
        au = Int32(0)  # activation stages consumed so far (tiles)
        split = Int32(0)  # this CTA's split tasks so far: the k of the module docstring
        for i in cutlass.range(g.mCounts[cta], unroll=1):
            row = (cta * self.max_tasks + i) * NF
            stamp = (cta * self.max_tasks + i) * STAMPS
            t_start = cute.arch.globaltimer()
            wait = mTable[row + COL["wait"]]
            wait_expect = mTable[row + COL["wait_expect"]]
            wait2 = mTable[row + COL["wait2"]]
            up_front = wait >= 0
            wait_chunks = Int32(0)
            if cutlass.const_expr(self.rows > 0):
                # a chunked task (o, down) waits per K stage in its projection body instead
                # (ProtocolRun refuses chunked schedules in builds without those bodies)
                wait_chunks = mTable[row + COL["wait_chunks"]]
                up_front = up_front & (wait_chunks <= 1)
            if tidx == 0:
                if up_front:
                    wait_counter(g.mCounters, wait, wait_expect, i, mailbox, claim)
                if cutlass.const_expr(self.trace and self.rows > 0):
                    # a traced chunked task waits for its first chunk here too, so its
                    # "counter waited" stamp means that chunk has come (the body's own wait
                    # for it then passes at once); untraced builds keep the wait in the body
                    if wait_chunks > 1:
                        wait_counter(g.mCounters, wait, wait_expect, i, mailbox, claim)
                if wait2 >= 0:  # attention at position 1: position 0's K and V too
                    wait_counter(g.mCounters, wait2, mTable[row + COL["wait2_expect"]], i,
                                 mailbox, claim)
            t_waited = cute.arch.globaltimer()
            if tidx == 0:
                if cutlass.const_expr(self.rows > 0):
                    # this task's activation copies (async proxy) read what the signallers'
                    # generic stores wrote
                    fence_proxy_async_global()
            ty = mTable[row + COL["type"]]
            half = mTable[row + COL["half"]]
            task_id = (mTable[row + COL["phase"]] << TASK_ID_BITS) | mTable[row + COL["tile"]]
            task = FrameTask(i, row, ty, half, task_id, wait, wait_expect, wait_chunks)
            n = mTable[row + COL["n_pages"]]
            t_ready = t_start
            t_landed, t_computed = t_waited, t_waited
            if cutlass.const_expr(self.rows > 0):
                cur, t_landed, t_computed, t_ready = self._tile_task(
                    task, WalkCursor(at, au, split), g, smem)
                at, au, split = cur
                # every thread's output stores are ordered for the next phases' bulk copies
                fence_proxy_async_global()
                cute.arch.barrier(barrier_id=T.CONSUMER_BARRIER, number_of_threads=T.CONSUMERS)
            else:
                at, split, t_ready = self._pages_only(task, n, at, split, g, smem)
            if tidx == 0:
                signal = mTable[row + COL["signal"]]
                if signal >= 0:
                    red_release_gpu_add(g.mCounters.iterator + signal, Int32(1))
                if cutlass.const_expr(self.trace):
                    mTrace[stamp] = t_start
                    mTrace[stamp + 1] = t_waited
                    mTrace[stamp + 2] = t_landed
                    mTrace[stamp + 3] = t_computed
                    mTrace[stamp + 4] = t_ready
                    mTrace[stamp + 5] = cute.arch.globaltimer()

    @cute.jit
    def _send_partial(self, task: FrameTask, split: Int32, acc, g: FrameTensors,
                      smem: FrameSmem):
        """Rank 1 of a split tile: once rank 0 has consumed partial split - S from the slot,
        the fragment (with tiles) and the task's id into rank 0's slot, then arrive. Returns
        the %globaltimer when the slot was free (the task's "ready" stamp)."""
        S = self.slots
        slot, use = split % S, split // S
        tidx, _, _ = cute.arch.thread_idx()
        if split >= S:
            if tidx == 0:
                wait_cluster_parity(smem.slot_free + slot, (use - 1) & 1, Barrier.SLOT, slot,
                                    task.i, split, g.mailbox, g.claim)
        t_ready = cute.arch.globaltimer()
        if cutlass.const_expr(acc is not None):
            cute.arch.barrier(barrier_id=T.CONSUMER_BARRIER, number_of_threads=T.CONSUMERS)
            self._send_fragment(smem.parts, slot, acc)
            # every thread's fragment stores precede thread 0's release
            cute.arch.barrier(barrier_id=T.CONSUMER_BARRIER, number_of_threads=T.CONSUMERS)
        if tidx == 0:
            st_cluster_u32(smem.combine.iterator + slot, Int32(0), task.task_id)
            arrive_cluster_release(smem.partial + slot, Int32(0))
        return t_ready

    @cute.jit
    def _receive_partial(self, task: FrameTask, split: Int32, acc, g: FrameTensors,
                         smem: FrameSmem):
        """Rank 0 of a split tile: wait for the pair's partial, add it (with tiles), check the
        slot's task id and free the slot. Returns the combined sums (tiles) or None."""
        S = self.slots
        slot, use = split % S, split // S
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            wait_cluster_parity(smem.partial + slot, use & 1, Barrier.PARTIAL, slot, task.i,
                                split, g.mailbox, g.claim)
        out = acc
        if cutlass.const_expr(acc is not None):
            # thread 0's acquire is every thread's: the barrier orders their reads after it
            cute.arch.barrier(barrier_id=T.CONSUMER_BARRIER, number_of_threads=T.CONSUMERS)
            out = self._add_fragment(smem.parts, slot, acc)
            # every thread has read the slot before rank 1 may overwrite it
            cute.arch.barrier(barrier_id=T.CONSUMER_BARRIER, number_of_threads=T.CONSUMERS)
        if tidx == 0:
            if smem.combine[slot] != task.task_id:  # the pair ran its split tiles out of step
                cute.arch.atomic_add(g.mErrors.iterator.llvm_ptr, Int32(1))
            arrive_cluster_release(smem.slot_free + slot, Int32(1))
        return out

    @cute.jit
    def _tile_task(self, task: FrameTask, cur: WalkCursor, g: FrameTensors, smem: FrameSmem):
        """One task's tile by its type (attention and embedding in ``fused`` builds whose phase
        table gives them inputs; otherwise those tasks only wait and signal). Returns the
        advanced cursor, the stage-0 landed and last-wgmma stamps, and the task's "ready" stamp
        (its tile done; rank 1: its slot free; rank 0: the pair's partial added)."""
        ty, half = task.ty, task.half
        mArena = g.mArena
        # the cursor as plain values: the type branches below are dynamic ifs that carry them
        at, au, split = cur
        ph = g.mTable[task.row + COL["phase"]]
        tile = g.mTable[task.row + COL["tile"]]
        io = PhaseIO.read(g.mPhases, ph, self.fused)
        t_ready = cute.arch.globaltimer()
        t_landed, t_computed = t_ready, t_ready
        if cutlass.const_expr(self.fused):  # attention and embedding (when the table has them)
            if cutlass.const_expr(self._compiles(F.ATTN)):
                if ty == F.ATTN:
                    if io.a_word >= 0:
                        # thread 0's counter wait is every thread's
                        cute.arch.barrier(barrier_id=T.CONSUMER_BARRIER,
                                          number_of_threads=T.CONSUMERS)
                        self._attention_task(tile, mArena, io.a_word, io.y_word, io.gamma_word,
                                             io.word("kv_word"), io.word("rope_word"),
                                             io.word("slot"))
                    t_ready = cute.arch.globaltimer()
                    t_landed, t_computed = t_ready, t_ready
            if cutlass.const_expr(self.norm_once and self._compiles(F.NORM)):
                if ty == F.NORM:
                    cute.arch.barrier(barrier_id=T.CONSUMER_BARRIER,
                                      number_of_threads=T.CONSUMERS)
                    self._norm_task(tile, mArena, io.a_word, io.y_word, io.gamma_word,
                                    io.ssq_in_word, smem.rbuf)
                    t_ready = cute.arch.globaltimer()
                    t_landed, t_computed = t_ready, t_ready
            if cutlass.const_expr(self._compiles(F.EMBED)):
                if ty == F.EMBED:
                    code_word = io.word("code_word")
                    if code_word >= 0:
                        cute.arch.barrier(barrier_id=T.CONSUMER_BARRIER,
                                          number_of_threads=T.CONSUMERS)
                        self._embedding_task(tile, mArena, io.a_word, io.y_word,
                                             io.ssq_out_word, code_word, io.word("group"),
                                             io.word("table_word"), io.word("talker_word"),
                                             io.word("sum_word"), smem.dbuf)
                    t_ready = cute.arch.globaltimer()
                    t_landed, t_computed = t_ready, t_ready
        # one mainloop a tile width (its K stages a runtime loop) and the epilogue by type
        # within it; the first copies and the norm factors once for every width: the frame's
        # speed follows its code size (notes/depth-frame.md, session 28)
        compiled = [t for t in T.PROJECTION_TYPES if self._compiles(t)]
        if cutlass.const_expr(len(compiled) > 0):
            is_projection = ty == compiled[0]
            k_task = Int32(T.TASK_SHAPES[compiled[0]][1])
            for t in compiled[1:]:
                is_projection = is_projection | (ty == t)
                k_task = cutlass.select_(ty == t, Int32(T.TASK_SHAPES[t][1]), k_task)
            # a split tile's half reads its K range of the input (32-bit words)
            a0 = io.a_word + cutlass.select_(half > 0, half, Int32(0)) * (k_task * self.r8 // 2)
            if is_projection:
                self._first_stages(k_task // self.k_stage, a0, au, task, g, smem)
                if cutlass.const_expr(self.fused):
                    if io.gamma_word >= 0:  # the rows' norm factors, while stage 0's copy lands
                        self._row_factors(mArena, io.ssq_in_word, io.gamma_word, smem.rbuf,
                                          cute.recast_ptr(smem.rbuf + T.MAX_ROWS, dtype=Uint32))
        for w in cutlass.range_constexpr(len(T.TILE_WIDTHS)):
            f = T.TILE_WIDTHS[w]
            types = [t for t in T.PROJECTION_TYPES if T.TASK_SHAPES[t][0] == f
                     and self._compiles(t)]
            if cutlass.const_expr(len(types) > 0):
                is_f = ty == types[0]
                for t in types[1:]:
                    is_f = is_f | (ty == t)
                if is_f:
                    k = k_task
                    stages = k // self.k_stage
                    acc, t_landed, t_computed = self._mainloop(f, stages, a0, at, au,
                                                               io.gamma_word >= 0, task, g,
                                                               smem)
                    t_ready = cute.arch.globaltimer()
                    if cutlass.const_expr(f == 64):  # gate/up
                        self._store_swiglu(mArena, io.y_word, tile, acc)
                    else:
                        split_types = [t for t in types if T.TASK_SHAPES[t][2]]
                        if cutlass.const_expr(len(split_types) > 0):
                            if half == 1:
                                t_ready = self._send_partial(task, split, acc, g, smem)
                            elif half == 0:
                                y = self._receive_partial(task, split, acc, g, smem)
                                t_ready = cute.arch.globaltimer()
                                if cutlass.const_expr(self.fused):
                                    if io.resid_kind != RESID_NONE:
                                        self._store_residual(mArena, io.y_word, io.resid_word,
                                                             io.resid_kind, io.ssq_out_word,
                                                             tile, y)
                                    else:
                                        self._store_pairs(mArena, io.y_word, tile * f, y)
                                else:
                                    self._store_pairs(mArena, io.y_word, tile * f, y)
                            else:
                                self._store_pairs(mArena, io.y_word, tile * f, acc)
                            split = split + cutlass.select_(half >= 0, Int32(1), Int32(0))
                        else:
                            self._store_pairs(mArena, io.y_word, tile * f, acc)
                    at = at + f * k * 2 // self.page_bytes
                    au = au + stages
        for kind in cutlass.range_constexpr(len(T.PROJECTION_TYPES)):
            t = T.PROJECTION_TYPES[kind]
            if cutlass.const_expr(not self._compiles(t)):
                if ty == t:
                    f, k, _ = T.TASK_SHAPES[t]
                    at, split, t_ready = self._pages_only(task, Int32(f * k * 2 // self.page_bytes),
                                                          at, split, g, smem)
        return WalkCursor(at, au, split), t_landed, t_computed, t_ready

    @cute.jit
    def _pages_only(self, task: FrameTask, n: Int32, at: Int32, split: Int32,
                    g: FrameTensors, smem: FrameSmem):
        """A task without a tile body (the protocol alone, or a projection whose body a
        code-size study left out): its ``n`` pages land, its split pair hands over (no
        fragment), and the pages go back. Returns the advanced (at, split) and the "ready"
        stamp."""
        R = self.pages
        page_full, page_empty = smem.page_full, smem.page_empty
        mailbox, claim, half = g.mailbox, g.claim, task.half
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(R > 0):  # the tile's weights have landed
            if tidx == 0:
                for j in cutlass.range(n, unroll=1):
                    wait_parity(page_full + (at + j) % R, ((at + j) // R) & 1,
                                Barrier.PAGE_FULL, (at + j) % R, mailbox, claim)
        # (the tile's wgmmas would read the pages here: a split tile's half makes its partial)
        t_ready = cute.arch.globaltimer()
        if half == 1:
            t_ready = self._send_partial(task, split, None, g, smem)
            split = split + 1
        elif half == 0:
            self._receive_partial(task, split, None, g, smem)
            t_ready = cute.arch.globaltimer()
            split = split + 1
        if cutlass.const_expr(R > 0):  # (the epilogue has run) the pages go back
            if tidx == 0:
                for j in cutlass.range(n, unroll=1):
                    cute.arch.mbarrier_arrive(page_empty + (at + j) % R)
            at = at + n
        return at, split, t_ready


def sample_smem_free(rows: int, combine_slots: int, ring_bytes: int, k_stage: int,
                     act_buffers: int, vocab: int) -> int:
    """Shared memory left in a sampled frame build (bytes; < 0: it does not fit): the limit less
    the reserve, the ring, the combine slots, the norm buffers, the activation buffers and the
    sampled draw's (RowDraw.smem_bytes)."""
    from configs.arch import SMEM_PER_CTA_MAX

    used = (T.SMEM_RESERVE + ring_bytes + combine_slots * T.MAX_ROWS * 16 * 4
            + (T.MAX_ROWS + T.NORM_K // 2) * 4
            + act_buffers * (T.act_stage_bytes(rows, k_stage) + T.ACT_SLACK)
            + RowDraw.smem_bytes(vocab, T.CONSUMERS, DRAW_NOISE))
    return SMEM_PER_CTA_MAX - used


PTRS = ((Int32, 16), (Int32, 16), (Int32, 16), (Int32, 4), (Int64, 16), (Int32, 4),
        (cutlass.Uint8, 16), (Int64, 16), (Int32, 16), (cutlass.Uint32, 16))
# table, counts, counters, errors, trace (int64 stamps), diagnostics mailbox, weights (bytes),
# each task's weight offset, the phases' arena offsets, the arena (32-bit words)


def compile_args(grid: int = 132, counters: int = 500):
    """Arguments for cute.compile offline (placeholder addresses, never dereferenced)."""
    return (*pointer_args(PTRS), Int32(grid), Int32(counters), Int32(1 << 12), Int32(1 << 28),
            make_fake_stream())
