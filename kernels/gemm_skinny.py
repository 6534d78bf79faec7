"""Skinny bf16 projections y[M, N] = a[M, K] · W[N, K]^T for 16 <= M <= 128 rows (M a multiple
of 16) on tensor cores, with the depth loop's epilogues (residual, SwiGLU, fp32 logits).

Above 8 rows the CUDA-core GEMV is FMA-bound and cuBLAS streams these weights at 0.7-2 TB/s.
Here every CTA owns a 64-column tile of y (SwiGLU: 32 gate + 32 up columns) and one 256-wide
slice of K, so the grid is (N / 64) x (K / 256) CTAs and each CTA reads only its slice of a:
the activations are read (N / 64) times in all, not once per CTA (which would be 4-5x the weight
traffic at 64 rows).

Per CTA (4 warps, each 16 columns = two 8-column n-tiles): the warps' weight rows are loaded
into registers first (16-byte loads; constants, so before the PDL wait), the a slice is copied
into shared memory with ``cp.async`` (rows padded by 64 bytes so the fragment reads are free of
bank conflicts), then ``mma.sync.m16n8k16`` bf16 -> fp32 over the slice. K is permuted inside
each 32-wide block so that a lane's A and B fragments are whole 16-byte chunks: lane (g, q)
holds k = 8q..8q+7 of its rows, words 0-1 feed the first k16 step and words 2-3 the second (the
same permutation on both operands, so the products and their sum are unchanged).

Split-K reduction, deterministic: each CTA stores its fp32 partial tile to a workspace, then one
thread bumps the tile's counter (``atom.add.acq_rel.gpu``); the last CTA adds the partials in
slice order 0, 1, ..., applies the epilogue (rounding as kernels/gemv_small_m.py) and re-arms
the counter to 0 for the next launch. No CTA waits on another.
"""
from __future__ import annotations

from kernels.gemv_small_m import check_projection_out, epilogue_store, projection_dims
from kernels.runtime import (cached_compile, cute_modules, current_stream, pointer_args,
                             require_hopper)
from kernels.sync_sm90 import count_split_arrival

cutlass, cute = cute_modules()
from cutlass import BFloat16, Float32, Int32, Uint32  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

WARPS = 4
K_SLICE = 256  # K per CTA
TILE_N = 64  # output columns per CTA (SwiGLU: 32 gate + 32 up)
PAD = 8  # 16-byte chunks per padded smem row: 256 + 32 elements
REDUCE_GROUP = 8  # outputs per thread whose partials are loaded together in the reduction


def fragment_words(step: int):
    """The K permutation, as data (tests/test_depth_kernels.py checks it against the PTX
    fragment layouts). Lane (g, q) holds, for a 32-wide k block, the 16-byte chunk k = 8q..8q+7
    of A rows g and g + 8 ("lo", "hi") and of its weight row; k16 step ``step`` takes the A
    registers a0..a3 and B registers b0, b1 from these (chunk, word) and word positions."""
    return ((("lo", 2 * step), ("hi", 2 * step), ("lo", 2 * step + 1), ("hi", 2 * step + 1)),
            (2 * step, 2 * step + 1))


@dsl_user_op
def mma_bf16_16816(c, a, b, *, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``: d = a·b + c (4 / 4 / 2 regs)."""
    ops = [Float32(x).ir_value(loc=loc, ip=ip) for x in c] + \
        [Uint32(x).ir_value(loc=loc, ip=ip) for x in (*a, *b)]
    res = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * 4), ops,
                          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                          "{$0,$1,$2,$3}, {$8,$9,$10,$11}, {$12,$13}, {$4,$5,$6,$7};",
                          "=f,=f,=f,=f,f,f,f,f,r,r,r,r,r,r", has_side_effects=False,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


class GemmSkinny:
    """Static config: rows M (16..128, multiple of 16), K (multiple of 256), the epilogue."""

    def __init__(self, M: int, K: int, *, residual: bool = False, swiglu: bool = False,
                 out_f32: bool = False, pdl: bool = False):
        if M % 16 or not 16 <= M <= 128:
            raise ValueError(f"M = {M}: this kernel takes 16..128 rows in multiples of 16")
        if K % K_SLICE:
            raise ValueError(f"K = {K} must be a multiple of {K_SLICE}")
        if sum((residual, swiglu, out_f32)) > 1:
            raise ValueError("residual, swiglu and out_f32 are alternative epilogues")
        self.M, self.K = M, K
        self.residual, self.swiglu, self.out_f32, self.pdl = residual, swiglu, out_f32, pdl
        self.splits = K // K_SLICE
        self.mtiles = M // 16
        self.w_rows = 2 if swiglu else 1
        self.tile_out = TILE_N // self.w_rows  # output columns per CTA
        self.ntiles = self.tile_out // (8 * WARPS)  # n-tiles per warp and weight row kind
        self.blocks = K_SLICE // 32

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, w_ptr: cute.Pointer, y_ptr: cute.Pointer,
                 resid_ptr: cute.Pointer, work_ptr: cute.Pointer, count_ptr: cute.Pointer,
                 N: Int32, ldy: Int32, stream):
        M, kc = self.M, self.K // 8  # 16-byte chunks per row
        mA = cute.make_tensor(a_ptr, cute.make_layout((4, M * kc), stride=(1, 4)))
        mW = cute.make_tensor(w_ptr, cute.make_layout((4, self.w_rows * N * kc), stride=(1, 4)))
        mY = cute.make_tensor(y_ptr, cute.make_layout((M, N), stride=(ldy, 1)))
        mR = cute.make_tensor(resid_ptr, cute.make_layout((M, N), stride=(ldy, 1)))
        tiles = N // self.tile_out
        # partials [tile, split, m, TILE_N] and one arrival counter per tile
        mWork = cute.make_tensor(work_ptr, cute.make_layout(
            (tiles, self.splits, M, TILE_N),
            stride=(self.splits * M * TILE_N, M * TILE_N, TILE_N, 1)))
        mCount = cute.make_tensor(count_ptr, cute.make_layout(tiles))
        self.kernel(mA, mW, mY, mR, mWork, mCount, N).launch(
            grid=[tiles, self.splits, 1], block=[32 * WARPS, 1, 1], stream=stream,
            use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor,
               mWork: cute.Tensor, mCount: cute.Tensor, N: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        tile, split, _ = cute.arch.block_idx()
        lane, warp = tidx % 32, tidx // 32
        g, q = lane // 4, lane % 4
        M, kc = self.M, self.K // 8
        slice_c = K_SLICE // 8  # chunks per row in the slice
        c0 = split * slice_c  # first chunk of the slice
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        # 1. weights (constants) into registers: per block b, lane (g, q) holds chunk 4b + q of
        # weight row (kind r, n-tile t, row g)
        w = {}
        for r in cutlass.range_constexpr(self.w_rows):
            for t in cutlass.range_constexpr(self.ntiles):
                row = r * N + tile * self.tile_out + (warp * self.ntiles + t) * 8 + g
                for b in cutlass.range_constexpr(self.blocks):
                    frag = cute.make_rmem_tensor((4,), Uint32)
                    cute.autovec_copy(mW[(None, row * kc + c0 + 4 * b + q)], frag)
                    w[(r, t, b)] = frag
        smem = cutlass.memory.SmemAllocator()
        row_c = slice_c + PAD
        sA = smem.allocate_tensor(Uint32, cute.make_layout((4, M * row_c), stride=(1, 4)), 16)
        s_last = smem.allocate_tensor(Int32, cute.make_layout(1), 4)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        # 2. the a slice into shared memory
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cpasync.LoadCacheMode.GLOBAL), Uint32,
                                   num_bits_per_copy=128)
        for i in cutlass.range_constexpr(M * slice_c // (32 * WARPS)):
            idx = tidx + 32 * WARPS * i
            m, c = idx // slice_c, idx % slice_c
            cute.copy(atom, mA[(None, m * kc + c0 + c)], sA[(None, m * row_c + c)])
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        # 3. tensor-core sums over the slice
        acc = {}
        for mt in cutlass.range_constexpr(self.mtiles):
            for r in cutlass.range_constexpr(self.w_rows):
                for t in cutlass.range_constexpr(self.ntiles):
                    acc[(mt, r, t)] = [Float32(0.0)] * 4
        for b in cutlass.range_constexpr(self.blocks):
            for mt in cutlass.range_constexpr(self.mtiles):
                lo = cute.make_rmem_tensor((4,), Uint32)
                hi = cute.make_rmem_tensor((4,), Uint32)
                cute.autovec_copy(sA[(None, (16 * mt + g) * row_c + 4 * b + q)], lo)
                cute.autovec_copy(sA[(None, (16 * mt + g + 8) * row_c + 4 * b + q)], hi)
                chunks = {"lo": lo, "hi": hi}
                for s in cutlass.range_constexpr(2):
                    a_words, b_words = fragment_words(s)
                    a = tuple(chunks[c][word] for c, word in a_words)
                    for r in cutlass.range_constexpr(self.w_rows):
                        for t in cutlass.range_constexpr(self.ntiles):
                            wf = w[(r, t, b)]
                            acc[(mt, r, t)] = mma_bf16_16816(acc[(mt, r, t)], a,
                                                             tuple(wf[i] for i in b_words))
        # 4. this slice's partial tile; column = r * tile_out + warp's n-tile column
        for mt in cutlass.range_constexpr(self.mtiles):
            for r in cutlass.range_constexpr(self.w_rows):
                for t in cutlass.range_constexpr(self.ntiles):
                    col = r * self.tile_out + (warp * self.ntiles + t) * 8 + 2 * q
                    d = acc[(mt, r, t)]
                    mWork[tile, split, 16 * mt + g, col] = d[0]
                    mWork[tile, split, 16 * mt + g, col + 1] = d[1]
                    mWork[tile, split, 16 * mt + g + 8, col] = d[2]
                    mWork[tile, split, 16 * mt + g + 8, col + 1] = d[3]
        cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_threads()
        if tidx == 0:
            count_split_arrival(mCount, tile, self.splits, s_last)
        cute.arch.sync_threads()
        # 5. the last CTA of the tile: partials in slice order, then the epilogue. A store may
        # alias the workspace, so a store between loads costs an L2 round trip: the thread's
        # outputs go in groups, all loads of a group before its stores
        if s_last[0] == Int32(1):
            cute.arch.fence_acq_rel_gpu()
            per_thread = M * self.tile_out // (32 * WARPS)
            for g0 in cutlass.range_constexpr(0, per_thread, REDUCE_GROUP):
                group = range(g0, min(per_thread, g0 + REDUCE_GROUP))
                sums, resids = [], []
                for i in group:
                    idx = tidx + 32 * WARPS * i
                    m, c = idx // self.tile_out, idx % self.tile_out
                    parts = []
                    for r in cutlass.range_constexpr(self.w_rows):
                        tot = Float32(0.0)
                        for sp in cutlass.range_constexpr(self.splits):
                            p = mWork.iterator + ((tile * self.splits + sp) * M + m) * TILE_N \
                                + r * self.tile_out + c
                            tot = tot + cute.arch.load(p.llvm_ptr, Float32, sem="relaxed",
                                                       scope="gpu")
                        parts.append(tot)
                    sums.append(parts)
                    resid = Float32(0.0)
                    if cutlass.const_expr(self.residual):
                        resid = mR[m, tile * self.tile_out + c].to(Float32)
                    resids.append(resid)
                for j, i in enumerate(group):
                    idx = tidx + 32 * WARPS * i
                    m, c = idx // self.tile_out, idx % self.tile_out
                    epilogue_store(mY, resids[j], m, tile * self.tile_out + c, sums[j],
                                   swiglu=self.swiglu, residual=self.residual,
                                   out_f32=self.out_f32)


def _ptr_specs(out_f32: bool):
    # a, W as 16-byte words; y; resid; fp32 workspace; int32 counters
    return ((Uint32, 16), (Uint32, 16), (Float32 if out_f32 else BFloat16, 4), (BFloat16, 2),
            (Float32, 16), (Int32, 4))


def compile_args(out_f32: bool = False):
    from cutlass.cute.runtime import make_fake_stream

    return (*pointer_args(_ptr_specs(out_f32)), Int32(4096), Int32(4096), make_fake_stream())


class SplitKWorkspace:
    """The fp32 partials and the zeroed, self-re-arming tile counters that the skinny GEMMs of
    one loop share (safe under PDL: a GEMM touches them only after its dependency wait, when
    every earlier kernel has completed). ``shapes``: (N, K, swiglu) of each projection."""

    def __init__(self, M: int, shapes, device):
        import torch

        tiles = [n // (TILE_N // (2 if sw else 1)) for n, _, sw in shapes]
        partials = [t * (k // K_SLICE) for t, (_, k, _) in zip(tiles, shapes)]
        self.work = torch.empty(max(partials) * M * TILE_N, dtype=torch.float32, device=device)
        self.count = torch.zeros(max(tiles), dtype=torch.int32, device=device)


def gemm_skinny(x, w, out, work: SplitKWorkspace, *, resid=None, swiglu: bool = False,
                pdl: bool = False):
    """x [M, K] bf16 (16 <= M <= 128, M % 16 == 0) times w [N, K]^T (SwiGLU: [2N, K], gate rows
    then up rows) into out [M, N] (bf16, or fp32 for widened bf16 results; rows may be strided).
    ``resid`` [M, N] bf16 laid out as out (may be out): add it."""
    require_hopper()
    M, K, N = projection_dims(x, w, swiglu)
    out_f32 = check_projection_out(out, resid, M, N, swiglu)
    cfg = GemmSkinny(M, K, residual=resid is not None, swiglu=swiglu, out_f32=out_f32,
                     pdl=pdl)  # validates M, K
    if N % cfg.tile_out:
        raise ValueError(f"N = {N} must be a multiple of {cfg.tile_out}")
    tiles = N // cfg.tile_out
    if work.count.numel() < tiles or work.work.numel() < tiles * cfg.splits * M * TILE_N:
        raise ValueError("the split-K workspace is too small for this projection")
    ptrs = pointer_args(_ptr_specs(cfg.out_f32),
                        (x, w, out, resid if resid is not None else x, work.work, work.count))
    key = ("gemm_skinny", M, K, cfg.residual, swiglu, cfg.out_f32, pdl)
    compiled = cached_compile(key, lambda: cute.compile(
        cfg, *ptrs, Int32(N), Int32(out.stride(0)), current_stream()))
    compiled(*ptrs, Int32(N), Int32(out.stride(0)), current_stream())
    return out
