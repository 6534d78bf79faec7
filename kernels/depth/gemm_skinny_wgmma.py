"""The skinny split-K projection with ``wgmma`` fed from shared memory (notes/fast-loop.md v10j).

The same tiles, slices, cluster reduction and epilogues as kernels/depth/gemm_skinny.py; only the
mainloop differs. Both operands reach shared memory by 1-D bulk copies (``cp.async.bulk``,
the async proxy: no generic-proxy writes, so no proxy fence, which v10a found compiles to a
MEMBAR waiting for every outstanding load), each K-range ("stage") completing the bytes of its
own mbarrier:

* the weights (constants) before the PDL wait, packed once (:func:`pack_weights_wgmma`) as
  [tile][K / 8][tile rows][8]: a CTA's slice of a stage is one contiguous run that lands in
  wgmma's canonical K-major, no-swizzle image (8-row x 16-byte core matrices, K-adjacent ones
  ``tile rows`` x 16 bytes apart, 8-row groups 128 bytes apart);
* the activations after it, which the producer must hold *chunk-major*, [K / 8][M][8]
  (:func:`chunk_major`), so that a stage of the slice is again one contiguous run in the same
  canonical image.

Each warpgroup (4 warps, 64 weight rows; with ``m_split`` 2 each of two warpgroups takes half
of the a rows) issues one ``wgmma.m64nNk16`` per k16 step as its stage lands, then waits once.
The D fragment of m64nN is, per warp, that of N / 8 m16n8 tiles, so the partial tile goes to
shared memory exactly as the mma.sync path's does (``GemmSkinny._store_partials``) and the
reduction is that path's. The weights no longer occupy registers (64-192 a thread there).

Tests: tests/test_gemm_skinny_wgmma.py.
"""
from __future__ import annotations

from configs.arch import SMEM_PER_CTA_MAX
from kernels.depth.gemm_skinny import (MAX_SPLITS, PART_PAD, WARPS, GemmSkinny, PackedWeights,
                                       _ptr_specs, check_chunk_major_out, check_tiling,
                                       checked_operands, weight_groups)
from device.ptx import bulk_copy_g2s, smem_u32  # noqa: F401  (used here and by rwgmma)
from device.ptx import pdl_launch_dependents, pdl_wait, timing_perturbation
from device.wgmma import wgmma_ss_m64k16
from device.runtime import cached_compile, cute_modules, current_stream, pointer_args
from device.barriers import Barrier
from device.waits import diagnostics_mailbox, wait_parity

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Int64, Uint32  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402

WGMMA_WARPS = 4  # the fast loop's tiles (64 weight rows: every projection's slices fit)
STAGES = 4  # K-ranges of a slice, each with its own mbarrier (fewer where the slice is short)


def wgmma_smem_bytes(M: int, k_slice: int, tile_rows: int, stages: int) -> int:
    """Shared memory of a CTA: the weight slice, the a slice (both 2 bytes an element), the
    fp32 partial tile (padded rows) and the stages' mbarriers."""
    return 2 * k_slice * (tile_rows + M) + M * (tile_rows + PART_PAD) * 4 + 8 * stages + 128


def wgmma_split_count(M: int, K: int, warps: int = WARPS) -> int:
    """Slices per tile: 4 where both operands' slices fit in shared memory, else up to 8."""
    for s in range(min(4, max(1, K // 256)), MAX_SPLITS + 1):
        if K % (128 * s) == 0 and (M * 32) % s == 0 \
                and wgmma_smem_bytes(M, K // s, 16 * warps, STAGES) <= SMEM_PER_CTA_MAX:
            return s
    raise ValueError(f"M = {M}, K = {K}: no slice count up to {MAX_SPLITS} fits")


def pack_weights_wgmma(w, swiglu: bool = False, warps: int = WARPS) -> PackedWeights:
    """``w`` [N, K] (SwiGLU [2N, K], gate rows then up rows) as [tile][K / 8][16 * warps][8]:
    the weight groups of pack_weights (16 output columns, or 8 columns' gate and up rows) in
    tiles of ``warps``, each 16-byte chunk of K holding the tile's rows in order. A CTA's stage
    is one contiguous run, wgmma's canonical K-major image of the tile's rows."""
    rows, K = w.shape
    t = 16 * warps
    if K % 8 or rows % t or (swiglu and rows % 32):
        raise ValueError(f"w {tuple(w.shape)}: K a multiple of 8, rows of {t} (tiles of "
                         f"{warps} warps)")
    grouped = weight_groups(w, swiglu, 8)
    tiles = grouped.reshape(rows // t, t, K // 8, 8).permute(0, 2, 1, 3)
    return PackedWeights(tiles.contiguous().reshape(rows, K), swiglu, layout=f"wgmma{warps}")


def chunk_major(a):
    """a [M, K] -> [K / 8, M, 8] contiguous (returned as [M, K]-shaped storage): the layout in
    which the producer of this kernel's activations must write them."""
    M, K = a.shape
    return a.reshape(M, K // 8, 8).transpose(0, 1).contiguous().reshape(M, K)


def descriptor(start: Int32, lbo: int, sbo: int) -> Int64:
    """A K-major, no-swizzle shared-memory matrix descriptor: start, LBO (K-adjacent core
    matrices) and SBO (8-row groups) in 16-byte units in bits 0-13, 16-29, 32-45."""
    return Int64(((start >> 4) & 0x3FFF) | ((lbo >> 4) << 16)) | (Int64(sbo >> 4) << 32)


class GemmSkinnyWgmma(GemmSkinny):
    """:class:`GemmSkinny` with the wgmma mainloop (module notes). ``stages``: K-ranges of a
    slice (default ``STAGES``, fewer where a slice has fewer k16 steps' worth of chunks)."""

    def __init__(self, M: int, K: int, *, residual: bool = False, swiglu: bool = False,
                 out_f32: bool = False, pdl: bool = False, splits: int | None = None,
                 warps: int = WARPS, m_split: int = 1, trace: bool = False,
                 stages: int | None = None, chunk_major_out: bool = False,
                 swap_strides: bool = False):
        splits = splits or wgmma_split_count(M, K, warps)
        self.swap_strides = swap_strides
        super().__init__(M, K, residual=residual, swiglu=swiglu, out_f32=out_f32, pdl=pdl,
                         splits=splits, warps=warps, m_split=m_split, trace=trace,
                         chunk_major_out=chunk_major_out)
        if (M // m_split) % 8 or M // m_split > 256:
            raise ValueError(f"wgmma: {M // m_split} a rows a warpgroup, need a multiple of 8 "
                             "up to 256")
        slice_c = self.k_slice // 8
        self.stages = stages or min(STAGES, slice_c // 2)
        if slice_c % (2 * self.stages):
            raise ValueError(f"stages = {self.stages}: must divide the slice's "
                             f"{slice_c // 2} k16 steps")
        self.smem_bytes = wgmma_smem_bytes(M, self.k_slice, self.tile_n, self.stages)
        if self.smem_bytes > SMEM_PER_CTA_MAX:
            raise ValueError(f"M = {M}, K = {K} in {splits} slices: {self.smem_bytes} bytes of "
                             f"shared memory exceed {SMEM_PER_CTA_MAX}")

    def _occupancy(self) -> dict:
        return {}  # no weight registers: no launch bound needed

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, w_ptr: cute.Pointer, y_ptr: cute.Pointer,
                 resid_ptr: cute.Pointer, trace_ptr: cute.Pointer, mailbox_ptr: cute.Pointer,
                 N: Int32, ldy: Int32, stream):
        M, tiles = self.M, N // self.tile_out
        mY, mR, mT, mailbox = self._output_views(y_ptr, resid_ptr, trace_ptr, mailbox_ptr, N,
                                                 ldy)
        # a (chunk-major) and the packed weights as 32-bit words: only bulk copies read them
        mA = cute.make_tensor(a_ptr, cute.make_layout(M * self.K // 2))
        mW = cute.make_tensor(w_ptr, cute.make_layout(self.w_rows * N * self.K // 2))
        self.kernel(mA, mW, mY, mR, mT, mailbox).launch(
            grid=[tiles, self.splits, 1], block=[self.threads, 1, 1],
            cluster=[1, self.splits, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor,
               mT: cute.Tensor, mailbox: cute.Tensor):
        tidx, tile, split, _, _, warp, half, g, q = self._thread_coords(mT)
        M, tr = self.M, self.tile_n  # a rows, weight rows of the tile
        slice_c = self.k_slice // 8
        stage_c = slice_c // self.stages  # 16-byte chunks of a row per stage
        c0 = split * slice_c
        if cutlass.const_expr(self.pdl):
            pdl_launch_dependents()
        smem = cutlass.memory.SmemAllocator()
        sW = smem.allocate_tensor(Uint32, cute.make_layout(slice_c * tr * 4), 1024)
        sA = smem.allocate_tensor(Uint32, cute.make_layout(slice_c * M * 4), 1024)
        sP = smem.allocate_tensor(Float32, cute.make_layout((M, tr), stride=(tr + PART_PAD, 1)),
                                  16)
        full = smem.allocate_tensor(Int64, cute.make_layout(self.stages), 8).iterator
        w_bytes, a_bytes = stage_c * tr * 16, stage_c * M * 16  # a stage of each operand
        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                cute.arch.mbarrier_init(full + s, 1)
                cute.arch.mbarrier_arrive_and_expect_tx(full + s, w_bytes + a_bytes)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()  # the barriers are initialised before anyone waits on them
        # 1. the weight slice (constants), stage by stage, before the PDL wait
        w_words, a_words = mW.iterator, mA.iterator
        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                first = (tile * (self.K // 8) + c0 + s * stage_c) * tr * 4  # 32-bit words
                bulk_copy_g2s(sW.iterator + s * w_bytes // 4, w_words + first, w_bytes, full + s)
        if cutlass.const_expr(self.pdl):
            pdl_wait()
        self._stamp(mT, tile, split, tidx, 1)
        # 2. the a slice (chunk-major in global memory), stage by stage
        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                first = (c0 + s * stage_c) * M * 4
                bulk_copy_g2s(sA.iterator + s * a_bytes // 4, a_words + first, a_bytes, full + s)
        # 3. per stage, as it lands: this warpgroup's wgmma over its k16 steps
        acc = self._mainloop(sW, sA, full, warp, half, stage_c, mailbox, mT, tile, split, tidx)
        self._store_partials(acc, sP, half * self.ntiles_warp, warp, g, q)
        self._stamp(mT, tile, split, tidx, 3)
        self._exchange_and_store(sP, mY, mR, mT, tile, split, tidx)

    @cute.jit
    def _mainloop(self, sW: cute.Tensor, sA: cute.Tensor, full: cute.Pointer, warp, half,
                  stage_c: cutlass.Constexpr[int], mailbox: cute.Tensor, mT: cute.Tensor,
                  tile, split, tidx) -> list:
        """wgmma m64nNk16 (N = M / m_split) per k16 step, each stage's after its mbarrier; the
        accumulators returned as the mma.sync path's n-tiles of 4."""
        M, tr = self.M, self.tile_n
        n = M // self.m_split
        wgroup = warp // 4  # which 64 of the tile's weight rows
        # K-adjacent core matrices ``rows`` x 16 bytes apart (LBO), 8-row groups 128 (SBO);
        # ``swap_strides`` (a diagnostic, scripts/check_wgmma_layout.py) puts them the other way
        k_a, k_b = (128, 128) if self.swap_strides else (tr * 16, M * 16)
        r_a, r_b = (tr * 16, M * 16) if self.swap_strides else (128, 128)
        desc_a = descriptor(smem_u32(sW.iterator) + wgroup * 64 * 16, k_a, r_a)
        desc_b = descriptor(smem_u32(sA.iterator) + half * (n // 8) * 128, k_b, r_b)
        acc = [Float32(0.0)] * (n // 2)
        cute.nvgpu.warpgroup.fence()
        for s in cutlass.range_constexpr(self.stages):
            wait_parity(full + s, Int32(0), Barrier.FULL, Int32(s), mailbox)
            if cutlass.const_expr(s == 0):
                self._stamp(mT, tile, split, tidx, 2)
            for k in cutlass.range_constexpr(stage_c // 2):  # k16 steps: two chunks each
                chunk = s * stage_c + 2 * k
                acc = wgmma_ss_m64k16(acc, desc_a + Int64(chunk * tr),
                                      desc_b + Int64(chunk * M))
        cute.nvgpu.warpgroup.commit_group()
        cute.nvgpu.warpgroup.wait_group(0)
        return [acc[4 * t: 4 * t + 4] for t in range(self.ntiles_warp)]


def compile_args(out_f32: bool = False):
    return (*pointer_args(_ptr_specs(out_f32) + ((Int32, 4),)), Int32(4096), Int32(4096),
            make_fake_stream())


def gemm_skinny_wgmma(x_cm, w: PackedWeights, out, *, resid=None, swiglu: bool = False,
                      pdl: bool = False, splits: int | None = None, warps: int | None = None,
                      m_split: int | None = None, trace=None, stages: int | None = None,
                      chunk_major_out: bool = False):
    """As :func:`kernels.depth.gemm_skinny.gemm_skinny`, with ``x_cm`` the activations
    chunk-major (:func:`chunk_major`, [M, K]-shaped storage) and ``w`` packed by
    :func:`pack_weights_wgmma` (``warps`` defaults to, and must equal, its tiles').
    ``chunk_major_out``: ``out`` (contiguous) chunk-major too, for a next wgmma projection
    (SwiGLU or plain bf16 only)."""
    M, K, N, out_f32, warps, m_split = checked_operands(x_cm, w, out, resid, swiglu, warps,
                                                        m_split, layout="wgmma")
    cfg = GemmSkinnyWgmma(M, K, residual=resid is not None, swiglu=swiglu, out_f32=out_f32,
                          pdl=pdl, splits=splits, warps=warps, m_split=m_split,
                          trace=trace is not None, stages=stages, chunk_major_out=chunk_major_out)
    check_chunk_major_out(chunk_major_out, out)
    check_tiling(cfg, N, trace)
    ptrs = pointer_args(_ptr_specs(cfg.out_f32) + ((Int32, 4),),
                        (x_cm, w.data, out, resid if resid is not None else x_cm,
                         trace if trace is not None else x_cm, diagnostics_mailbox()))
    key = ("gemm_skinny_wgmma", M, K, cfg.residual, swiglu, cfg.out_f32, pdl, cfg.splits,
           warps, m_split, cfg.trace, cfg.stages, chunk_major_out, timing_perturbation())
    compiled = cached_compile(key, lambda: cute.compile(
        cfg, *ptrs, Int32(N), Int32(out.stride(0)), current_stream()))
    compiled(*ptrs, Int32(N), Int32(out.stride(0)), current_stream())
    return out
