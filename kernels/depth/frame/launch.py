"""The frame kernel's launch on the host: the checks that must hold before CTAs that wait on each
other launch (:func:`check_launchable`, :func:`check_tile_shapes`) and :class:`ProtocolRun`, the
device buffers of one schedule's launch (kernel.py's FrameKernel, encoded and compiled once)."""
from __future__ import annotations

import numpy as np
import torch

from configs.codepredictor import QWEN3_TTS_1P7B
from device.residency import NotCoResident, check_co_resident
from device.runtime import (cached_compile, cute_modules, current_stream, pointer_args,
                            require_hopper, sm_count)
from device.waits import diagnostics_mailbox, synchronize
from kernels.depth.frame import projection as T
from kernels.depth.frame.kernel import PTRS, STAMPS, FrameBuild, FrameKernel
from kernels.depth.frame.weights import weight_regions
from schedules import depth_frame as F

cutlass, cute = cute_modules()
from cutlass import Int32  # noqa: E402


class FrameRefused(NotCoResident):
    """The launch would not be safe on this machine (the message says why); nothing ran."""


def check_launchable(schedule: F.Schedule) -> None:
    """Everything that must hold before CTAs that wait on each other launch: the schedule
    passes validate(); sm_90; enough SMs; no MPS (which may not co-schedule the whole grid);
    the occupancy API guarantees every cluster resident at once (device.residency). Raises
    ScheduleError or FrameRefused."""
    F.validate(schedule)
    require_hopper()
    grid = schedule.options.grid
    if sm_count() < grid:
        raise FrameRefused(f"the schedule's grid of {grid} CTAs needs {grid} SMs; this GPU has "
                           f"{sm_count()}")
    try:
        check_co_resident(grid, "the schedule's grid", cluster_size=2)
    except FrameRefused:
        raise
    except NotCoResident as e:
        raise FrameRefused(str(e)) from None


def check_tile_shapes(schedule: F.Schedule) -> None:
    """The projection tiles are compiled for the 1.7B shapes and the schedule's split o /
    down / proj (projection.TASK_SHAPES): refuse, before anything runs, a
    schedule whose projection tasks differ (another config, ``split_o_down=False``), since
    the kernel would wait for a partial that never comes and count pages the loader does not."""
    if schedule.config != QWEN3_TTS_1P7B:
        raise ValueError("the frame's projection tiles take the 1.7B CodePredictor shapes only")
    P = schedule.options.page_bytes
    for c, lst in enumerate(schedule.ctas):
        for i, t in enumerate(lst):
            if t.type not in T.TASK_SHAPES:
                continue
            f, k, split = T.TASK_SHAPES[t.type]
            if (t.half >= 0) != split or t.n_pages * P != f * k * 2:
                raise ValueError(
                    f"CTA {c} task {i} ({F.TYPE_NAMES[t.type]}, half {t.half}, {t.n_pages} "
                    f"pages of {P} B) is not the tile the kernel is built for ({f} features x "
                    f"K {k}, {'split' if split else 'whole'})")


def check_chunk_waits(schedule: F.Schedule, kernel: FrameKernel) -> None:
    """A schedule with chunk waits (FrameOptions.chunk_waits: o and down wait per K stage in
    their projection bodies) needs a build with those bodies and the schedule's chunk as its
    K stage; in any other build a chunked task would wait on its first chunk only. Raises
    ValueError."""
    chunked = {(t.type, t.wait_chunks) for lst in schedule.ctas for t in lst
               if t.wait_chunks > 1}
    if not chunked:
        return
    if not (kernel.rows and all(kernel._compiles(ty) for ty, _ in chunked)):
        raise ValueError("a schedule with chunk waits needs the frame built with its o and "
                         "down bodies (they wait per K stage): build it without chunk_waits")
    for ty, n in chunked:
        k = T.TASK_SHAPES[ty][1]
        if k != n * kernel.k_stage:
            raise ValueError(f"{F.TYPE_NAMES[ty]} waits on {n} chunks of its K {k}; the kernel's "
                             f"K stage is {kernel.k_stage}")


class ProtocolRun:
    """Device buffers of one schedule's frame launch (encoded once): ``launch()`` zeroes the
    counters and runs the frame's walk (capturable); ``check()`` reads back what a run must
    leave (every counter at its expected count, no combine mismatch)."""

    def __init__(self, schedule: F.Schedule, *, trace: bool = False, weights=False,
                 table=None, io=None, fused: bool = False, draw: str = "greedy"):
        """``weights``: stream every task's weight tile through the page ring. True: from a
        synthetic buffer laid out like the model's (one copy of each layer's and head's tiles,
        which every position reads again); a uint8 CUDA tensor: those bytes, packed by
        :func:`kernels.depth.frame.weights.pack_frame_weights`. ``io``: (phase table int32
        [phases, len(PHASE_FIELDS)], arena) builds the projection tiles for the schedule's rows
        (projection.py), with real weights (tile studies under A/B run through
        experiments._frame_studies.TileStudyRun)."""
        check_launchable(schedule)
        self.schedule = schedule
        enc, counts = F.encode(schedule) if table is None else table
        dev = "cuda"
        self.table = torch.from_numpy(np.ascontiguousarray(enc)).to(dev)
        self.counts = torch.from_numpy(counts).to(dev)
        self.expect = torch.tensor(schedule.counter_expect, dtype=torch.int32, device=dev)
        self.counters = torch.zeros_like(self.expect)
        self.errors = torch.zeros(2, dtype=torch.int32, device=dev)  # mismatches, claim
        opt = schedule.options
        grid, tasks = opt.grid, opt.max_tasks_per_cta
        self.trace = (torch.zeros(grid, tasks, STAMPS, dtype=torch.int64, device=dev) if trace
                      else None)
        streamed = weights is not False
        if io is not None and not torch.is_tensor(weights):
            raise ValueError("projection tiles (io) need the packed weights")
        if io is not None:
            check_tile_shapes(schedule)
        pages = (opt.ring_pages, opt.page_bytes) if streamed else (0, 0)
        rows = opt.rows if io is not None else 0
        self.kernel = self._frame_kernel(FrameBuild(
            tasks, opt.combine_slots, trace, *pages, rows=rows, fused=fused, draw=draw,
            config=schedule.config, norm_once=opt.norm_once))
        if rows and fused and (draw == "sample") != (opt.embed_rows == 1):
            raise ValueError(f"draw {draw!r} with embedding tasks of {opt.embed_rows} rows: the "
                             "sampled draw takes one row a task (FrameOptions.embed_rows = 1), "
                             "the others 8")
        check_chunk_waits(schedule, self.kernel)
        if opt.norm_once and rows and not self.kernel.norm_once:
            raise ValueError("a norm_once schedule needs the fused frame (its norm tasks "
                             "write the projections' inputs)")
        sources, total, _ = weight_regions(schedule)
        self.weight_bytes_per_frame = int(sum(t.n_pages for lst in schedule.ctas for t in lst)
                                          * opt.page_bytes) if streamed else 0
        self.sources = torch.from_numpy(sources).to(dev)
        if torch.is_tensor(weights):
            if weights.dtype != torch.uint8 or weights.numel() != total:
                raise ValueError(f"weights: {total} packed bytes expected, got "
                                 f"{weights.numel()} of {weights.dtype}")
            self.weights = weights
        else:
            self.weights = torch.empty(total if streamed else 16, dtype=torch.uint8, device=dev)
        if io is not None:
            self.phases, self.arena = io
        else:
            self.phases = torch.zeros(4, dtype=torch.int32, device=dev)
            self.arena = torch.zeros(4, dtype=torch.int32, device=dev)
        tensors = (self.table, self.counts, self.counters, self.errors,
                   self.trace if trace else self.table)
        self.ptrs = (*pointer_args(PTRS[:5], tensors),
                     pointer_args(PTRS[5:6], [diagnostics_mailbox()])[0],
                     *pointer_args(PTRS[6:], (self.weights, self.sources, self.phases,
                                              self.arena)))
        self.scalars = (Int32(grid), Int32(len(schedule.counter_expect)),
                        Int32(self.phases.numel()), Int32(self.arena.numel()))
        # the kernel's class too: a study subclass never reuses the production build
        key = ("frame_kernel", type(self.kernel).__qualname__, tasks, opt.combine_slots, trace,
               *pages, rows, fused, draw, self.kernel.talker_vocab, self.kernel.act_buffers,
               self.kernel.ablate, self.kernel.k_stage, self.kernel.norm_once,
               self.kernel.bodies)
        self.compiled = cached_compile(key, lambda: cute.compile(
            self.kernel, *self.ptrs, *self.scalars, current_stream()))

    def _frame_kernel(self, build: FrameBuild) -> FrameKernel:
        """The kernel this run compiles (a study builds its own:
        experiments._frame_studies.TileStudyRun, FrameStudyRun)."""
        return FrameKernel(build)

    def launch(self):
        self.counters.zero_()
        self.errors.zero_()  # the mismatch count and the timeout claim are per launch
        self.compiled(*self.ptrs, *self.scalars, current_stream())

    def synchronize(self):
        synchronize(self.schedule.counter_names)

    def check(self) -> dict:
        """{"counters_at_expected": bool, "combine_mismatches": int} after a synchronised run."""
        return {"counters_at_expected": bool(torch.equal(self.counters, self.expect)),
                "combine_mismatches": int(self.errors[0].item())}

    def task_stamps(self) -> list[list[tuple]]:
        """Per CTA, per task: STAMPS %globaltimer ns (start, counter waited, stage 0 landed,
        last wgmma retired, ready to signal, signalled; trace builds). "Ready": the tile and
        the cluster handoff are done (rank 1: its slot is free, before it sends). A chunked
        task (FrameOptions.chunk_waits) waits for its first chunk before its "counter waited"
        stamp (traced builds), so its later chunk waits fall in "landing" (the first stages')
        and "compute" (the later stages')."""
        if self.trace is None:
            raise ValueError("built without trace=True")
        host = self.trace.cpu().numpy()
        return [[tuple(int(v) for v in host[c, i]) for i in range(len(lst))]
                for c, lst in enumerate(self.schedule.ctas)]
