"""The block-scaled NVFP4 GEMM shell for sm_90a: a persistent, warp-specialised CTA that runs
role modules.

    D[m, n] = RN_bf16(alpha · Σ_k a[m,k] w[n,k]),  a = e2m1·sA, w = e2m1·sW,  alpha = gA·gW (fp32)

``a`` is the activation (M token rows), ``w`` the weight (N rows); both are NVFP4 with
E4M3 block scales of 16 and an fp32 tensor scale.

The shell owns the CTA: it allocates each module's shared storage, creates and initialises the
mbarriers the modules declare (each arrive count is the sum of the arrivals the modules declare
on it), builds the persistent tile schedule (:mod:`device.tiles`, grid = min(tiles, SMs)) and
dispatches warpgroups to roles. Every role runs its own loop over the same tile sequence
(``device.tiles.for_each_tile``). The epilogue (:mod:`epilogues`, one signature) is called by
the consumer after each tile.

The role contract: a role module declares its warpgroups and registers, the barriers it owns,
arrives on and waits on, its shared storage, and ``run(ctx, thread)`` (ctx: a
:class:`ShellContext`). What it needs of another module is part of its static config, set when
it is built: the readers of the packed ring its depth (``stages``), the swap-AB consumer the
activation stage's f16 tiles (``act_tiles``), the epilogue the consumer's thread count. When
the shell is built it checks, before anything compiles, that the barriers balance (a barrier
nobody arrives on or waits on is an error: :func:`check_roles`) and that these facts agree
(:func:`check_links`).

Designs (the module sets; notes/p0-gemm.md has their measurements). Every production build
reads the activation's exact f16 expansion (the ``a`` buffer, f16 [M, K]) and the weight's
register-order prepack (kernels/nvfp4/prepack.py); the designs that expanded the packed
activation in every CTA (``p0``, the packed ``swap_ab``) lost to them and left the code
(notes/p0-gemm.md, session 27):

``swap_ab_f16`` (:meth:`BlockscaledGemmSm90.swap_ab_f16`; at small M), 512 threads: weights on
wgmma's M side as the register-sourced A operand, tokens on N:
  ==========  ===========  ====  =======================================================
  role        warpgroups   regs  module
  producer    0 (warp 0)   24    :class:`producers.register_order.WeightsOnlyRegisterOrderProducer`
  activation  1 (warp 0)   24    :class:`producers.activation_stage.F16TmaActivationStage`
  consumer    2-3          200   :class:`consumers.register_a_wgmma.RegisterAWgmmaConsumer`
  ==========  ===========  ====  =======================================================
  weight ring  full[s]: 1 arrive + bytes; empty[s]: 8 (consumer warps)
  f16 tiles    act_full[b]: 1 arrive + bytes (TMA); act_empty[b]: 8 (consumer warps)

``wide_f16`` (:meth:`BlockscaledGemmSm90.wide_f16`; at large M), 384 threads, 256 tokens a CTA:
  ==========  ============  ====  ======================================================
  role        warpgroups    regs  module
  producer    0 (warps 0-1) 40    :class:`producers.activation_stage.WeightsAndF16Producer`
  consumer    1-2           232   :class:`consumers.register_a_wgmma.PipelinedRegisterAWgmmaConsumer`
  ==========  ============  ====  ======================================================
  weight ring  full[s]: 1 arrive + bytes; empty[s]: 8 (consumer warps)
  f16 tiles    act_full[b]: 1 arrive + bytes (TMA); act_empty[b]: 8 (consumer warps)

``wide_f16_queue`` (:meth:`BlockscaledGemmSm90.wide_f16_queue`; P2's persistent work queue,
producers/ring_queue.py), 384 threads and ``producers`` extra CTAs at the grid's start:
  ==========  ===========  ====  =======================================================
  role        warpgroups   regs  module
  producer    0 (warps 0-1) 40   :class:`producers.ring_queue.RingWeightsAndF16Producer`
  consumer    1-2          232   :class:`consumers.register_a_wgmma.RingReleasingConsumer`
  quantizer   whole CTA    168   ``RingWeightsAndF16Producer.quantize_chunks`` (the first CTAs)
  ==========  ===========  ====  =======================================================
  weight ring  full[s]: 1 arrive + bytes; empty[s]: 8 (consumer warps)
  f16 tiles    act_full[b]: 1 arrive + bytes (TMA of the f16 ring); act_empty[b]: 8
  global       ready[c]: one per quantizer CTA; done[c]: one per tile (consumer thread 0)

Studies live beside the production classes and only scripts/ and tests build them:
:class:`P0Variant` (measurement and fault-injection builds), :class:`V3Study` and
:class:`P1Study`. schedules/plan.py says which config runs per problem.

Schedules (:mod:`device.tiles`): ``splits`` equal K splits a tile, or stream-K (``stream_k``,
swap-AB: every CTA the same share of all tiles' k-blocks, a cut tile's segments reduced in K
order by the epilogue).

No CTA waits on a CTA outside its cluster (split-K's last CTA only counts arrivals; a cluster's
CTAs are co-scheduled by the hardware), so the persistent grid needs no co-residency guarantee.
Every mbarrier wait is bounded (:mod:`device.waits`): a stalled barrier traps with a report
naming it (:class:`device.barriers.Barrier`).
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

from configs.arch import K_BLOCK, SMEM_PER_CTA_MAX, WARPGROUP
from consumers.register_a_wgmma import (GroupedRegisterAWgmmaConsumer,
                                         PeerFedRegisterAWgmmaConsumer,
                                         PipelinedRegisterAWgmmaConsumer, RegisterAWgmmaConsumer,
                                         RingReleasingConsumer)
from device import ffi
from device.runtime import cute_modules, pointer_args
from device.tiles import StreamKSchedule, TileLoop, TileSchedule, max_stream_k_segments
from epilogues import EpilogueOperands
from epilogues.tile_store import (CLUSTER_SPLITS, SPLIT_FIXUPS, ClusterSplitStore,
                                  SplitFixupStudy, TileStore, workspace_floats)
from producers.activation_stage import (ClusterQuantizingActivationStage, F16TmaActivationStage,
                                        QuantizingActivationStage, WeightsAndF16Producer)
from producers.register_order import Bf16RegisterOrderProducer, WeightsOnlyRegisterOrderProducer
from producers.ring_queue import TOKENS as TOKENS_QUEUE
from producers.ring_queue import RingWeightsAndF16Producer

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Int64, Uint8, Uint32  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402
from cutlass.memory import SmemAllocator  # noqa: E402

REGISTER_FILE = 65536  # 32-bit registers per SM


class ShellContext(NamedTuple):
    """What every role's ``run`` receives (device side): every module's shared storage and
    barriers by name, the producer's global views, the tile loop, the epilogue and its operands.
    What a role needs to know of another role (the ring depth, the f16 tiles, the consumer's
    threads) is not here: the role is built with it, and the shell checks that they agree
    (:func:`check_links`)."""
    smem: dict        # name -> shared-memory tensor (every module's)
    bars: dict        # name -> mbarrier array pointer
    tma: list         # the producer's TMA atoms and global tensors
    globals: tuple    # the producer's other global views (e.g. prepacked weights)
    tiled_mma: object
    epilogue: object  # the TileStore the consumer calls after each tile
    epi: object       # EpilogueOperands
    mailbox: object
    tiles: object     # device.tiles.TileLoop: the schedule and the K blocking
    scales: object = None  # (g_a, g_b): the tensor scales, one-element fp32 tensors


def _module_key(module) -> tuple:
    """A module's identity for the compile cache: its class and its static config (instance
    attributes, which must be hashable)."""
    cls = type(module)
    state = tuple(sorted(vars(module).items()))
    try:
        hash(state)
    except TypeError as e:
        raise TypeError(f"{cls.__qualname__}'s attributes must be hashable to key the compile "
                        f"cache: {e}") from None
    return (cls.__module__, cls.__qualname__, state)


def check_roles(roles) -> dict:
    """The barrier table {name: (stages, arrive count, arrivers, waiters)} of ``roles``; raises
    ValueError when a barrier has no owner, no arrival or no waiter, or the register budget
    does not fit the SM."""
    owned = {}
    for r in roles:
        for name, n in r.barriers().items():
            if name in owned:
                raise ValueError(f"barrier {name!r} declared by two roles")
            owned[name] = (n, type(r).__name__)
    table = {name: [n, 0, [], []] for name, (n, _) in owned.items()}
    for r in roles:
        for name, count in r.arrivals().items():
            if name not in table:
                raise ValueError(f"{type(r).__name__} arrives on {name!r}, which no role owns")
            table[name][1] += count
            table[name][2].append(type(r).__name__)
        for name in r.waits():
            if name not in table:
                raise ValueError(f"{type(r).__name__} waits on {name!r}, which no role owns")
            table[name][3].append(type(r).__name__)
    for name, (_, count, arrivers, waiters) in table.items():
        if not count or not waiters:
            raise ValueError(f"barrier {name!r} has {count} arrivals and waiters {waiters}: "
                             "it would never complete or never be used")
    regs = sum(r.warpgroups * WARPGROUP * r.regs for r in roles)
    if regs > REGISTER_FILE:
        raise ValueError(f"roles ask for {regs} registers (> {REGISTER_FILE}): "
                         + ", ".join(f"{type(r).__name__} {r.warpgroups}x128x{r.regs}"
                                     for r in roles))
    return {k: tuple(v) for k, v in table.items()}


def check_links(producer, activation, consumer, epilogue) -> None:
    """What one module was built to expect of another, checked before compiling (a mismatch
    compiles to a kernel that hangs, races or reads the wrong bytes); raises ValueError. Every
    reader of the packed ring was built for the producer's ring depth; the consumer for the
    activation stage's f16 tiles and its CTAs; the epilogue for the consumer's thread count, on
    a named barrier the consumer does not use."""
    for r in (activation, consumer):
        if r is not None and r.stages != producer.stages:
            raise ValueError(f"{type(r).__name__} reads a ring of {r.stages} stages; "
                             f"{type(producer).__name__} fills {producer.stages}")
    if activation is not None:
        if consumer.act_tiles != activation.tiles:
            raise ValueError(f"{type(consumer).__name__} reads f16 tiles {consumer.act_tiles}; "
                             f"{type(activation).__name__} writes {activation.tiles}")
        peers = getattr(activation, "peers", 1)
        if getattr(consumer, "act_peers", 1) != peers:
            raise ValueError(f"{type(activation).__name__} writes the f16 tiles of {peers} "
                             f"CTAs; {type(consumer).__name__} frees them in "
                             f"{getattr(consumer, 'act_peers', 1)}")
        if getattr(producer, "peers", 1) not in (1, peers):
            raise ValueError(f"{type(producer).__name__} loads for a cluster of "
                             f"{producer.peers}; {type(activation).__name__} shares in {peers}")
    tiles = getattr(producer, "tiles", None)  # a producer that also owns the f16 tiles
    if activation is None and tiles is not None and consumer.act_tiles != tiles:
        raise ValueError(f"{type(consumer).__name__} reads f16 tiles {consumer.act_tiles}; "
                         f"{type(producer).__name__} writes {tiles}")
    if epilogue.threads != consumer.threads:
        raise ValueError(f"the epilogue syncs {epilogue.threads} threads; "
                         f"{type(consumer).__name__} calls it from {consumer.threads}")
    if epilogue.barrier in consumer.named_barriers():
        raise ValueError(f"the epilogue's named barrier {epilogue.barrier!r} is also "
                         f"{type(consumer).__name__}'s")


def _check_ring(stages, splits):
    if not isinstance(stages, int) or stages < 2:
        raise ValueError(f"stages = {stages!r}: the packed ring needs an int >= 2")
    if not isinstance(splits, int) or not 1 <= splits <= 16:
        raise ValueError(f"splits = {splits!r}: choose 1..16")


class BlockscaledGemmSm90:
    """Static config: CTA tile ``tile_m`` token rows x ``tile_n`` weight rows, weight ring depth
    ``stages``, K ``splits`` (or stream-K), tile raster order, the role modules and the
    epilogue. :meth:`swap_ab_f16` and :meth:`wide_f16` build the production designs,
    :meth:`wide_f16_queue` P2's; studies (:class:`P0Variant`, :class:`V3Study`,
    :class:`P1Study`) assemble theirs with :meth:`from_roles`."""

    variant = None  # the P0Variant of a measurement build (:meth:`P0Variant.of`), else None

    def __init__(self, *args, **kwargs):
        raise TypeError("build a config with BlockscaledGemmSm90.swap_ab_f16, wide_f16, "
                        "wide_f16_queue or from_roles (the p0 design this constructor built left "
                        "the code: notes/p0-gemm.md, session 27)")

    @classmethod
    def swap_ab_f16(cls, *, stages: int = 8, splits: int = 1, stream_k: bool = False,
                    buffers: int = 4, cluster_splits: bool = False) -> BlockscaledGemmSm90:
        """The swap-AB design on the activation's exact f16 expansion (the ``a`` buffer holds
        f16 [M, K], e2m1 · s of the packed activation, as kernels.nvfp4.quantize.
        quantize_expand_nvfp4 writes it): the weight slabs by the producer's warp
        (producers.register_order.WeightsOnlyRegisterOrderProducer), the f16 token tile by TMA
        into ``buffers`` tiles (producers.activation_stage.F16TmaActivationStage), the
        production consumer. The same wgmmas on the same values in the same order as the
        packed swap-AB design it replaced, so the same bits at the same split (notes/p0-gemm.md,
        session 22: 15-22 % faster at M = 128; session 27). ``cluster_splits``: a tile's K
        splits are one cluster reducing on chip (epilogues.tile_store.ClusterSplitStore; the
        same bits as the global fixup at the same split, notes/p0-gemm.md session 27)."""
        _check_ring(stages, splits)
        tokens = RegisterAWgmmaConsumer.TOKENS[0]
        activation = F16TmaActivationStage(tokens, stages, buffers)
        consumer = RegisterAWgmmaConsumer(tokens, stages, activation.tiles)
        if cluster_splits and splits != 2:  # three lost (a second round): V3Study measures it
            raise ValueError(f"cluster_splits with splits = {splits}: the K-split cluster is a "
                             "production store at two splits only (notes/p0-gemm.md, session 27)")
        epilogue = ClusterSplitStore(consumer.threads, splits=splits) if cluster_splits else None
        return cls.from_roles("swap_ab", WeightsOnlyRegisterOrderProducer(
            tokens, consumer.tile_n, stages), consumer, activation, splits=splits,
            raster_along_m=False, stream_k=stream_k, epilogue=epilogue)

    @classmethod
    def wide_f16(cls, *, stages: int = 8, splits: int = 1, stream_k: bool = False,
                 buffers: int = 4, tokens: int = 256) -> BlockscaledGemmSm90:
        """The large-M build on the activation's f16 expansion: three warpgroups (384 threads),
        the weight slabs and the f16 token tile's TMA both in the producer's warpgroup
        (producers.activation_stage.WeightsAndF16Producer, 40 registers after setmaxnreg), two
        pipelined register-A consumer warpgroups (consumers.register_a_wgmma.
        PipelinedRegisterAWgmmaConsumer: convert k16 step b + 1 under wgmma(b), two groups in
        flight) with ``tokens`` = 256 token rows a CTA (m64n256k16, 128 accumulators a thread
        at 232 registers). Its own bits (another wgmma shape than :meth:`swap_ab_f16`), every
        element within the oracle's bound (notes/p0-gemm.md, session 22: 31-36 % faster than
        the P0 design at M = 2048, 6-10 % behind quack's W4A16)."""
        _check_ring(stages, splits)
        producer = WeightsAndF16Producer(tokens, 128, stages, buffers)
        consumer = PipelinedRegisterAWgmmaConsumer(tokens, stages, producer.tiles)
        return cls.from_roles("swap_ab", producer, consumer, None, splits=splits,
                              raster_along_m=False, stream_k=stream_k)

    @classmethod
    def wide_f16_queue(cls, layout, *, stages: int = 8,
                       buffers: int = 4) -> BlockscaledGemmSm90:
        """:meth:`wide_f16` as P2's persistent work queue (producers.ring_queue; ``layout`` a
        :class:`producers.ring_queue.QueueLayout`): the ``a`` buffer is the ring of f16 rows
        the grid's first ``layout.producers`` CTAs fill from the bf16 activation (the ``sfa``
        buffer) chunk by chunk, the per-tile counter buffer holds the queue's counters; every
        tile is :meth:`wide_f16`'s, so the bits are its bits."""
        _check_ring(stages, 1)
        producer = RingWeightsAndF16Producer(TOKENS_QUEUE, 128, stages, buffers, layout)
        consumer = RingReleasingConsumer(TOKENS_QUEUE, stages, producer.tiles, layout)
        return cls.from_roles("swap_ab", producer, consumer, None, splits=1,
                              raster_along_m=False)

    @property
    def reads_f16_activation(self) -> bool:
        """Whether the ``a`` buffer is the activation's f16 expansion [M, K] (the f16 builds)
        rather than its packed codes."""
        return isinstance(self.activation, F16TmaActivationStage) or isinstance(
            self.producer, WeightsAndF16Producer)

    @classmethod
    def from_roles(cls, design: str, producer, consumer, activation=None, *, splits: int = 1,
                   raster_along_m: bool = True, epilogue=None,
                   stream_k: bool = False) -> BlockscaledGemmSm90:
        """A config of the given role modules (checked as the constructors' are)."""
        _check_ring(producer.stages, splits)
        self = object.__new__(cls)
        self._configure(design, splits, raster_along_m, producer, activation, consumer,
                        epilogue, stream_k)
        return self

    def _configure(self, design, splits, raster_along_m, producer, activation, consumer,
                   epilogue, stream_k=False):
        cluster_n = getattr(activation, "peers", 1)
        if stream_k and (splits != 1 or cluster_n != 1):
            raise ValueError(f"stream_k with splits = {splits}, cluster of {cluster_n}: "
                             "stream-K cuts K itself, one CTA a cluster")
        self.design, self.stream_k = design, bool(stream_k)
        self.tile_m, self.tile_n = consumer.tile_m, consumer.tile_n
        self.stages, self.splits = producer.stages, splits
        # CTAs of a cluster, along N (one token tile): the activation stage's peers (P1's pair
        # writing each other's f16 tiles)
        self.cluster_n = cluster_n
        self.producer, self.activation, self.consumer = producer, activation, consumer
        if (producer.tile_m, producer.tile_n) != (self.tile_m, self.tile_n):
            raise ValueError(f"producer tile ({producer.tile_m}, {producer.tile_n}) differs "
                             f"from the consumer's ({self.tile_m}, {self.tile_n})")
        self.epilogue = epilogue or TileStore(consumer.threads, splits=splits,
                                              stream_k=self.stream_k)
        if not isinstance(self.epilogue, TileStore) or self.epilogue.splits != splits or \
                self.epilogue.stream_k != self.stream_k:
            raise ValueError(f"epilogue must be a TileStore with splits = {splits} and "
                             f"stream_k = {self.stream_k} (the epilogue contract, "
                             "epilogues/__init__.py)")
        check_links(producer, activation, consumer, self.epilogue)
        self.raster_along_m = raster_along_m
        # CTAs of a K-split cluster (the DSMEM fixup study: the epilogue's, split s at rank s)
        self.cluster_k = self.epilogue.cluster_k
        if self.cluster_k != 1 and (self.cluster_k != splits or cluster_n != 1
                                    or raster_along_m or getattr(producer, "queue_producers", 0)):
            raise ValueError(f"a K-split cluster of {self.cluster_k} CTAs with splits = {splits},"
                             f" cluster_n = {cluster_n}, raster_along_m = {raster_along_m}: it "
                             "needs one CTA a split, no other cluster, the N-major raster (its "
                             "tile ids count a CTA's tiles) and no work queue")
        # the work queue's quantizer CTAs, the grid's first (producers.ring_queue)
        self.queue_producers = getattr(producer, "queue_producers", 0)
        if self.queue_producers and (stream_k or splits != 1 or self.cluster_n != 1):
            raise ValueError("the work queue runs the tile loop: one K split, no stream-K, "
                             "clusters of one")
        self.roles = tuple(r for r in (producer, activation, consumer) if r is not None)
        self.barrier_table = check_roles(self.roles)
        for name, count in self.epilogue.fixup_barriers().items():  # its own arrives and waits
            if name in self.barrier_table:
                raise ValueError(f"barrier {name!r} declared by a role and by the epilogue")
            self.barrier_table[name] = (1, count, ("epilogue",), ("epilogue",))
        self.threads = sum(r.warpgroups for r in self.roles) * WARPGROUP
        cap = REGISTER_FILE // self.threads // 8 * 8  # ptxas's per-thread cap for the kernel
        for r in self.roles:
            if getattr(r, "compile_regs", 0) > cap:
                raise ValueError(f"{type(r).__name__} needs {r.compile_regs} registers a "
                                 f"thread where ptxas compiles it; a CTA of {self.threads} "
                                 f"threads caps every thread at {cap} (setmaxnreg moves "
                                 "registers at run time only): use fewer warpgroups")
        self.smem_bytes = sum(r.smem_bytes() for r in self.roles) + 8 * sum(
            n for n, *_ in self.barrier_table.values()) + 1024 + \
            self.epilogue.fixup_smem_bytes(self.tile_m * self.tile_n)
        if self.smem_bytes > SMEM_PER_CTA_MAX:
            raise ValueError(f"tile {self.tile_m}x{self.tile_n}, stages={self.stages} needs "
                             f"{self.smem_bytes} B of shared memory (> {SMEM_PER_CTA_MAX})")

    def with_output(self, output) -> BlockscaledGemmSm90:
        """The same config with another epilogue output rule (e.g. P4's GateResidualBf16); one
        object per rule (rules are frozen dataclasses), so a call path that asks each time
        costs a lookup, not a new config and a new cache key."""
        cache = self.__dict__.setdefault("_with_output", {})
        new = cache.get(output)
        if new is None:
            new = object.__new__(type(self))
            new.__dict__.update({k: v for k, v in self.__dict__.items()
                                 if k not in ("_with_output", "_static_key")})
            new.epilogue = replace(self.epilogue, output=output)
            cache[output] = new
        return new

    def workspace_floats(self, M: int, N: int, K: int, ctas: int) -> tuple:
        """(fp32 words of the split-K workspace, tiles: the counters) for an M x N x K call on
        ``ctas`` CTAs (host; 0 words when no tile is split). Raises where the kernel's 32-bit
        arithmetic would overflow."""
        tiles = -(-M // self.tile_m) * -(-N // self.tile_n)
        if self.cluster_k > 1:  # the K-split cluster reduces on chip
            return 0, tiles
        depth = self.splits
        if self.stream_k:  # at most this many CTAs' shares meet in one tile
            k_tiles = -(-K // K_BLOCK)
            if tiles * k_tiles * ctas >= 2**31:
                raise ValueError(f"stream-K over {tiles} tiles x {k_tiles} k-blocks x {ctas} "
                                 "CTAs exceeds the kernel's 32-bit iteration products; use K "
                                 "splits")
            depth = max_stream_k_segments(tiles, k_tiles, ctas)
        words = workspace_floats(depth, tiles, self.tile_m, self.tile_n)
        if words >= 2**31:
            raise ValueError(f"split-K workspace of {depth} splits x {tiles} tiles of "
                             f"{self.tile_m} x {self.tile_n} exceeds 32-bit indexing; use fewer "
                             "splits (splits only pay below one wave of tiles)")
        return words, tiles

    def static_key(self) -> tuple:
        """Every static choice that changes the compiled code: the compile cache's key
        (computed once: a config does not change after it is built)."""
        key = self.__dict__.get("_static_key")
        if key is None:
            key = self._static_key = (
                self.design, self.tile_m, self.tile_n, self.stages, self.splits,
                self.raster_along_m, self.cluster_n,
                *(_module_key(r) for r in self.roles), self.epilogue.key(),
                *(("stream_k",) if self.stream_k else ()))
        return key

    def describe(self) -> dict:
        return {"design": self.design, "tile": [self.tile_m, self.tile_n, K_BLOCK],
                "stages": self.stages, "threads": self.threads, "smem_bytes": self.smem_bytes,
                "raster_along_m": self.raster_along_m, "splits": self.splits,
                "stream_k": self.stream_k,
                "cluster_n": self.cluster_n, "cluster_k": self.cluster_k,
                "epilogue": type(self.epilogue.output).__name__,
                "fixup": getattr(self.epilogue, "fixup",
                                 "cluster" if self.cluster_k > 1 else "production"),
                "roles": {type(r).__name__: {"warpgroups": r.warpgroups, "regs": r.regs}
                          for r in self.roles},
                "barriers": {k: {"stages": v[0], "arrive_count": v[1]}
                             for k, v in self.barrier_table.items()},
                "variant": None if self.variant is None else asdict(self.variant)}

    @cute.jit
    def __call__(self, a, sfa, b, sfb, ga, gb, d, mailbox_p, work, count, gate, residual,
                 M: Int32, N: Int32, k32: Int32, max_ctas: Int32, stream):
        # each buffer is a Pointer (pointer path) or a Tensor (TVM-FFI path): device/ffi
        a_ptr = ffi.pointer(a, PTRS[0][0])
        sfa_ptr = ffi.pointer(sfa, PTRS[1][0])
        b_ptr = ffi.pointer(b, PTRS[2][0])
        sfb_ptr = ffi.pointer(sfb, PTRS[3][0])
        ga_ptr = ffi.pointer(ga, PTRS[4][0])
        gb_ptr = ffi.pointer(gb, PTRS[5][0])
        d_ptr = ffi.pointer(d, PTRS[6][0])
        mailbox_ptr = ffi.pointer(mailbox_p, PTRS[7][0])
        work_ptr = ffi.pointer(work, PTRS[8][0])
        count_ptr = ffi.pointer(count, PTRS[9][0])
        gate_ptr = ffi.pointer(gate, PTRS[10][0])
        residual_ptr = ffi.pointer(residual, PTRS[11][0])
        tma, glob = self.producer.global_views(a_ptr, sfa_ptr, b_ptr, sfb_ptr, M, N, k32)
        n2 = N // 2  # D as uint32 column pairs (N is a multiple of 8)
        pairs = cute.make_layout((M, n2), stride=(n2, 1))
        mD = cute.make_tensor(cute.recast_ptr(d_ptr, dtype=Uint32), pairs)
        # the P4 rule's operands (placeholders, never read, for rules that name none)
        mGate = cute.make_tensor(cute.recast_ptr(gate_ptr, dtype=Uint32), cute.make_layout(n2))
        mRes = cute.make_tensor(cute.recast_ptr(residual_ptr, dtype=Uint32), pairs)
        mG = (cute.make_tensor(ga_ptr, cute.make_layout(1)),
              cute.make_tensor(gb_ptr, cute.make_layout(1)))
        mailbox = cute.make_tensor(mailbox_ptr, cute.make_layout(8))
        # split-K partial sums (fp32, whole tiles in fragment order: epilogues.tile_store) and
        # one arrival counter per output tile
        m_tiles = (M + self.tile_m - 1) // self.tile_m
        n_tiles = (N + self.tile_n - 1) // self.tile_n
        # (its extent is nominal: the store indexes through the iterator; under stream-K the
        # host sizes it by the segment bound, device.tiles.max_stream_k_segments)
        mWork = cute.make_tensor(work_ptr, cute.make_layout(
            self.splits * m_tiles * n_tiles * self.tile_m * self.tile_n))
        mCount = cute.make_tensor(count_ptr, cute.make_layout(m_tiles * n_tiles))
        tiled_mma = self.consumer.tiled_mma()
        k_tiles = (k32 + 1) // 2
        if cutlass.const_expr(self.stream_k):
            schedule = StreamKSchedule((m_tiles, n_tiles), self.raster_along_m)
            grid = schedule.grid(k_tiles, max_ctas)
        else:
            schedule = TileSchedule((m_tiles, n_tiles, self.splits), self.cluster_n,
                                    self.raster_along_m, spare=self.queue_producers,
                                    cluster_k=self.cluster_k)
            grid = schedule.grid(max_ctas // (self.cluster_n * self.cluster_k))
        ctas = self.cluster_n * self.cluster_k  # a cluster's CTAs, along grid y
        cluster = {} if ctas == 1 else {"cluster": [1, ctas, 1]}
        k_per_split = (k_tiles + self.splits - 1) // self.splits
        self.kernel(tma, glob, tiled_mma, (mD, mWork, mCount, mGate, mRes), mG, mailbox,
                    schedule, k_tiles, k_per_split).launch(
            grid=grid, block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream, **cluster)

    @cute.kernel
    def kernel(self, tma, glob, tiled_mma: cute.TiledMma, epi_tensors, mG, mailbox: cute.Tensor,
               schedule, k_tiles: Int32, k_per_split: Int32):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        alloc = SmemAllocator()
        bars = {name: alloc.allocate_tensor(Int64, cute.make_layout(n), 8).iterator
                for name, (n, *_) in self.barrier_table.items()}
        smem = {}
        for r in self.roles:
            smem.update(r.allocate(alloc))
        smem["split_flag"] = alloc.allocate_tensor(Int32, cute.make_layout(1), 4)
        fixup_bytes = self.epilogue.fixup_smem_bytes(self.tile_m * self.tile_n)
        if cutlass.const_expr(fixup_bytes):  # the DSMEM fixup's receive buffer
            smem["fixup_recv"] = alloc.allocate_tensor(Float32, cute.make_layout(
                fixup_bytes // 4), 16)
        if warp == 0:
            for atom, _ in tma:
                cpasync.prefetch_descriptor(atom)
            with cute.arch.elect_one():
                for name, (n, count, *_) in self.barrier_table.items():
                    for s in cutlass.range_constexpr(n):
                        cute.arch.mbarrier_init(bars[name] + s, count)
            cute.arch.mbarrier_init_fence()
        # a cluster's barriers are armed in every CTA before any CTA's TMA or arrive can
        # reach them
        if cutlass.const_expr(self.cluster_n * self.cluster_k > 1):
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        mD, mWork, mCount, mGate, mRes = epi_tensors
        fixup = {}
        if cutlass.const_expr(fixup_bytes):
            fixup = {"fixup": (smem["fixup_recv"].iterator, bars["fix_full"], bars["fix_free"],
                               mailbox)}
        epi = EpilogueOperands(d=mD, alpha=mG[0][0] * mG[1][0], work=mWork, count=mCount,
                               flag=smem["split_flag"].iterator, gate=mGate, residual=mRes,
                               **fixup)
        ctx = ShellContext(smem=smem, bars=bars, tma=tma, globals=glob, tiled_mma=tiled_mma,
                           epilogue=self.epilogue, epi=epi, mailbox=mailbox,
                           tiles=TileLoop(schedule, k_tiles, k_per_split), scales=mG)
        if cutlass.const_expr(self.queue_producers):  # the grid's first CTAs quantize
            _, _, bid = cute.arch.block_idx()
            q = cute.arch.make_warp_uniform(bid)
            if q < self.queue_producers:
                self.producer.quantize_chunks(ctx, q, tidx, self.threads)
            else:
                self._dispatch(ctx, warp // 4, tidx, 0, 0)
        else:
            self._dispatch(ctx, warp // 4, tidx, 0, 0)
        if cutlass.const_expr(self.cluster_n * self.cluster_k > 1):
            # no CTA leaves while its peer may still store into it or arrive on its barriers
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def _dispatch(self, ctx, wg: Int32, tidx: Int32, i: cutlass.Constexpr, first: cutlass.Constexpr):
        """Role ``i`` on warpgroups [first, first + its warpgroups), the later roles in the else
        branch (one if / else chain)."""
        r = self.roles[i]
        base_regs = REGISTER_FILE // self.threads // 8 * 8
        if cutlass.const_expr(i == len(self.roles) - 1):
            self._run_role(ctx, r, tidx - first * WARPGROUP, base_regs)
        else:
            if wg < first + r.warpgroups:
                self._run_role(ctx, r, tidx - first * WARPGROUP, base_regs)
            else:
                self._dispatch(ctx, wg, tidx, i + 1, first + r.warpgroups)

    @cute.jit
    def _run_role(self, ctx, r: cutlass.Constexpr, rt: Int32, base_regs: cutlass.Constexpr):
        if cutlass.const_expr(r.regs < base_regs):
            cute.arch.setmaxregister_decrease(r.regs)
        else:
            cute.arch.setmaxregister_increase(r.regs)
        r.run(ctx, rt)


PTRS = ((Uint8, 16), (Uint8, 16), (Uint8, 16), (Uint8, 16), (Float32, 4), (Float32, 4),
        (cutlass.BFloat16, 16), (Int32, 4), (Float32, 16), (Int32, 4), (cutlass.BFloat16, 4),
        (cutlass.BFloat16, 4))
# a, sfa, b, sfb, gA, gB, d, diagnostics mailbox, split-K workspace, split-K tile counters,
# the epilogue's gate and residual. a is the activation in the producer's format (f16 [M, K],
# or P1's bf16; sfa is then never read), b / sfb the register-order prepack's codes and scales.
# Slot 7, the pinned-host mailbox, is an address on both host paths; so are the prepack's two,
# the split-K pair and the epilogue pair (:data:`ADDRESS_SLOTS`): TVM-FFI converts a torch
# tensor natively at ~0.6 µs of host time a launch, an int costs what an int does, and these
# seven are checked once per signature by the callers, fixed per plan or placeholders (0)
# never read (notes/p0-gemm.md, session 27: a planned Nvfp4Linear call's host time by step).
ADDRESS_SLOTS = (2, 3, 7, 8, 9, 10, 11)
ENTRY = ffi.Entry("gemm_nvfp4_sm90", PTRS, scalars=4, addresses=ADDRESS_SLOTS)


def entry_buffers(a, sfa, prepacked, ga, gb, d, mailbox: int, work=None, counters=None,
                  gate=None, residual=None) -> tuple:
    """The twelve buffers of :data:`ENTRY` in order: tensors where the native entry checks them
    (a, sfa, the tensor scales, d), addresses in :data:`ADDRESS_SLOTS` (an absent workspace or
    epilogue operand is 0: its kernel never reads it)."""
    return (a, sfa, prepacked.codes.data_ptr(), prepacked.scales.data_ptr(), ga, gb, d, mailbox,
            0 if work is None else work.data_ptr(),
            0 if counters is None else counters.data_ptr(),
            0 if gate is None else gate.data_ptr(),
            0 if residual is None else residual.data_ptr())


def compile_args(M: int = 256, N: int = 512, K: int = 256):
    """Arguments for cute.compile offline (placeholder addresses, never dereferenced)."""
    return (*pointer_args(PTRS), Int32(M), Int32(N), Int32(K // 32), Int32(132),
            make_fake_stream())


# ---- studies: measurement builds (only scripts/ and tests) -------------------------------------
@dataclass(frozen=True)
class P0Variant:
    """Measurement and fault-injection builds: wrong results by design, never a production
    choice. Only :class:`P1Study`, scripts/p1_ab.py and tests build one.

    ``skip_dequant`` / ``skip_mma`` drop the f16 expansion / the wgmmas (the roles' ``expand`` /
    ``mma``), to time each half of the mainloop on its own (notes/p0-gemm.md, Ablations);
    ``stall_producer`` announces 16 bytes more than the TMA delivers (the producer's
    ``extra_tx_bytes``), so the first "full" barrier never completes and the bounded wait traps
    (the timeout test)."""

    skip_dequant: bool = False
    skip_mma: bool = False
    stall_producer: bool = False

    def of(self, config: BlockscaledGemmSm90) -> BlockscaledGemmSm90:
        """``config`` with this variant's roles: copies whose hooks (class attributes holding
        the production value) this variant changes."""
        hooks = {"expand": not self.skip_dequant, "mma": not self.skip_mma,
                 "extra_tx_bytes": 16 if self.stall_producer else 0}
        producer, activation, consumer = (_with_hooks(r, hooks) for r in (
            config.producer, config.activation, config.consumer))
        new = BlockscaledGemmSm90.from_roles(config.design, producer, consumer, activation,
                                             splits=config.splits,
                                             raster_along_m=config.raster_along_m,
                                             epilogue=config.epilogue)
        new.variant = None if self == PRODUCTION else self
        return new


PRODUCTION = P0Variant()


def _with_hooks(role, hooks: dict):
    """``role``, or a copy of it with those of ``hooks`` its class declares set where they
    differ from the class's (production) value."""
    if role is None:
        return None
    changed = {k: v for k, v in hooks.items()
               if hasattr(type(role), k) and getattr(type(role), k) != v}
    if not changed:
        return role
    new = copy.copy(role)
    new.__dict__.update(changed)
    return new


V3_FIXUPS = ("production", *SPLIT_FIXUPS, "dsmem")
V3_ACTIVATIONS = ("f16_tma", "f16_tma_3wg")
V3_CONSUMERS = ("serial", "pipelined")


@dataclass(frozen=True)
class V3Study:
    """P0 v3's measurement builds of the swap-AB design on the activation's f16 expansion
    (scripts/p0_v3_ab.py and tests/test_p0_v3_studies.py build them; notes/p0-gemm.md, P0 v3
    1(a) and 1(c)).

    ``fixup``: the split-K fixup, "production" (:class:`TileStore`'s vectorised fixed-order
    global reduce, which won this study against the scalar one; the plan's at three splits),
    "skip" (no fixup: wrong, timing only; epilogues.tile_store.SplitFixupStudy) or "dsmem"
    (``splits`` 2 or 3: epilogues.tile_store.ClusterSplitStore, the K splits of a tile one
    cluster, launched along grid y, split s at rank s; the partials are exchanged through
    distributed shared memory and each rank reduces 1/S of the tile in split order: the
    global fixup's bits, no global workspace or counter; the plan's at two splits,
    notes/p0-gemm.md sessions 26 and 27).
    ``activation``: "f16_tma" (:meth:`BlockscaledGemmSm90.swap_ab_f16`'s roles: the f16 [M, K]
    activation in the ``a`` buffer TMA'd into the f16 tiles by its own warpgroup,
    producers.register_order.WeightsOnlyRegisterOrderProducer +
    producers.activation_stage.F16TmaActivationStage) or "f16_tma_3wg" (the TMAs in the
    producer's warpgroup, 384 threads: :meth:`BlockscaledGemmSm90.wide_f16`'s roles). The
    variant that expanded the packed activation in every CTA lost and left the code
    (notes/p0-gemm.md, session 27). The per-k16
    interleaved consumer studied beside it lost (1.4-1.6x slower on the H200) and was removed:
    notes/p0-gemm.md, P0 v3 1(a) and 1(c), and ``git show 8438956:consumers/register_a_wgmma.py``.

    ``consumer``: "serial" (the production :class:`RegisterAWgmmaConsumer`: a k-block converted,
    then its 4 wgmmas as one group, retired before the next) or "pipelined"
    (:class:`consumers.register_a_wgmma.PipelinedRegisterAWgmmaConsumer`: convert step b + 1
    under wgmma(b), two k16 groups in flight; exact, the production bits: same operands, same
    wgmmas in the same order on the same accumulators).
    ``tokens``: 128 or 256 token rows a CTA tile (wgmma N; 256: 128 accumulators a thread at 232
    registers, so only with the 24-register f16 TMA activation stage; the large-M candidate).
    ``stream_k``: the stream-K schedule (device.tiles.StreamKSchedule: every CTA the same
    share of all tiles' k-blocks, a tile's segments added in CTA order) instead of K splits;
    exact (the oracle's bound; its bits are its own, fixed for a given CTA budget).
    :attr:`exact`: whether the build promises the production bits (same operands, same
    wgmmas in the same order)."""

    splits: int = 1
    fixup: str = "production"
    activation: str = "f16_tma"
    stages: int = 8
    buffers: int = 2
    stream_k: bool = False
    consumer: str = "serial"
    tokens: int = 128

    def __post_init__(self):
        for name, value, allowed in (("fixup", self.fixup, V3_FIXUPS),
                                     ("activation", self.activation, V3_ACTIVATIONS),
                                     ("consumer", self.consumer, V3_CONSUMERS)):
            if value not in allowed:
                raise ValueError(f"{name} = {value!r}: choose from {allowed}")
        if self.stream_k and (self.splits != 1 or self.fixup != "production"):
            raise ValueError("stream_k cuts K itself: splits 1 and the production fixup")
        if self.fixup != "production" and self.splits < 2:
            raise ValueError(f"fixup = {self.fixup!r} with splits = {self.splits}: the fixup "
                             "runs only with >= 2 splits")
        if self.fixup == "dsmem" and self.splits not in CLUSTER_SPLITS:
            raise ValueError(f"fixup = 'dsmem' with splits = {self.splits}: a K-split cluster "
                             f"of {CLUSTER_SPLITS} CTAs")

    @property
    def exact(self) -> bool:
        return self.fixup != "skip"

    def build(self) -> BlockscaledGemmSm90:
        _check_ring(self.stages, self.splits)
        tokens = self.tokens
        if self.activation == "f16_tma_3wg":  # three warpgroups: the TMAs in the producer's
            producer = WeightsAndF16Producer(tokens, 128, self.stages, self.buffers)  # 2 slabs
            consumer = (PipelinedRegisterAWgmmaConsumer if self.consumer == "pipelined" else
                        RegisterAWgmmaConsumer)(tokens, self.stages, producer.tiles)
            epilogue = _study_epilogue(self.fixup, consumer.threads, self.splits)
            return BlockscaledGemmSm90.from_roles(
                "swap_ab", producer, consumer, None, splits=self.splits, raster_along_m=False,
                epilogue=epilogue, stream_k=self.stream_k)
        activation = F16TmaActivationStage(tokens, self.stages, self.buffers)
        consumer = (PipelinedRegisterAWgmmaConsumer if self.consumer == "pipelined" else
                    RegisterAWgmmaConsumer)(tokens, self.stages, activation.tiles)
        producer = WeightsOnlyRegisterOrderProducer(tokens, consumer.tile_n, self.stages)
        epilogue = _study_epilogue(self.fixup, consumer.threads, self.splits)
        return BlockscaledGemmSm90.from_roles("swap_ab", producer, consumer, activation,
                                              splits=self.splits, raster_along_m=False,
                                              epilogue=epilogue, stream_k=self.stream_k)


def _study_epilogue(fixup: str, threads: int, splits: int):
    """V3Study's split store: None (the shell's TileStore, the global fixup), the K-split
    cluster's (production's at two splits) or a study's."""
    if fixup == "production":
        return None
    if fixup == "dsmem":
        return ClusterSplitStore(threads, splits=splits)
    return SplitFixupStudy(threads, splits=splits, fixup=fixup)


@dataclass(frozen=True)
class P1Study:
    """P1 (notes/p1.md; issue #36): the activation quantized inside the GEMM. The swap-AB shell
    with :class:`producers.register_order.Bf16RegisterOrderProducer` (the bf16 token tile by
    TMA beside the weight slabs in each ring stage) and
    :class:`producers.activation_stage.QuantizingActivationStage` (quantize each 16-block with
    the given tensor scale g_a, expand to exact f16 into the consumer's tiles); the consumer and
    the epilogue are the production ones. The ``a`` buffer is the bf16 activation [M, K]; the
    ``sfa`` slot is never read; ``g_a`` is g = global_scale_from_amax(amax(x)). Exact: the
    production swap-AB bits on the packed activation the quantize kernel writes with that g.
    Sharing knobs: ``cluster`` C = 2, 4 or 8 (CTAs along N, each k-block quantized by one of
    them and sent to the others by bulk DSMEM copies that complete on the peers' barriers, the
    bf16 tile loaded by that one only: producers.activation_stage.
    ClusterQuantizingActivationStage; :meth:`of_cluster` sizes the ring and buffers) and
    ``groups`` G = 2 at ``tokens`` = 64 (each quantized tile multiplied into two weight tiles:
    consumers.register_a_wgmma.GroupedRegisterAWgmmaConsumer).
    ``variant``: the ablations (:class:`P0Variant`; wrong results, timing only): skip_dequant
    leaves out the quantizer (the stage only waits and publishes), skip_mma the wgmmas.
    ``dump``: the debug build (one K split): every consumed tile's packed codes and scale bytes
    written to global memory too (kernels.nvfp4.gemm_p1.gemm_nvfp4_p1_dump).
    ``pair_local_only`` (with ``cluster`` > 1): the cluster's ablation, wrong results, timing
    only: each k-block's owner writes only its own f16 tile (nothing sent), barriers
    unchanged."""

    splits: int = 1
    stages: int = 6
    buffers: int = 2
    variant: P0Variant = PRODUCTION
    dump: bool = False
    cluster: int = 1  # C: CTAs along N sharing each quantized tile (1, 2, 4 or 8)
    pair_local_only: bool = False
    groups: int = 1  # G: weight tiles a CTA multiplies each quantized tile into (1, or 2)
    tokens: int = 128  # token rows a tile (64 with groups=2: two accumulator sets fit)

    @classmethod
    def of_cluster(cls, cluster: int, **kw) -> "P1Study":
        """C CTAs with what their shared memory allows: a buffer per CTA (each with one writer),
        at least two; six ring stages, four at C = 8 (eight f16 tiles take 128 KB)."""
        return cls(cluster=cluster, buffers=max(2, cluster), stages=4 if cluster == 8 else 6,
                   **kw)

    def build(self) -> BlockscaledGemmSm90:
        _check_ring(self.stages, self.splits)
        if self.cluster not in (1, 2, 4, 8):
            raise ValueError(f"cluster = {self.cluster!r}: 1, 2, 4 or 8 CTAs (notes/p1.md)")
        if self.cluster > 1 and (self.dump or self.variant != PRODUCTION):
            raise ValueError("the cluster is built without the debug dump and the ablations")
        if self.pair_local_only and self.cluster == 1:
            raise ValueError("pair_local_only ablates the cluster's sends: cluster > 1")
        if (self.groups, self.tokens) not in ((1, 128), (2, 64)):
            raise ValueError(f"groups = {self.groups!r}, tokens = {self.tokens!r}: G = 1 at 128 "
                             "tokens, or G = 2 at 64 (notes/p1.md, N-group reuse)")
        if self.groups != 1 and (self.cluster != 1 or self.dump
                                 or self.variant != PRODUCTION):
            raise ValueError("N-group reuse is built without the pair, the debug dump and the "
                             "ablations")
        if self.dump and self.splits != 1:
            raise ValueError("the debug build writes through the split-K workspace: splits 1")
        if self.dump and self.variant.skip_dequant:
            raise ValueError("the debug build writes what the quantizer makes: not without it")
        tokens = self.tokens
        if self.groups == 2:
            activation = QuantizingActivationStage(tokens, self.stages, self.buffers)
            consumer = GroupedRegisterAWgmmaConsumer(tokens, self.stages, activation.tiles)
        elif self.cluster > 1:
            activation = ClusterQuantizingActivationStage(tokens, self.stages, self.buffers,
                                                          peers=self.cluster)
            if self.pair_local_only:
                activation = copy.copy(activation)
                activation.local_only = True  # an instance attribute: its own compile-cache key
            consumer = PeerFedRegisterAWgmmaConsumer(tokens, self.stages, activation.tiles,
                                                     peers=self.cluster)
        else:
            activation = QuantizingActivationStage(tokens, self.stages, self.buffers)
            if self.dump:
                activation = copy.copy(activation)
                activation.dump = True  # an instance attribute: its own compile-cache key
            consumer = RegisterAWgmmaConsumer(tokens, self.stages, activation.tiles)
        producer = Bf16RegisterOrderProducer(tokens, consumer.tile_n, self.stages,
                                             peers=self.cluster)
        config = BlockscaledGemmSm90.from_roles("swap_ab", producer, consumer, activation,
                                                splits=self.splits, raster_along_m=False)
        return config if self.variant == PRODUCTION else self.variant.of(config)
