"""The skinny split-K projection with ``wgmma`` taking the weights from registers
(notes/fast-loop.md v11a).

The mma.sync kernel (kernels/depth/gemm_skinny.py) keeps its weight fragments in registers, loaded
before the PDL wait, so a CTA resident under its predecessor streams its weights early; its mma
phase is issue-bound (1.6-2.4 µs a projection at 64 rows). The shared-memory wgmma kernel
(kernels/depth/gemm_skinny_wgmma.py) halves that phase but its CTAs need 58-231 KB of shared memory,
which keeps them, and the next kernel's, from becoming resident early (v10j/v10k). This one
keeps mma.sync's residency and takes wgmma's mma phase:

* the weights as wgmma's A operand in registers (``wgmma.m64nNk16`` with A in registers: per
  warp the fragment layout of mma.m16n8k16's A), packed once (:func:`pack_weights_rwgmma`) so
  that one 16-byte load gives a lane its fragment of one k16 step; loaded before the PDL wait;
* the a slice as the B operand from shared memory, brought by the async proxy (no proxy
  fence; v10a's register-A wgmma lost because cp.async's fence compiled to a MEMBAR that
  waited for every weight load), one mbarrier a stage: ``a_copy="bulk"``, 1-D bulk copies
  into wgmma's canonical no-swizzle image, so the producer must write a chunk-major ([K / 8][M]
  [8]), as for the shared-memory wgmma kernel; or ``a_copy="tma"``, a row-major a by TMA, one
  box of M rows x 64 columns a 64-wide K chunk, into the 128-byte-swizzled K-major image.

The D fragment of m64nN is, per warp, that of N / 8 m16n8 tiles, so the partial tile, the
cluster reduction and the epilogues are GemmSkinny's.
"""
from __future__ import annotations

from configs.arch import SMEM_PER_CTA_MAX
from kernels.depth.gemm_skinny import (PART_PAD, WARPS, GemmSkinny, PackedWeights, _ptr_specs,
                                       check_chunk_major_out, check_tiling, checked_operands,
                                       fitting_stages, split_count, stage_count, weight_groups)
from kernels.depth.gemm_skinny_wgmma import bulk_copy_g2s, descriptor, smem_u32
from device.ptx import pdl_launch_dependents, pdl_wait, timing_perturbation
from device.runtime import cached_compile, cute_modules, current_stream, pointer_args
from device.wgmma import sw128_kmajor_descriptor, wgmma_rs_m64k16
from device.barriers import Barrier
from device.waits import diagnostics_mailbox, wait_parity

cutlass, cute = cute_modules()
from cutlass import BFloat16, Float32, Int32, Int64, Uint32  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402

LAYOUT = "rwgmma"  # PackedWeights.layout of this kernel's weights
A_COPIES = ("bulk", "tma")  # how the a slice reaches shared memory (module notes)
TMA_K = 64  # K columns of a TMA box: one 128-byte swizzle row of bf16
SW128_ATOM = 1024  # bytes of an 8-row swizzle atom: the SBO of the swizzled image


def pack_weights_rwgmma(w, swiglu: bool = False) -> PackedWeights:
    """``w`` [N, K] (SwiGLU [2N, K], gate rows then up rows) as wgmma's register A fragments:
    pack_weights' groups of 16 rows (16 output columns, or 8 columns' gate and up rows), and
    per k16 step t and lane (g, q) one 16-byte unit, a0..a3 = the bf16 pairs (row g, k), (row
    g + 8, k), (g, k + 8), (g + 8, k + 8) at k = 16t + 2q. K keeps its order (the hardware
    reads B in it). Order: [group, step, lane, 8 elements]."""
    rows, K = w.shape
    grouped = weight_groups(w, swiglu, 16)
    G = grouped.shape[0]
    # [group, h, g, t, j, q, e] -> [group, t, g, q, j, h, e]: row 8h + g, k = 16t + 8j + 2q + e
    packed = grouped.reshape(G, 2, 8, K // 16, 2, 4, 2).permute(0, 3, 2, 5, 4, 1, 6)
    return PackedWeights(packed.contiguous().reshape(rows, K), swiglu, layout=LAYOUT)


def rwgmma_smem_bytes(M: int, k_slice: int, tile_rows: int, stages: int) -> int:
    """Shared memory of a CTA: the a slice, the fp32 partial tile, the stages' mbarriers (and
    the slice's 1024-byte alignment)."""
    return 2 * k_slice * M + M * (tile_rows + PART_PAD) * 4 + 8 * stages + 1024


class GemmSkinnyRegWgmma(GemmSkinny):
    """:class:`GemmSkinny` (its tiles, slices, launch bounds, reduction and epilogues) with the
    register-A wgmma mainloop (module notes). ``stages``: K-ranges of the a slice, each with
    its own mbarrier (and bulk copy; with TMA a whole number of 64-column boxes). ``a_copy``:
    "bulk" (a chunk-major) or "tma" (a row-major)."""

    def __init__(self, M: int, K: int, *, residual: bool = False, swiglu: bool = False,
                 out_f32: bool = False, pdl: bool = False, splits: int | None = None,
                 warps: int = WARPS, m_split: int = 1, trace: bool = False, stages: int = 1,
                 chunk_major_out: bool = False, a_copy: str = "bulk"):
        super().__init__(M, K, residual=residual, swiglu=swiglu, out_f32=out_f32, pdl=pdl,
                         splits=splits, warps=warps, m_split=m_split, trace=trace,
                         chunk_major_out=chunk_major_out)
        if a_copy not in A_COPIES:
            raise ValueError(f"a_copy {a_copy!r}: one of {A_COPIES}")
        if a_copy == "tma" and (self.k_slice // TMA_K) % stages:
            raise ValueError(f"a_copy 'tma': {stages} stages must divide the slice's "
                             f"{self.k_slice // TMA_K} boxes of {TMA_K} columns")
        self.a_copy = a_copy
        if (M // m_split) % 8 or M // m_split > 256:
            raise ValueError(f"wgmma: {M // m_split} a rows a warpgroup, need a multiple of 8 "
                             "up to 256")
        steps = self.k_slice // 16
        if stages not in (1, 2, 4, 8) or steps % stages:
            raise ValueError(f"stages = {stages}: 1, 2, 4 or 8 dividing the slice's {steps} "
                             "k16 steps")
        self.stages = stages
        self.smem_bytes = rwgmma_smem_bytes(M, self.k_slice, self.tile_n, stages)
        if self.smem_bytes > SMEM_PER_CTA_MAX:
            raise ValueError(f"M = {M}, K = {K} in {self.splits} slices: {self.smem_bytes} "
                             f"bytes of shared memory exceed {SMEM_PER_CTA_MAX}")

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, w_ptr: cute.Pointer, y_ptr: cute.Pointer,
                 resid_ptr: cute.Pointer, trace_ptr: cute.Pointer, mailbox_ptr: cute.Pointer,
                 N: Int32, ldy: Int32, stream):
        M, tiles = self.M, N // self.tile_out
        mY, mR, mT, mailbox = self._output_views(y_ptr, resid_ptr, trace_ptr, mailbox_ptr, N,
                                                 ldy)
        mW = cute.make_tensor(w_ptr, cute.make_layout((4, self.w_rows * N * self.K // 8),
                                                      stride=(1, 4)))
        launch = dict(grid=[tiles, self.splits, 1], block=[self.threads, 1, 1],
                      cluster=[1, self.splits, 1], stream=stream, use_pdl=self.pdl,
                      **self._occupancy())
        if cutlass.const_expr(self.a_copy == "tma"):  # a row-major bf16 [M, K]
            gA = cute.make_tensor(a_ptr, cute.make_layout((M, self.K), stride=(self.K, 1)))
            tma_atom, tma_a = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), gA, self._box_layout(), (M, TMA_K))
            self.kernel_tma(tma_atom, tma_a, mW, mY, mR, mT, mailbox).launch(**launch)
        else:  # a chunk-major, as 32-bit words for the bulk copies
            mA = cute.make_tensor(a_ptr, cute.make_layout(M * self.K // 2))
            self.kernel(mA, mW, mY, mR, mT, mailbox).launch(**launch)

    def _box_layout(self):
        """The shared-memory image of one TMA box: M rows x TMA_K columns, K-major, in 8-row
        128-byte-swizzled atoms (wgmma's SW128 K-major layout)."""
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            cute.nvgpu.warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
        return cute.tile_to_shape(atom, (self.M, TMA_K), order=(0, 1))

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor,
               mT: cute.Tensor, mailbox: cute.Tensor):
        tidx, tile, split, lane, _, warp, half, g, q = self._thread_coords(mT)
        M = self.M
        slice_c = self.k_slice // 8
        stage_c = slice_c // self.stages  # 16-byte chunks of a row per stage
        c0 = split * slice_c
        if cutlass.const_expr(self.pdl):
            pdl_launch_dependents()
        frags = self._load_fragments(mW, tile * self.warps + warp, c0, lane)
        smem = cutlass.memory.SmemAllocator()
        sA = smem.allocate_tensor(Uint32, cute.make_layout(slice_c * M * 4), 1024)
        sP, full = self._partials_and_barriers(smem, tidx)
        if cutlass.const_expr(self.pdl):
            pdl_wait()
        self._stamp(mT, tile, split, tidx, 1)
        # 2. the a slice (chunk-major in global memory: one contiguous run a stage)
        a_bytes = stage_c * M * 16
        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                bulk_copy_g2s(sA.iterator + s * a_bytes // 4,
                              mA.iterator + (c0 + s * stage_c) * M * 4, a_bytes, full + s)
        # 3. per stage, as it lands: this warpgroup's wgmma over its k16 steps
        acc = self._mainloop(frags, sA, full, half, stage_c, mailbox, mT, tile, split, tidx)
        self._store_partials(acc, sP, half * self.ntiles_warp, warp, g, q)
        self._stamp(mT, tile, split, tidx, 3)
        self._exchange_and_store(sP, mY, mR, mT, tile, split, tidx)

    @cute.kernel
    def kernel_tma(self, tma_atom: cute.CopyAtom, tma_a: cute.Tensor, mW: cute.Tensor,
                   mY: cute.Tensor, mR: cute.Tensor, mT: cute.Tensor, mailbox: cute.Tensor):
        """:meth:`kernel` with the a slice by TMA from a row-major a (``a_copy="tma"``)."""
        tidx, tile, split, lane, warp_idx, warp, half, g, q = self._thread_coords(mT)
        M = self.M
        slice_c = self.k_slice // 8
        c0 = split * slice_c
        boxes = self.k_slice // TMA_K  # of this slice
        if cutlass.const_expr(self.pdl):
            pdl_launch_dependents()
        frags = self._load_fragments(mW, tile * self.warps + warp, c0, lane)
        smem = cutlass.memory.SmemAllocator()
        sA = smem.allocate_tensor(BFloat16, cute.append(
            self._box_layout(), cute.make_layout(boxes, stride=M * TMA_K)), SW128_ATOM)
        sP, full = self._partials_and_barriers(smem, tidx)
        if cutlass.const_expr(self.pdl):
            pdl_wait()
        self._stamp(mT, tile, split, tidx, 1)
        # 2. the slice's boxes (M rows x 64 columns of a), each stage's on its mbarrier; warp 0
        # issues them (the TMA copy elects one lane of a whole warp)
        if warp_idx == 0:
            gA = cute.local_tile(tma_a, (M, TMA_K), (0, None))  # [(M, 64), K / 64]
            ts, tg = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1),
                                           cute.group_modes(sA, 0, 2),
                                           cute.group_modes(gA, 0, 2))
            per_stage = boxes // self.stages
            for j in cutlass.range_constexpr(boxes):
                cute.copy(tma_atom, tg[(None, split * boxes + j)], ts[(None, j)],
                          tma_bar_ptr=full + j // per_stage)
        acc = self._mainloop(frags, sA, full, half, slice_c // self.stages, mailbox, mT, tile,
                             split, tidx)
        self._store_partials(acc, sP, half * self.ntiles_warp, warp, g, q)
        self._stamp(mT, tile, split, tidx, 3)
        self._exchange_and_store(sP, mY, mR, mT, tile, split, tidx)

    @cute.jit
    def _load_fragments(self, mW: cute.Tensor, group, c0, lane) -> list:
        """1. the warp's weight fragments (constants) into registers, before the PDL wait: one
        16-byte unit a lane and k16 step of the slice (pack_weights_rwgmma)."""
        frags = []
        for t in cutlass.range_constexpr(self.k_slice // 16):
            frag = cute.make_rmem_tensor((4,), Uint32)
            cute.autovec_copy(mW[(None, (group * (self.K // 16) + c0 // 2 + t) * 32 + lane)],
                              frag)
            frags.append(frag)
        return frags

    @cute.jit
    def _partials_and_barriers(self, smem, tidx):
        """The fp32 partial tile and the stages' mbarriers (each expecting its stage's bytes),
        initialised before any thread goes on."""
        sP = smem.allocate_tensor(Float32, cute.make_layout(
            (self.M, self.tile_n), stride=(self.tile_n + PART_PAD, 1)), 16)
        full = smem.allocate_tensor(Int64, cute.make_layout(self.stages), 8).iterator
        a_bytes = self.k_slice * self.M * 2 // self.stages
        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_arrive_and_expect_tx(full + s, a_bytes)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()  # the barriers are initialised before anyone waits on them
        return sP, full

    @cute.jit
    def _mainloop(self, frags: list, sA: cute.Tensor, full: cute.Pointer, half,
                  stage_c: cutlass.Constexpr[int], mailbox: cute.Tensor, mT: cute.Tensor,
                  tile, split, tidx) -> list:
        """wgmma m64nNk16 (N = M / m_split a rows, this warpgroup's part) per k16 step, each
        stage's after its mbarrier; the accumulators as the mma.sync path's n-tiles of 4. B's
        canonical no-swizzle K-major image: K-adjacent core matrices M x 16 bytes apart (LBO),
        8-row groups 128 bytes apart (SBO), as kernels/depth/gemm_skinny_wgmma.py measured it."""
        M = self.M
        n = M // self.m_split
        if cutlass.const_expr(self.a_copy == "tma"):  # SW128 K-major: 8-row atoms 1024 apart
            start = smem_u32(sA.iterator) + half * (n // 8) * SW128_ATOM
            desc_b = sw128_kmajor_descriptor(start, SW128_ATOM)
        else:
            desc_b = descriptor(smem_u32(sA.iterator) + half * (n // 8) * 128, M * 16, 128)
        acc = [Float32(0.0)] * (n // 2)
        cute.nvgpu.warpgroup.fence()
        for s in cutlass.range_constexpr(self.stages):
            wait_parity(full + s, Int32(0), Barrier.FULL, Int32(s), mailbox)
            if cutlass.const_expr(s == 0):
                self._stamp(mT, tile, split, tidx, 2)
            for k in cutlass.range_constexpr(stage_c // 2):  # k16 steps: two chunks each
                t = s * (stage_c // 2) + k
                f = frags[t]
                acc = wgmma_rs_m64k16(acc, tuple(f[i] for i in range(4)),
                                      desc_b + Int64(self._step_offset(t)))
        cute.nvgpu.warpgroup.commit_group()
        cute.nvgpu.warpgroup.wait_group(0)
        return [acc[4 * t: 4 * t + 4] for t in range(self.ntiles_warp)]


    def _step_offset(self, t: int) -> int:
        """k16 step t's start in B's image, in 16-byte units: two chunks of M rows further
        (no swizzle), or within a 64-column box 32 bytes further, boxes M x 128 bytes apart
        (SW128: the hardware applies the swizzle to the advanced address)."""
        if self.a_copy == "tma":
            per_box = TMA_K // 16
            return (t // per_box) * self.M * 8 + (t % per_box) * 2
        return 2 * t * self.M


def compile_args(out_f32: bool = False, a_copy: str = "bulk"):
    return (*pointer_args(_specs(out_f32, a_copy)), Int32(4096), Int32(4096),
            make_fake_stream())


def _specs(out_f32: bool, a_copy: str) -> tuple:
    """Pointer specs: gemm_skinny's (a as 16-byte words; bf16 elements for TMA), a mailbox."""
    specs = _ptr_specs(out_f32) + ((Int32, 4),)
    return ((BFloat16, 16),) + specs[1:] if a_copy == "tma" else specs


def gemm_skinny_rwgmma(x_cm, w: PackedWeights, out, *, resid=None, swiglu: bool = False,
                       pdl: bool = False, splits: int | None = None, warps: int | None = None,
                       m_split: int | None = None, trace=None, a_stages: int | None = None,
                       chunk_major_out: bool = False, a_copy: str = "bulk"):
    """As :func:`kernels.depth.gemm_skinny.gemm_skinny`, with ``w`` packed by
    :func:`pack_weights_rwgmma` and ``x_cm`` the activations chunk-major
    (kernels.depth.gemm_skinny_wgmma.chunk_major) for ``a_copy="bulk"``, row-major for "tma".
    The tile defaults are gemm_skinny's; ``a_stages``: the slice's K-ranges, default gemm_skinny's
    ``stage_count`` where it fits."""
    M, K, N, out_f32, warps, m_split = checked_operands(x_cm, w, out, resid, swiglu, warps,
                                                        m_split, layout=LAYOUT)
    if not a_stages:
        k_slice = K // (splits or split_count(M, K, warps))
        a_stages = fitting_stages(stage_count(w.data.shape[0], K, M), M, k_slice,
                                  32 * warps * m_split)
    cfg = GemmSkinnyRegWgmma(M, K, residual=resid is not None, swiglu=swiglu, out_f32=out_f32,
                             pdl=pdl, splits=splits, warps=warps, m_split=m_split,
                             trace=trace is not None, stages=a_stages,
                             chunk_major_out=chunk_major_out, a_copy=a_copy)
    check_chunk_major_out(chunk_major_out, out)
    check_tiling(cfg, N, trace)
    ptrs = pointer_args(_specs(cfg.out_f32, a_copy),
                        (x_cm, w.data, out, resid if resid is not None else x_cm,
                         trace if trace is not None else x_cm, diagnostics_mailbox()))
    key = ("gemm_skinny_rwgmma", M, K, cfg.residual, swiglu, cfg.out_f32, pdl, cfg.splits,
           warps, m_split, cfg.trace, cfg.stages, chunk_major_out, a_copy, timing_perturbation())
    compiled = cached_compile(key, lambda: cute.compile(
        cfg, *ptrs, Int32(N), Int32(out.stride(0)), current_stream()))
    compiled(*ptrs, Int32(N), Int32(out.stride(0)), current_stream())
    return out
