"""The block-scaled NVFP4 GEMM shell for sm_90a: a persistent, warp-specialised CTA that runs
role modules.

    D[m, n] = RN_bf16(alpha · Σ_k a[m,k] w[n,k]),  a = e2m1·sA, w = e2m1·sW,  alpha = gA·gW (fp32)

``a`` is the activation (M token rows), ``w`` the weight (N rows); both are NVFP4 with
E4M3 block scales of 16 and an fp32 tensor scale.

The shell owns the CTA: it allocates each module's shared storage, creates and initialises the
mbarriers the modules declare (each arrive count is the sum of the arrivals the modules declare
on it, checked when the shell is built: a barrier nobody arrives on or waits on is an error),
builds the persistent tile schedule (CUTLASS's static scheduler, grid = min(tiles, SMs)) and
dispatches warpgroups to roles. Every role runs its own loop over the same tile sequence. The
epilogue (:mod:`epilogues`, one signature) is called by the consumer after each tile.

Designs (the module sets; notes/p0-gemm.md has their measurements):

``p0`` (:meth:`BlockscaledGemmSm90.__init__`), 384 threads:
  ========  ===========  ====  =========================================================
  role      warpgroups   regs  module
  producer  0 (warp 0)   40    :class:`producers.tma_prepacked.TmaPrepackedProducer`
  consumer  1-2          232   :class:`consumers.dequant_wgmma.DequantWgmmaConsumer`
  ========  ===========  ====  =========================================================
  packed ring  full[s]: 1 arrive + bytes (TMA); empty[s]: 8 (consumer warps)

``swap_ab`` (:class:`SwapAbStudy`; the default at small M when the prepack is given), 512
threads: weights on wgmma's M side as
the register-sourced A operand, tokens on N:
  ==========  ===========  ====  =======================================================
  role        warpgroups   regs  module
  producer    0 (warp 0)   24    :class:`producers.register_order.RegisterOrderProducer`
  activation  1            80    :class:`producers.activation_stage.ExpandedActivationStage`
  consumer    2-3          200   :class:`consumers.register_a_wgmma.RegisterAWgmmaConsumer`
  ==========  ===========  ====  =======================================================
  packed ring   full[s]: 1 arrive + bytes; empty[s]: 12 (4 activation + 8 consumer warps)
  f16 B tiles   act_full[b]: 4 (activation warps); act_empty[b]: 8 (consumer warps)
  multicast 2   clusters of 2 CTAs along N share the token tile: each producer TMAs half of
                the packed activation to both; empty[s]: 16 (4 + 4 activation warps of the
                pair, 8 consumer warps)

No CTA waits on a CTA outside its cluster (split-K's last CTA only counts arrivals; a cluster's
CTAs are co-scheduled by the hardware), so the persistent grid needs no co-residency guarantee. Every mbarrier wait is bounded (:mod:`device.waits`):
a stalled barrier traps with a report naming it. Measurement-only builds go through one
:class:`P0Variant`; schedules/plan.py says which config runs per problem.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from epilogues import EpilogueOperands
from epilogues.tile_store import TileStore
from device import ffi
from device.runtime import cute_modules

cutlass, cute = cute_modules()
import cutlass.utils as utils  # noqa: E402
from cutlass import Float32, Int32, Int64, Uint8, Uint32  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402

WARPGROUP = 128
REGISTER_FILE = 65536  # 32-bit registers per SM
SMEM_CAPACITY = 232448  # sm_90 opt-in maximum per CTA
TILE_K = 64  # K elements per k-block: one 128x4 scale tile column group


@dataclass(frozen=True)
class P0Variant:
    """Measurement and fault-injection builds: wrong results by design, never a production
    choice. Only scripts/p0_ablate.py and tests construct one.

    ``skip_dequant`` / ``skip_mma`` drop the f16 expansion / the wgmmas, to time each half of the
    mainloop on its own (notes/p0-gemm.md, Ablations); ``stall_producer`` announces 16 bytes more
    than the TMA delivers, so the first "full" barrier never completes and the bounded wait traps
    (the timeout test)."""

    skip_dequant: bool = False
    skip_mma: bool = False
    stall_producer: bool = False


PRODUCTION = P0Variant()


@dataclass(frozen=True)
class SwapAbStudy:
    """The swap-AB design and its knobs: schedules/plan.py's default picks one setting of them
    for small M (notes/p0-gemm.md v5, where it won); scripts/p0_v2_ab.py and tests vary them."""

    tokens: int = 128
    stages: int = 8
    splits: int = 1
    raster_along_m: bool = False
    buffers: int = 2  # f16 activation tiles
    overlap: bool = False  # one wgmma group in flight per consumer warpgroup
    multicast: int = 1  # 2: CTA pairs on neighbouring weight tiles share the activation's TMA
    variant: P0Variant = PRODUCTION

    def build(self) -> BlockscaledGemmSm90:
        return BlockscaledGemmSm90._swap_ab(tokens=self.tokens, stages=self.stages,
                                            splits=self.splits,
                                            raster_along_m=self.raster_along_m,
                                            buffers=self.buffers, overlap=self.overlap,
                                            multicast=self.multicast, variant=self.variant)


class ShellContext(NamedTuple):
    """What every role receives (device side): its storage and barriers by name, the static
    shell, the schedule and the global views."""
    shell: object
    smem: dict        # name -> shared-memory tensor (every module's)
    bars: dict        # name -> mbarrier array pointer
    tma: list         # the producer's TMA atoms and global tensors
    globals: tuple    # the producer's other global views (e.g. prepacked weights)
    tiled_mma: object
    epi: object       # EpilogueOperands
    mailbox: object
    sched_params: object
    k_tiles: object
    k_per_split: object


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


class BlockscaledGemmSm90:
    """Static config: CTA tile ``tile_m`` activation rows x ``tile_n`` weight rows, packed ring
    depth ``stages``, K ``splits``, tile raster order, the role modules and the epilogue, and
    (tests and measurements only) a :class:`P0Variant`. The constructor builds the ``p0``
    design; :meth:`swap_ab` the swap-AB design."""

    def __init__(self, *, tile_n: int = 256, stages: int = 4, splits: int = 1,
                 raster_along_m: bool = True, swizzle: int = 1, producer=None, consumer=None,
                 epilogue=None, variant: P0Variant = PRODUCTION):
        from consumers.dequant_wgmma import DequantWgmmaConsumer
        from producers.tma_prepacked import TmaPrepackedProducer

        if tile_n not in DequantWgmmaConsumer.TILE_NS:
            raise ValueError(f"tile_n = {tile_n!r}: choose from {DequantWgmmaConsumer.TILE_NS} "
                             f"(tile_m is {DequantWgmmaConsumer.TILE_M})")
        self._configure("p0", DequantWgmmaConsumer.TILE_M, tile_n, stages, splits,
                        raster_along_m, swizzle, epilogue, variant,
                        producer or TmaPrepackedProducer(DequantWgmmaConsumer.TILE_M, tile_n,
                                                         stages),
                        None, consumer or DequantWgmmaConsumer(DequantWgmmaConsumer.TILE_M,
                                                               tile_n))

    @classmethod
    def _swap_ab(cls, *, tokens: int = 128, stages: int = 8, splits: int = 1,
                 raster_along_m: bool = False, swizzle: int = 1, buffers: int = 2,
                 overlap: bool = False, multicast: int = 1, epilogue=None,
                 variant: P0Variant = PRODUCTION) -> BlockscaledGemmSm90:
        """The swap-AB design (built through :class:`SwapAbStudy`):
        ``tokens`` activation rows x 128 weight rows a CTA; weights from the register-order
        prepack (kernels.nvfp4.prepack); with ``multicast`` = 2, clusters of two CTAs on
        neighbouring weight tiles, each TMA-ing half of the shared activation tile to both."""
        from consumers.register_a_wgmma import RegisterAWgmmaConsumer
        from producers.activation_stage import ExpandedActivationStage
        from producers.register_order import RegisterOrderProducer

        self = object.__new__(cls)
        consumer = RegisterAWgmmaConsumer(tokens, overlap)
        self._configure("swap_ab", tokens, consumer.tile_n, stages, splits, raster_along_m,
                        swizzle, epilogue, variant,
                        RegisterOrderProducer(tokens, consumer.tile_n, stages, multicast),
                        ExpandedActivationStage(tokens, buffers, multicast), consumer,
                        cluster_n=multicast)
        return self

    def _configure(self, design, tile_m, tile_n, stages, splits, raster_along_m, swizzle,
                   epilogue, variant, producer, activation, consumer, cluster_n=1):
        if not isinstance(stages, int) or stages < 2:
            raise ValueError(f"stages = {stages!r}: the packed ring needs an int >= 2")
        if not isinstance(splits, int) or not 1 <= splits <= 16:
            raise ValueError(f"splits = {splits!r}: choose 1..16")
        if not isinstance(variant, P0Variant):
            raise TypeError(f"variant must be a P0Variant, got {type(variant).__name__}")
        self.design = design
        self.tile_m, self.tile_n, self.stages, self.splits = tile_m, tile_n, stages, splits
        self.variant = variant
        self.cluster_n = cluster_n  # CTAs of a cluster, along N (one token tile, 2 weight tiles)
        self.producer, self.activation, self.consumer = producer, activation, consumer
        for name, m in (("producer", producer), ("consumer", consumer)):
            if (m.tile_m, m.tile_n) != (tile_m, tile_n):
                raise ValueError(f"{name} tile ({m.tile_m}, {m.tile_n}) differs from the "
                                 f"shell's ({tile_m}, {tile_n})")
        self.epilogue = epilogue or TileStore(splits=splits)
        if not isinstance(self.epilogue, TileStore) or self.epilogue.splits != splits:
            raise ValueError(f"epilogue must be a TileStore with splits = {splits} (the "
                             f"epilogue contract, epilogues/__init__.py)")
        self.raster_along_m, self.swizzle = raster_along_m, swizzle
        self.roles = tuple(r for r in (producer, activation, consumer) if r is not None)
        self.barrier_table = check_roles(self.roles)
        self.threads = sum(r.warpgroups for r in self.roles) * WARPGROUP
        self.smem_bytes = sum(r.smem_bytes() for r in self.roles) + 8 * sum(
            n for n, *_ in self.barrier_table.values()) + 1024
        if self.smem_bytes > SMEM_CAPACITY:
            raise ValueError(f"tile {tile_m}x{tile_n}, stages={stages} needs {self.smem_bytes} "
                             f"B of shared memory (> {SMEM_CAPACITY})")

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
            new.epilogue = TileStore(output, self.splits)
            cache[output] = new
        return new

    @property
    def needs_prepacked_weights(self) -> bool:
        return self.design == "swap_ab"

    def static_key(self) -> tuple:
        """Every static choice that changes the compiled code: the compile cache's key
        (computed once: a config does not change after it is built)."""
        key = self.__dict__.get("_static_key")
        if key is None:
            key = self._static_key = (
                self.design, self.tile_m, self.tile_n, self.stages, self.splits,
                self.raster_along_m, self.swizzle, self.cluster_n, self.variant,
                *(_module_key(r) for r in self.roles), self.epilogue.key())
        return key

    def describe(self) -> dict:
        return {"design": self.design, "tile": [self.tile_m, self.tile_n, TILE_K],
                "stages": self.stages, "threads": self.threads, "smem_bytes": self.smem_bytes,
                "raster_along_m": self.raster_along_m, "swizzle": self.swizzle,
                "splits": self.splits, "cluster_n": self.cluster_n, "epilogue": type(self.epilogue.output).__name__,
                "roles": {type(r).__name__: {"warpgroups": r.warpgroups, "regs": r.regs}
                          for r in self.roles},
                "barriers": {k: {"stages": v[0], "arrive_count": v[1]}
                             for k, v in self.barrier_table.items()},
                "variant": None if self.variant == PRODUCTION else asdict(self.variant)}

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
        # split-K partial sums [splits, M, N] fp32 and one arrival counter per output tile
        mWork = cute.make_tensor(work_ptr, cute.make_layout((self.splits, M, N),
                                                            stride=(M * N, N, 1)))
        m_tiles = (M + self.tile_m - 1) // self.tile_m
        n_tiles = (N + self.tile_n - 1) // self.tile_n
        mCount = cute.make_tensor(count_ptr, cute.make_layout(m_tiles * n_tiles))
        tiled_mma = self.consumer.tiled_mma()
        sched = utils.PersistentTileSchedulerParams((m_tiles, n_tiles, self.splits),
                                                    (1, self.cluster_n, 1),
                                                    swizzle_size=self.swizzle,
                                                    raster_along_m=self.raster_along_m)
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched,
                                                                  max_ctas // self.cluster_n)
        cluster = {} if self.cluster_n == 1 else {"cluster": [1, self.cluster_n, 1]}
        k_tiles = (k32 + 1) // 2
        k_per_split = (k_tiles + self.splits - 1) // self.splits
        self.kernel(tma, glob, tiled_mma, (mD, mWork, mCount, mGate, mRes), mG, mailbox, sched,
                    k_tiles, k_per_split).launch(
            grid=grid, block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream, **cluster)

    @cute.kernel
    def kernel(self, tma, glob, tiled_mma: cute.TiledMma, epi_tensors, mG, mailbox: cute.Tensor,
               sched_params, k_tiles: Int32, k_per_split: Int32):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        alloc = cutlass.utils.SmemAllocator()
        bars = {name: alloc.allocate_tensor(Int64, cute.make_layout(n), 8).iterator
                for name, (n, *_) in self.barrier_table.items()}
        smem = {}
        for r in self.roles:
            smem.update(r.allocate(alloc))
        smem["split_flag"] = alloc.allocate_tensor(Int32, cute.make_layout(1), 4)
        if warp == 0:
            for atom, _ in tma:
                cpasync.prefetch_descriptor(atom)
            with cute.arch.elect_one():
                for name, (n, count, *_) in self.barrier_table.items():
                    for s in cutlass.range_constexpr(n):
                        cute.arch.mbarrier_init(bars[name] + s, count)
            cute.arch.mbarrier_init_fence()
        # a cluster's barriers are armed in both CTAs before either CTA's TMA or arrive can
        # reach them
        if cutlass.const_expr(self.cluster_n > 1):
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        mD, mWork, mCount, mGate, mRes = epi_tensors
        epi = EpilogueOperands(d=mD, alpha=mG[0][0] * mG[1][0], work=mWork, count=mCount,
                               flag=smem["split_flag"].iterator, gate=mGate, residual=mRes)
        ctx = ShellContext(shell=self, smem=smem, bars=bars, tma=tma, globals=glob,
                           tiled_mma=tiled_mma, epi=epi, mailbox=mailbox,
                           sched_params=sched_params, k_tiles=k_tiles, k_per_split=k_per_split)
        self._dispatch(ctx, warp // 4, tidx, 0, 0)
        if cutlass.const_expr(self.cluster_n > 1):
            # no CTA leaves while its peer may still multicast into it or arrive on its barriers
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
# the epilogue's gate and residual. b / sfb are the weight in the producer's format: Comfy's
# packing and swizzled scales (p0), or the register-order prepack's codes and scales (swap_ab).
# Slot 7, the pinned-host mailbox, is an address on both host paths.
ENTRY = ffi.Entry("gemm_nvfp4_sm90", PTRS, scalars=4, addresses=(7,))


def compile_args(M: int = 256, N: int = 512, K: int = 256):
    """Arguments for cute.compile offline (placeholder addresses, never dereferenced)."""
    from cutlass.cute.runtime import make_fake_stream

    from device.runtime import pointer_args

    return (*pointer_args(PTRS), Int32(M), Int32(N), Int32(K // 32), Int32(132),
            make_fake_stream())
