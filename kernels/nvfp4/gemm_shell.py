"""P0: persistent, warp-specialised block-scaled NVFP4 GEMM for sm_90a, composed of modules.

    D[m, n] = RN_bf16(alpha · Σ_k a[m,k] b[n,k]),  a = e2m1·sA, b = e2m1·sB,  alpha = gA·gB (fp32)

The shell owns the CTA: shared storage, mbarriers, the persistent tile loop and warp roles. The
work is done by three modules passed in (each documents its contract):

* producer (:class:`producers.tma_prepacked.TmaPrepackedProducer`): warp 0 streams packed
  operands and scales by TMA into a ring of ``stages`` stages (``full``/``empty`` mbarriers);
* consumer (:class:`consumers.dequant_wgmma.DequantWgmmaConsumer`): warpgroups 1-2 expand each
  stage to exact f16 tiles in smem and run wgmma into fp32 accumulators;
* epilogue (:class:`epilogues.tile_store.TileStore`, contract in :mod:`epilogues`): the split-K
  reduction in a fixed order and an output rule: alpha and one bf16 rounding
  (:class:`epilogues.alpha_bf16.AlphaBf16`), or P4's exact gated residual add
  (:class:`epilogues.gate_residual.GateResidualBf16`).

Roles (384 threads): warpgroup 0 drops to 40 registers (only its warp 0 works); warpgroups 1-2
raise to 232. Pipelines:
  packed ring  TMA warp -> consumers   full[s]: 1 arrive + stage bytes; empty[s]: 8 warp arrives
  f16 buffers  consumers -> wgmma      writer fence.proxy.async + named barrier 1 (256 threads);
               3 buffers, 1 wgmma commit group in flight per warpgroup
Tiles are visited by CUTLASS's static persistent scheduler (grid = min(tiles, SMs)); every role
walks the same sequence. No CTA ever waits on another, so the persistent grid needs no
co-residency guarantee (a CTA that is not resident yet simply starts later). All mbarrier waits
are bounded (:mod:`kernels.device.waits`): a stalled barrier traps with a report naming it.

Only the configurations that won their A/B are offered (128 x 128 or 128 x 256 tiles, three f16
buffers: notes/p0-gemm.md v2, v3); schedules/plan.py says which one runs per problem.
Measurement-only builds go through one :class:`P0Variant`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from consumers.dequant_wgmma import TILE_K, DequantWgmmaConsumer
from epilogues import EpilogueOperands, OutputTile
from epilogues.tile_store import TileStore
from kernels.device.runtime import cute_modules
from kernels.device.waits import ring_position, wait_parity
from producers.tma_prepacked import TmaPrepackedProducer

cutlass, cute = cute_modules()
import cutlass.utils as utils  # noqa: E402
from cutlass import Float16, Float32, Int32, Int64, Uint8, Uint16, Uint32  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402

WARPGROUP = 128
PRODUCER_REGS, CONSUMER_REGS = 40, 232
SMEM_CAPACITY = 232448  # sm_90 opt-in maximum per CTA
TILE_M = 128  # 256x128 tiles lost their A/B (notes/p0-gemm.md v2)
TILE_NS = (128, 256)


@dataclass(frozen=True)
class P0Variant:
    """Measurement and fault-injection builds of P0: wrong results by design, never a production
    choice. Only scripts/p0_ablate.py and tests construct one.

    ``skip_dequant`` / ``skip_mma`` drop the f16 expansion / the wgmmas, to time each half of the
    mainloop on its own (notes/p0-gemm.md, Ablations); ``stall_producer`` announces 16 bytes more
    than the TMA delivers, so the first "full" barrier never completes and the bounded wait traps
    (the timeout test)."""

    skip_dequant: bool = False
    skip_mma: bool = False
    stall_producer: bool = False


PRODUCTION = P0Variant()


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


class BlockscaledGemmSm90:
    """Static config: CTA tile 128 x ``tile_n``, packed ring depth ``stages``, K ``splits``, tile
    raster order, the three modules, and (tests and measurements only) a :class:`P0Variant`."""

    def __init__(self, *, tile_n: int = 256, stages: int = 4, splits: int = 1,
                 raster_along_m: bool = True, swizzle: int = 1, producer=None, consumer=None,
                 epilogue=None, variant: P0Variant = PRODUCTION):
        if tile_n not in TILE_NS:
            raise ValueError(f"tile_n = {tile_n!r}: choose from {TILE_NS} (tile_m is {TILE_M})")
        if not isinstance(stages, int) or stages < 2:
            raise ValueError(f"stages = {stages!r}: the packed ring needs an int >= 2")
        if not isinstance(splits, int) or not 1 <= splits <= 16:
            raise ValueError(f"splits = {splits!r}: choose 1..16")
        if not isinstance(variant, P0Variant):
            raise TypeError(f"variant must be a P0Variant, got {type(variant).__name__}")
        self.tile_m, self.tile_n, self.stages, self.splits = TILE_M, tile_n, stages, splits
        self.variant = variant
        self.producer = producer or TmaPrepackedProducer(TILE_M, tile_n)
        self.consumer = consumer or DequantWgmmaConsumer(TILE_M, tile_n)
        for name, m in (("producer", self.producer), ("consumer", self.consumer)):
            if (m.tile_m, m.tile_n) != (TILE_M, tile_n):
                raise ValueError(f"{name} tile ({m.tile_m}, {m.tile_n}) differs from the "
                                 f"shell's ({TILE_M}, {tile_n})")
        self.epilogue = epilogue or TileStore(splits=splits)
        if not isinstance(self.epilogue, TileStore) or self.epilogue.splits != splits:
            raise ValueError(f"epilogue must be a TileStore with splits = {splits} (the "
                             f"epilogue contract, epilogues/__init__.py)")
        self.raster_along_m, self.swizzle = raster_along_m, swizzle
        self.threads = WARPGROUP + self.consumer.threads
        f16_bytes = (TILE_M + tile_n) * TILE_K * 2 * self.consumer.buffers
        self.smem_bytes = stages * self.producer.stage_bytes + f16_bytes + 2048
        if self.smem_bytes > SMEM_CAPACITY:
            raise ValueError(f"tile_n={tile_n}, stages={stages} needs {self.smem_bytes} B of "
                             f"shared memory (> {SMEM_CAPACITY})")

    def with_output(self, output) -> "BlockscaledGemmSm90":
        """The same config with another epilogue output rule (e.g. P4's GateResidualBf16)."""
        return BlockscaledGemmSm90(tile_n=self.tile_n, stages=self.stages, splits=self.splits,
                                   raster_along_m=self.raster_along_m, swizzle=self.swizzle,
                                   producer=self.producer, consumer=self.consumer,
                                   epilogue=TileStore(output, self.splits), variant=self.variant)

    def static_key(self) -> tuple:
        """Every static choice that changes the compiled code: the compile cache's key."""
        return (TILE_M, self.tile_n, self.stages, self.splits, self.raster_along_m,
                self.swizzle, self.variant, _module_key(self.producer),
                _module_key(self.consumer), self.epilogue.key())

    def describe(self) -> dict:
        return {"tile": [self.tile_m, self.tile_n, TILE_K], "stages": self.stages,
                "f16_buffers": self.consumer.buffers, "threads": self.threads,
                "smem_bytes": self.smem_bytes, "raster_along_m": self.raster_along_m,
                "swizzle": self.swizzle, "splits": self.splits,
                "epilogue": type(self.epilogue.output).__name__,
                "variant": None if self.variant == PRODUCTION else asdict(self.variant)}

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, sfa_ptr: cute.Pointer, b_ptr: cute.Pointer,
                 sfb_ptr: cute.Pointer, ga_ptr: cute.Pointer, gb_ptr: cute.Pointer,
                 d_ptr: cute.Pointer, mailbox_ptr: cute.Pointer, work_ptr: cute.Pointer,
                 count_ptr: cute.Pointer, gate_ptr: cute.Pointer, residual_ptr: cute.Pointer,
                 M: Int32, N: Int32, k32: Int32, max_ctas: Int32, stream):
        mA, mB, mSFA, mSFB = self.producer.global_views(a_ptr, sfa_ptr, b_ptr, sfb_ptr, M, N, k32)
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
        mCount = cute.make_tensor(count_ptr, cute.make_layout(
            ((M + self.tile_m - 1) // self.tile_m) * ((N + self.tile_n - 1) // self.tile_n)))
        tma = self.producer.make_tma(mA, mB, mSFA, mSFB, self.stages)
        tiled_mma = self.consumer.tiled_mma()
        lay_fa, lay_fb = self.consumer.smem_layouts()
        lay_qa, lay_qb, lay_sa, lay_sb = self.producer.smem_layouts(self.stages)
        stages = self.stages

        @cute.struct
        class SharedStorage:
            full: cute.struct.MemRange[Int64, stages]
            empty: cute.struct.MemRange[Int64, stages]
            f16_a: cute.struct.Align[cute.struct.MemRange[Float16, cute.cosize(lay_fa)], 1024]
            f16_b: cute.struct.Align[cute.struct.MemRange[Float16, cute.cosize(lay_fb)], 1024]
            q_a: cute.struct.Align[cute.struct.MemRange[Uint8, cute.cosize(lay_qa)], 128]
            q_b: cute.struct.Align[cute.struct.MemRange[Uint8, cute.cosize(lay_qb)], 128]
            s_a: cute.struct.Align[cute.struct.MemRange[Uint8, cute.cosize(lay_sa)], 128]
            s_b: cute.struct.Align[cute.struct.MemRange[Uint8, cute.cosize(lay_sb)], 128]
            last_flag: cute.struct.MemRange[Int32, 1]

        self.shared_storage = SharedStorage
        m_tiles = (M + self.tile_m - 1) // self.tile_m
        n_tiles = (N + self.tile_n - 1) // self.tile_n
        sched = utils.PersistentTileSchedulerParams((m_tiles, n_tiles, self.splits), (1, 1, 1),
                                                    swizzle_size=self.swizzle,
                                                    raster_along_m=self.raster_along_m)
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, max_ctas)
        k_tiles = (k32 + 1) // 2
        k_per_split = (k_tiles + self.splits - 1) // self.splits
        self.kernel(tma, tiled_mma, (mD, mWork, mCount, mGate, mRes), mG, mailbox, sched,
                    k_tiles, k_per_split).launch(
            grid=grid, block=[self.threads, 1, 1], min_blocks_per_mp=1, stream=stream)

    @cute.kernel
    def kernel(self, tma, tiled_mma: cute.TiledMma, epi_tensors, mG, mailbox: cute.Tensor,
               sched_params, k_tiles: Int32, k_per_split: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        storage = cutlass.utils.SmemAllocator().allocate(self.shared_storage)
        full = storage.full.data_ptr()
        empty = storage.empty.data_ptr()
        if warp == 0:
            for atom, _ in tma:
                cpasync.prefetch_descriptor(atom)
            with cute.arch.elect_one():
                for s in cutlass.range_constexpr(self.stages):
                    cute.arch.mbarrier_init(full + s, 1)
                    cute.arch.mbarrier_init(empty + s, self.consumer.threads // 32)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        q_a, q_b, s_a, s_b = self.producer.smem_layouts(self.stages)
        sQA = storage.q_a.get_tensor(q_a)
        sQB = storage.q_b.get_tensor(q_b)
        sSA = storage.s_a.get_tensor(s_a)
        sSB = storage.s_b.get_tensor(s_b)
        f16_a, f16_b = self.consumer.smem_layouts()
        sA = storage.f16_a.get_tensor(f16_a.outer, swizzle=f16_a.inner)
        sB = storage.f16_b.get_tensor(f16_b.outer, swizzle=f16_b.inner)

        tile_sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
        work = tile_sched.initial_work_tile_info()

        if warp < 4:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                parts = self.producer.partition(tma, (sQA, sQB, sSA, sSB))
                count = Int32(0)
                while work.is_valid_tile:
                    m_idx, n_idx, split = work.tile_idx
                    kb0 = split * k_per_split
                    kb1 = cutlass.min(kb0 + k_per_split, k_tiles)
                    count = self.producer.load_tile(parts, full, empty, m_idx, n_idx, kb0, kb1,
                                                    count, self.stages, mailbox,
                                                    16 if self.variant.stall_producer else 0)
                    tile_sched.advance_to_next_work()
                    work = tile_sched.get_current_work()
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            ct = tidx - WARPGROUP
            wg = ct // WARPGROUP
            lane = tidx % 32
            wg_mma = tiled_mma.get_slice(wg * WARPGROUP)  # smem descriptors: one per warpgroup
            thr_mma = tiled_mma.get_slice(ct)  # accumulator registers: one per thread
            tCrA = tiled_mma.make_fragment_A(wg_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(wg_mma.partition_B(sB))
            tile_mn = (self.tile_m, self.tile_n)
            acc = cute.make_rmem_tensor(
                thr_mma.partition_C(cute.make_identity_tensor(tile_mn)).shape, Float32)
            mD, mWork, mCount, mGate, mRes = epi_tensors
            epi_ops = EpilogueOperands(d=mD, alpha=mG[0][0] * mG[1][0], work=mWork,
                                       count=mCount, flag=storage.last_flag.data_ptr(),
                                       gate=mGate, residual=mRes)
            n_tiles = (mD.shape[1] * 2 + self.tile_n - 1) // self.tile_n
            # raw word views for the dequant loads and swizzled stores
            q_words_a = self._word_view(storage.q_a.data_ptr(), cute.cosize(q_a))
            q_words_b = self._word_view(storage.q_b.data_ptr(), cute.cosize(q_b))
            sf_a = cute.make_tensor(cute.recast_ptr(storage.s_a.data_ptr(), dtype=Uint16),
                                    cute.make_layout(cute.cosize(s_a) // 2))
            sf_b = cute.make_tensor(cute.recast_ptr(storage.s_b.data_ptr(), dtype=Uint16),
                                    cute.make_layout(cute.cosize(s_b) // 2))
            f_words_a = self._word_view(storage.f16_a.data_ptr(), cute.cosize(f16_a) * 2)
            f_words_b = self._word_view(storage.f16_b.data_ptr(), cute.cosize(f16_b) * 2)
            count = Int32(0)
            while work.is_valid_tile:
                m_idx, n_idx, split = work.tile_idx
                kb0 = split * k_per_split
                kb1 = cutlass.min(kb0 + k_per_split, k_tiles)
                acc.fill(0.0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                for kt in cutlass.range(kb0, kb1, unroll=1):
                    s, ph = ring_position(count, self.stages)
                    buf = count % self.consumer.buffers
                    wait_parity(full + s, ph, 0, s, mailbox)
                    if cutlass.const_expr(not self.variant.skip_dequant):
                        self.consumer.dequant_rows(ct, self.tile_m, q_words_a, sf_a, f_words_a, s,
                                                   buf)
                        self.consumer.dequant_rows(ct, self.tile_n, q_words_b, sf_b, f_words_b, s,
                                                   buf)
                    # our f16 stores -> wgmma (async proxy); our packed reads -> the next TMA
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(empty + s)
                    cute.arch.barrier(barrier_id=1, number_of_threads=self.consumer.threads)
                    if cutlass.const_expr(not self.variant.skip_mma):
                        self.consumer.mma(tiled_mma, acc, tCrA, tCrB, buf)
                        cute.nvgpu.warpgroup.wait_group(self.consumer.mma_in_flight)
                    count = count + 1
                cute.nvgpu.warpgroup.wait_group(0)
                self.epilogue.store(acc, thr_mma, tile_mn, epi_ops, OutputTile(
                    m0=m_idx * self.tile_m, n0=n_idx * self.tile_n,
                    tile_id=m_idx * n_tiles + n_idx, split=split, ct=ct))
                tile_sched.advance_to_next_work()
                work = tile_sched.get_current_work()

    @staticmethod
    def _word_view(byte_ptr, nbytes: int):
        """(4 words, 16-byte chunk) view of a 16-byte-aligned smem byte range."""
        words = cute.recast_ptr(byte_ptr, dtype=Uint32)
        return cute.make_tensor(words, cute.make_layout((4, nbytes // 16), stride=(1, 4)))


PTRS = ((Uint8, 16), (Uint8, 16), (Uint8, 16), (Uint8, 16), (Float32, 4), (Float32, 4),
        (cutlass.BFloat16, 16), (Int32, 4), (Float32, 16), (Int32, 4), (cutlass.BFloat16, 4),
        (cutlass.BFloat16, 4))
# a, sfa, b, sfb, gA, gB, d, diagnostics mailbox, split-K workspace, split-K tile counters,
# the epilogue's gate and residual


def compile_args(M: int = 256, N: int = 512, K: int = 256):
    """Arguments for cute.compile offline (placeholder addresses, never dereferenced)."""
    from cutlass.cute.runtime import make_fake_stream

    from kernels.device.runtime import pointer_args

    return (*pointer_args(PTRS), Int32(M), Int32(N), Int32(K // 32), Int32(132),
            make_fake_stream())
