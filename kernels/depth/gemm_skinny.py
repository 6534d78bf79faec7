"""Skinny bf16 projections y[M, N] = a[M, K] · W[N, K]^T for 16 <= M <= 128 rows (M a multiple
of 16) on tensor cores, with the depth loop's epilogues (residual, SwiGLU, fp32 logits).

Above 8 rows the CUDA-core GEMV is FMA-bound and cuBLAS streams these weights at 0.7-2 TB/s.
Here every CTA owns a tile of 64 weight rows (``tile_warps``: 128 where the frame measured that
faster) and one slice of K (``split_count``: 4 slices where registers and shared memory allow,
up to 8), so each CTA reads only its slice of a: the activations are read once per tile, which
at 64 rows and 64-row tiles is as many bytes as the weights.

Per CTA (4 or 8 weight groups of 16 rows: 16 output columns, or with SwiGLU 8 columns' gate and up
rows; one warp a group, or two, ``m_split``, each with half of the a rows, where the frame measured
that faster: ``warps_per_group``): the warps' weights are loaded into registers first (16-byte
loads; constants, so before the PDL wait), the a slice is copied into shared memory with
``cp.async`` (rows padded to 16 words mod 32, so the fragment reads are free of bank conflicts;
v8b's 32-word padding cost up to a third of the kernel; in ``a_stages`` K-ranges, one commit group
each, so each range's mma starts as it lands: ``stage_count``), then ``mma.sync.m16n8k16`` bf16 ->
fp32 over the slice, transposed (D = W · a^T: the weights are the A operand, the a rows the
8-wide B operand). The weights are pre-packed (:func:`pack_weights`, once per model) so that
one 16-byte load gives a lane its A fragment in register order, and K is permuted inside each
32-wide block so that one 16-byte chunk of an a row gives both k16 steps' B fragments: no
register moves in the mainloop (v8c assembled the A fragments of every mma from two rows: ~40 %
of its instructions).

Split-K reduction through distributed shared memory, deterministic: the slices of a tile are
the CTAs of one thread-block cluster (at most 8, the portable size). Each CTA stores its fp32
partial tile into its own shared memory; after a cluster barrier (release / acquire) CTA s adds,
for its 1/splits share of the tile's outputs, the partials of CTAs 0, 1, ... in that order and
applies the epilogue (rounding as kernels/depth/gemv_small_m.py); a second barrier keeps every
CTA's shared memory alive until its peers have read it. No workspace, no counters, no gpu-scope
fence.

``trace=`` builds stamp %globaltimer at each phase (scripts/trace_skinny.py reads them).
"""
from __future__ import annotations

import torch

from configs.arch import SMEM_PER_CTA_MAX
from kernels.depth.projection_io import check_projection_out, epilogue_store, projection_dims
from device.ptx import pdl_launch_dependents, pdl_wait, timing_perturbation
from device.runtime import (activation_layout, cached_compile, check_cuda_tensor,
                                    cute_modules, current_stream, pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import BFloat16, Float32, Int32, Int64, Uint32  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.nvgpu import LoadCacheMode, cpasync  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

from schedules.plan import SKINNY_A_STAGES, SKINNY_SPLIT_ROWS, SKINNY_WIDE_TILES  # noqa: E402

WARPS = 4  # per CTA by default: 16 weight rows each, a 64-row tile of weights
WIDE_WARPS = 8  # a 128-row tile: the a slice (re-read by every tile) is read half as often
# The default tiles per projection shape and row count: schedules/plan.py (section two)
MIN_K_SLICE = 256  # below 4 slices, K per CTA is at least this
MAX_K_SLICE = 768  # the weight fragments of a slice stay in registers
MAX_SPLITS = 8  # the portable cluster size
PAD = 4  # 16-byte chunks of padding per smem row of a: a row is then 16 words mod 32, so the
# 8 lanes of a 128-bit load phase (rows g, g + 1) hit the two halves of the banks
PART_PAD = 4  # fp32 words of padding per partial-tile row: the a rows 2q of one store are 8
# words apart mod 32, so a warp's 32 stores (8 weight rows x 4 a rows) hit 32 banks
REDUCE_GROUP = 8  # outputs per thread whose partials are loaded together in the reduction
TRACE_POINTS = ("entry", "wait_done", "a_loaded", "mma_done", "exchange_done", "stored", "exit")


def tile_warps(weight_rows: int, K: int, M: int) -> int:
    """Warps (16 weight rows each) per CTA for a [weight_rows, K] projection at M rows: 8 where
    the frame measured faster (``SKINNY_WIDE_TILES``), else 4. Isolated timings did not predict
    the frame (QKV at 64 rows: 8 warps slower alone, the frame equal), so only frames count."""
    return WIDE_WARPS if M in SKINNY_WIDE_TILES.get((weight_rows, K), ()) else WARPS


def stage_count(weight_rows: int, K: int, M: int) -> int:
    """``a_stages`` for a [weight_rows, K] projection at M rows: the K-ranges of the a copy
    where the frame measured them faster (``SKINNY_A_STAGES``), else 1."""
    return SKINNY_A_STAGES.get((weight_rows, K), {}).get(M, 1)


def stages_fit(stages: int, M: int, k_slice: int, threads: int) -> bool:
    """Whether ``stages`` K-ranges divide a slice's 32-wide blocks and its copy (M rows of
    k_slice / 8 chunks) into whole rounds of ``threads``."""
    return stages in (1, 2, 4) and (k_slice // 32) % stages == 0 \
        and (M * k_slice // 8 // stages) % threads == 0


def fitting_stages(stages: int, M: int, k_slice: int, threads: int) -> int:
    """The largest of ``stages``, stages / 2, ..., 1 that fits (a default for tiles it was not
    measured with)."""
    while stages > 1 and not stages_fit(stages, M, k_slice, threads):
        stages //= 2
    return stages


def warps_per_group(weight_rows: int, K: int, M: int) -> int:
    """``m_split`` for a [weight_rows, K] projection at M rows: 2 where the frame measured it
    faster (``SKINNY_SPLIT_ROWS``), else 1."""
    return 2 if M in SKINNY_SPLIT_ROWS.get((weight_rows, K), ()) else 1


def smem_bytes(M: int, k_slice: int, warps: int = WARPS) -> int:
    """Shared memory of a CTA: the a slice (padded rows of 16-byte chunks), the fp32 partial
    tile (16 columns a warp, padded rows)."""
    return M * (k_slice // 8 + PAD) * 16 + M * (16 * warps + PART_PAD) * 4


def split_count(M: int, K: int, warps: int = WARPS) -> int:
    """CTAs per tile (one cluster) for an M x K activation: 4 slices where they fit (the H200
    sweep at 16-128 rows, ``results/logs/*-skinny-sweep.log``: fewer, longer slices win over 8
    except for the QKV projection at 64 rows), more when a slice would exceed 768 (weight
    registers) or the shared memory."""
    for s in range(min(4, max(1, K // MIN_K_SLICE)), MAX_SPLITS + 1):
        if K % (128 * s) == 0 and (M * 32) % s == 0 and K // s <= MAX_K_SLICE \
                and smem_bytes(M, K // s, warps) <= SMEM_PER_CTA_MAX:
            return s
    raise ValueError(f"M = {M}, K = {K}: no slice count up to {MAX_SPLITS} fits")


class PackedWeights:
    """A projection's weights [N, K] (SwiGLU: [2N, K], gate rows then up rows) re-laid for the
    skinny GEMM (:func:`pack_weights`): the same bytes, permuted. ``data`` keeps the [rows, K]
    shape for the operand checks; only the kernel whose ``layout`` it names can read it ("mma":
    this module's; "wgmma4" / "wgmma8": kernels/depth/gemm_skinny_wgmma.py's, for 4- or 8-warp
    tiles)."""

    def __init__(self, data, swiglu: bool, layout: str = "mma"):
        self.data, self.swiglu, self.layout = data, swiglu, layout


def pack_weights(w, swiglu: bool = False) -> PackedWeights:
    """Lay ``w`` out as the kernel's A fragments. Weight rows come in groups of 16 (group
    tile * 4 + warp: 16 consecutive output columns, or with SwiGLU the gate rows then the up
    rows of 8 output columns); rows g and g + 8 of a group are the mma's A rows g, g + 8. For
    each 32-wide block b of K and k16 step s, lane (g, q) reads one 16-byte unit: the bf16 pairs
    k0 = 32b + 8q + 4s + {0, 1} and k1 = k0 + 2 of rows g, g + 8 as (g k0, g+8 k0, g k1,
    g+8 k1) = a0..a3, while its B fragment is words 2s, 2s + 1 of a's 16-byte chunk q of the
    block. That maps the PTX fragment layout's k = 2q + e, 2q + 8 + e onto k0 + e, k1 + e: the
    same bijection for A and B, so the sum is unchanged (tests/test_gemm_skinny.py checks it
    under an emulation of the PTX layouts). Order: [group, block, step, lane, 8 elements]."""
    rows, K = w.shape
    grouped = weight_groups(w, swiglu, 32)
    G = grouped.shape[0]
    packed = grouped.reshape(G, 2, 8, K // 32, 4, 2, 2, 2).permute(0, 3, 5, 2, 4, 6, 1, 7)
    return PackedWeights(packed.contiguous().reshape(rows, K), swiglu)


def weight_groups(w, swiglu: bool, k_multiple: int):
    """``w`` [rows, K] as [rows / 16, 16, K]: groups of 16 consecutive rows (16 output
    columns) or, with SwiGLU ([2N, K], gate rows then up rows), the 8 gate then the 8 up rows
    of 8 output columns; K must be a multiple of ``k_multiple``."""
    rows, K = w.shape
    if K % k_multiple or rows % (32 if swiglu else 16):
        raise ValueError(f"w {tuple(w.shape)}: K a multiple of {k_multiple}, rows of 16 "
                         "(SwiGLU 32)")
    if swiglu:
        n = rows // 2
        return torch.cat([w[:n].reshape(n // 8, 8, K), w[n:].reshape(n // 8, 8, K)], dim=1)
    return w.reshape(rows // 16, 16, K)


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


@dsl_user_op
def load_dsmem_f32(ptr: cute.Pointer, *, loc=None, ip=None) -> Float32:
    """``ld.shared::cluster.f32`` from a peer CTA's shared memory (``cute.arch.map_dsmem_ptr``)."""
    addr = llvm.ptrtoint(T.i32(), ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)
    return Float32(llvm.inline_asm(T.f32(), [addr], "ld.shared::cluster.f32 $0, [$1];", "=f,r",
                                   has_side_effects=True, is_align_stack=False,
                                   asm_dialect=llvm.AsmDialect.AD_ATT))


class GemmSkinny:
    """Static config: rows M (16..128, multiple of 16), K (multiple of 256), the epilogue,
    ``warps`` per CTA (4 or 8: a 64- or 128-column tile of weight rows)."""

    def __init__(self, M: int, K: int, *, residual: bool = False, swiglu: bool = False,
                 out_f32: bool = False, pdl: bool = False, splits: int | None = None,
                 warps: int = WARPS, m_split: int = 1, trace: bool = False,
                 a_stages: int = 1, chunk_major_out: bool = False):
        if M % 16 or not 16 <= M <= 128:
            raise ValueError(f"M = {M}: this kernel takes 16..128 rows in multiples of 16")
        if warps not in (WARPS, WIDE_WARPS):
            raise ValueError(f"warps = {warps}: {WARPS} or {WIDE_WARPS}")
        if m_split not in (1, 2):
            raise ValueError(f"m_split = {m_split}: 1 or 2")
        # warps: weight groups (16 rows) per CTA; m_split: warps per group, each taking 1/m_split
        # of the a rows (the same weight fragments, shorter accumulator chains, more warps)
        self.warps, self.m_split, self.tile_n = warps, m_split, 16 * warps
        self.threads = 32 * warps * m_split
        self.splits = splits or split_count(M, K, warps)
        self.k_slice = K // self.splits
        if not 1 <= self.splits <= MAX_SPLITS or K % (128 * self.splits):
            raise ValueError(f"K = {K} in {self.splits} slices: need 1-{MAX_SPLITS} slices, "
                             "each a multiple of 128")
        if sum((residual, swiglu, out_f32)) > 1:
            raise ValueError("residual, swiglu and out_f32 are alternative epilogues")
        # chunk_major_out: y laid out [N / 8][M][8] (runtime.activation_layout), the input a
        # wgmma projection (kernels/depth/gemm_skinny_wgmma.py) bulk-copies
        if chunk_major_out and (residual or out_f32):
            raise ValueError("chunk_major_out: for the SwiGLU / plain bf16 outputs that feed "
                             "a wgmma projection")
        self.chunk_major_out = chunk_major_out
        self.M, self.K = M, K
        self.residual, self.swiglu, self.out_f32, self.pdl = residual, swiglu, out_f32, pdl
        self.trace = trace  # thread 0 of each CTA stamps %globaltimer at TRACE_POINTS
        self.ntiles_m = M // 8  # n-tiles of a rows in the transposed mma
        self.ntiles_warp = self.ntiles_m // m_split  # of them, per warp
        self.w_rows = 2 if swiglu else 1
        self.tile_out = self.tile_n // self.w_rows  # output columns per CTA
        self.blocks = self.k_slice // 32
        if (M * self.tile_out) % self.splits:
            raise ValueError(f"{self.splits} slices do not divide the {M} x {self.tile_out} "
                             "outputs of a tile")
        if self.threads > 256 and self.k_slice > 256:  # 512 threads: at most 128 registers,
            raise ValueError(f"{self.threads} threads and a {self.k_slice}-wide K slice: the "
                             "weight fragments would spill (at most 256 with 512 threads)")
        self.share = M * self.tile_out // self.splits  # outputs each CTA reduces
        # a_stages: the a slice copied in this many K-ranges (one cp.async group each); the mma
        # of a range starts when it has landed, under the copy of the next
        if not stages_fit(a_stages, M, self.k_slice, self.threads):
            raise ValueError(f"a_stages = {a_stages}: 1, 2 or 4 dividing the {self.blocks} "
                             f"32-wide blocks and the copy's {M * self.k_slice // 8} chunks "
                             f"into whole rounds of {self.threads} threads")
        self.a_stages = a_stages
        self.smem_bytes = smem_bytes(M, self.k_slice, warps)
        if self.smem_bytes > SMEM_PER_CTA_MAX:
            raise ValueError(f"M = {M}, K = {K}: {self.smem_bytes} bytes of shared memory "
                             f"exceed {SMEM_PER_CTA_MAX}")

    def _occupancy(self) -> dict:
        """Launch bounds: 8-warp CTAs of <= 64 rows are held to 128 registers a thread, so two
        fit an SM (at 64 rows they would take 132 and run one a SM: gate/up's 192 CTAs in two
        waves). The carveout is given so that the bound needs no device query at compile time."""
        if self.warps == WIDE_WARPS and self.m_split == 1 and self.M <= 64:
            return dict(min_blocks_per_mp=2, preferred_smem_carveout=100)
        return {}

    def _output_views(self, y_ptr: cute.Pointer, resid_ptr: cute.Pointer,
                      trace_ptr: cute.Pointer, mailbox_ptr: cute.Pointer, N: Int32,
                      ldy: Int32) -> tuple:
        """(y, resid, trace, mailbox) tensors of a wgmma mainloop's launch (the subclasses'
        __call__)."""
        M, tiles, points = self.M, N // self.tile_out, len(TRACE_POINTS)
        return (cute.make_tensor(y_ptr, activation_layout(M, N, ldy, self.chunk_major_out)),
                cute.make_tensor(resid_ptr, cute.make_layout((M, N), stride=(ldy, 1))),
                cute.make_tensor(trace_ptr, cute.make_layout((tiles * self.splits, points),
                                                             stride=(points, 1))),
                cute.make_tensor(mailbox_ptr, cute.make_layout(8)))

    @cute.jit
    def _thread_coords(self, mT: cute.Tensor) -> tuple:
        """(tidx, tile, split, lane, warp_idx, warp, half, g, q) of this thread (split == rank
        in the (1, splits, 1) cluster; warp: weight group, half: a-row part; g, q: the mma
        fragment's row and column pair), after the entry stamp (the wgmma mainloops)."""
        tidx, _, _ = cute.arch.thread_idx()
        tile, split, _ = cute.arch.block_idx()
        self._stamp(mT, tile, split, tidx, 0)
        lane, warp_idx = tidx % 32, tidx // 32
        return (tidx, tile, split, lane, warp_idx, warp_idx % self.warps,
                warp_idx // self.warps, lane // 4, lane % 4)

    def _partial_column(self, warp, g, h):
        """Partial-tile column (r * tile_out + output column) of A-row g + 8h of ``warp``'s mma:
        16 consecutive columns, or with SwiGLU the gate (h = 0) and up (h = 1) rows of 8 output
        columns (the group rows of pack_weights)."""
        if cutlass.const_expr(self.swiglu):
            return h * self.tile_out + warp * 8 + g
        return warp * 16 + 8 * h + g

    def _reduced_output(self, split, tidx, i):
        """(row, column in the tile) of a thread's i-th output in CTA ``split``'s share. A share
        smaller than the CTA wraps around (the extra threads load, but do not store)."""
        j = tidx + self.threads * i
        if cutlass.const_expr(self.share % self.threads != 0):
            j = j % self.share
        o = split * self.share + j
        return o // self.tile_out, o % self.tile_out

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, w_ptr: cute.Pointer, y_ptr: cute.Pointer,
                 resid_ptr: cute.Pointer, trace_ptr: cute.Pointer, N: Int32, ldy: Int32,
                 stream):
        M, kc = self.M, self.K // 8  # 16-byte chunks per row
        mA = cute.make_tensor(a_ptr, cute.make_layout((4, M * kc), stride=(1, 4)))
        mW = cute.make_tensor(w_ptr, cute.make_layout((4, self.w_rows * N * kc), stride=(1, 4)))
        mY = cute.make_tensor(y_ptr, activation_layout(M, N, ldy, self.chunk_major_out))
        mR = cute.make_tensor(resid_ptr, cute.make_layout((M, N), stride=(ldy, 1)))
        tiles = N // self.tile_out
        points = len(TRACE_POINTS)  # row-major [CTA, point], as the torch tensor
        mT = cute.make_tensor(trace_ptr, cute.make_layout((tiles * self.splits, points),
                                                          stride=(points, 1)))
        self.kernel(mA, mW, mY, mR, mT, N).launch(
            grid=[tiles, self.splits, 1], block=[self.threads, 1, 1],
            cluster=[1, self.splits, 1], stream=stream, use_pdl=self.pdl,
            **self._occupancy())

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor,
               mT: cute.Tensor, N: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        tile, split, _ = cute.arch.block_idx()  # split == rank in the (1, splits, 1) cluster
        self._stamp(mT, tile, split, tidx, 0)
        lane, warp_idx = tidx % 32, tidx // 32
        warp, half = warp_idx % self.warps, warp_idx // self.warps  # weight group, a-row part
        nt0 = half * self.ntiles_warp  # this warp's first n-tile of a rows
        g, q = lane // 4, lane % 4
        M, kc = self.M, self.K // 8
        slice_c = self.k_slice // 8  # chunks per row in the slice
        c0 = split * slice_c  # first chunk of the slice
        if cutlass.const_expr(self.pdl):
            pdl_launch_dependents()
        # 1. weights (constants) into registers, before the PDL wait. The warp's 16 weight rows
        # (group tile * warps + warp of the packed layout, see pack_weights) are the mma's A
        # operand; per block b and k16 step s, one 16-byte load gives lane (g, q) its A
        # fragment, already in register order
        group = tile * self.warps + warp
        a_frags = {}
        for b in cutlass.range_constexpr(self.blocks):
            for s in cutlass.range_constexpr(2):
                frag = cute.make_rmem_tensor((4,), Uint32)
                unit = ((group * (self.K // 32) + c0 // 4 + b) * 2 + s) * 32 + lane
                cute.autovec_copy(mW[(None, unit)], frag)
                a_frags[(b, s)] = frag
        smem = cutlass.memory.SmemAllocator()
        row_c = slice_c + PAD
        sA = smem.allocate_tensor(Uint32, cute.make_layout((4, M * row_c), stride=(1, 4)), 16)
        part_row = self.tile_n + PART_PAD
        sP = smem.allocate_tensor(Float32, cute.make_layout((M, self.tile_n),
                                                            stride=(part_row, 1)), 16)
        if cutlass.const_expr(self.pdl):
            pdl_wait()
        self._stamp(mT, tile, split, tidx, 1)
        # 2. the a slice into shared memory, in a_stages K-ranges (one commit group each)
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(LoadCacheMode.GLOBAL), Uint32,
                                   num_bits_per_copy=128)
        stage_c = slice_c // self.a_stages  # chunks of a row per stage
        for st in cutlass.range_constexpr(self.a_stages):
            for i in cutlass.range_constexpr(M * stage_c // self.threads):
                idx = tidx + self.threads * i
                m, c = idx // stage_c, st * stage_c + idx % stage_c
                cute.copy(atom, mA[(None, m * kc + c0 + c)], sA[(None, m * row_c + c)])
            cute.arch.cp_async_commit_group()
        # 3. tensor-core sums over the slice, transposed: D[weight row, a row] = W · a^T with
        # the a rows in n-tiles of 8: one 16-byte chunk of a row gives lane (g, q) the B
        # fragments of both k16 steps, in register order (no register moves). This warp takes
        # n-tiles nt0 .. nt0 + ntiles_warp - 1 (all of them unless m_split). A stage's blocks
        # start once its group has landed (the stamp marks the first)
        acc = [[Float32(0.0)] * 4 for _ in range(self.ntiles_warp)]
        stage_blocks = self.blocks // self.a_stages
        for b in cutlass.range_constexpr(self.blocks):
            if cutlass.const_expr(b % stage_blocks == 0):
                cute.arch.cp_async_wait_group(self.a_stages - 1 - b // stage_blocks)
                cute.arch.sync_threads()
                if cutlass.const_expr(b == 0):
                    self._stamp(mT, tile, split, tidx, 2)
            for t in cutlass.range_constexpr(self.ntiles_warp):
                bw = cute.make_rmem_tensor((4,), Uint32)
                cute.autovec_copy(sA[(None, (8 * (nt0 + t) + g) * row_c + 4 * b + q)], bw)
                for s in cutlass.range_constexpr(2):
                    af = a_frags[(b, s)]
                    acc[t] = mma_bf16_16816(acc[t], tuple(af[i] for i in range(4)),
                                            (bw[2 * s], bw[2 * s + 1]))
        self._store_partials(acc, sP, nt0, warp, g, q)
        self._stamp(mT, tile, split, tidx, 3)
        self._exchange_and_store(sP, mY, mR, mT, tile, split, tidx)

    @cute.jit
    def _store_partials(self, acc: list, sP: cute.Tensor, nt0, warp, g, q):
        """4. this slice's partial tile [a row, column] into this CTA's shared memory: d0, d1
        are weight row g (half 0) at a rows 2q, 2q + 1 of n-tile t, d2, d3 weight row g + 8
        (mma.sync's accumulator layout, and wgmma's for a warp's 16 rows)."""
        for t in cutlass.range_constexpr(self.ntiles_warp):
            d = acc[t]
            for h in cutlass.range_constexpr(2):
                col = self._partial_column(warp, g, h)
                sP[8 * (nt0 + t) + 2 * q, col] = d[2 * h]
                sP[8 * (nt0 + t) + 2 * q + 1, col] = d[2 * h + 1]

    @cute.jit
    def _exchange_and_store(self, sP: cute.Tensor, mY: cute.Tensor, mR: cute.Tensor,
                            mT: cute.Tensor, tile, split, tidx):
        """5. after a cluster barrier, this CTA's share of the outputs: partials of CTAs 0, 1,
        ... in order, then the epilogue (loads of a group of outputs are issued before any of
        their stores); 6. a second barrier, so no CTA leaves (freeing its shared memory)
        before its peers have read it."""
        part_row = self.tile_n + PART_PAD
        cute.arch.cluster_arrive()  # release: the partial tile is visible to the cluster
        cute.arch.cluster_wait()  # acquire: so are the peers'
        self._stamp(mT, tile, split, tidx, 4)
        peers = [cute.arch.map_dsmem_ptr(sP.iterator, sp) for sp in range(self.splits)]
        per_thread = -(-self.share // self.threads)
        for g0 in cutlass.range_constexpr(0, per_thread, REDUCE_GROUP):
            group = range(g0, min(per_thread, g0 + REDUCE_GROUP))
            sums, resids = [], []
            for i in group:
                m, c = self._reduced_output(split, tidx, i)
                parts = []
                for r in cutlass.range_constexpr(self.w_rows):
                    tot = Float32(0.0)
                    for sp in cutlass.range_constexpr(self.splits):
                        tot = tot + load_dsmem_f32(
                            peers[sp] + (m * part_row + r * self.tile_out + c))
                    parts.append(tot)
                sums.append(parts)
                resid = Float32(0.0)
                if cutlass.const_expr(self.residual):
                    resid = mR[m, tile * self.tile_out + c].to(Float32)
                resids.append(resid)
            for j, i in enumerate(group):
                m, c = self._reduced_output(split, tidx, i)
                if cutlass.const_expr(self.share % self.threads == 0):
                    self._store(mY, resids[j], m, tile * self.tile_out + c, sums[j])
                elif tidx + self.threads * i < self.share:  # inside the share (small ones wrap)
                    self._store(mY, resids[j], m, tile * self.tile_out + c, sums[j])
        self._stamp(mT, tile, split, tidx, 5)
        cute.arch.cluster_arrive_relaxed()
        cute.arch.cluster_wait()
        self._stamp(mT, tile, split, tidx, 6)

    @cute.jit
    def _store(self, mY: cute.Tensor, resid, m, n, sums: list):
        """The epilogue of output (m, n) from its reduced sums."""
        epilogue_store(mY, resid, m, n, sums, swiglu=self.swiglu, residual=self.residual,
                       out_f32=self.out_f32)

    @cute.jit
    def _stamp(self, mT: cute.Tensor, tile: Int32, split: Int32, tidx: Int32,
               point: cutlass.Constexpr[int]):
        """Thread 0's %globaltimer at TRACE_POINTS[point] (traced builds only)."""
        if cutlass.const_expr(self.trace):
            if tidx == 0:
                mT[tile * self.splits + split, point] = Int64(cute.arch.globaltimer())


def _ptr_specs(out_f32: bool):
    # a, W as 16-byte words; y; resid; trace stamps
    return ((Uint32, 16), (Uint32, 16), (Float32 if out_f32 else BFloat16, 4), (BFloat16, 2),
            (Int64, 8))


def trace_shape(cfg: GemmSkinny, N: int) -> tuple:
    """Shape of the ``trace`` tensor of a launch: (CTAs, stamps)."""
    return (N // cfg.tile_out * cfg.splits, len(TRACE_POINTS))


def compile_args(out_f32: bool = False):
    return (*pointer_args(_ptr_specs(out_f32)), Int32(4096), Int32(4096), make_fake_stream())


def checked_operands(x, w: PackedWeights, out, resid, swiglu: bool, warps, m_split,
                     layout: str = "mma") -> tuple:
    """The checks every skinny projection makes before a launch (Hopper, weights packed for
    this kernel, shapes, dtypes, the output and residual) and the defaulted tile: returns
    (M, K, N, out_f32, warps, m_split). ``layout``: the kernel's packing ("wgmma": 4- or 8-warp
    tiles, ``warps`` defaulting to the packing's)."""
    require_hopper()
    if not isinstance(w, PackedWeights):
        raise TypeError("w: pack the weights first (kernels.depth.gemm_skinny.pack_weights)")
    if not w.layout.startswith(layout):
        raise ValueError(f"w was packed for the {w.layout!r} kernel, not this one ({layout!r})")
    if w.swiglu != swiglu:
        raise ValueError(f"w was packed with swiglu={w.swiglu}, called with swiglu={swiglu}")
    M, K, N = projection_dims(x, w.data, swiglu)
    out_f32 = check_projection_out(out, resid, M, N, swiglu)
    if layout == "wgmma":
        packed = int(w.layout[len(layout):])
        if warps not in (None, packed):
            raise ValueError(f"w was packed for {packed}-warp tiles, called with {warps}")
        warps = packed
    warps = warps or tile_warps(w.data.shape[0], K, M)
    m_split = m_split or warps_per_group(w.data.shape[0], K, M)
    return M, K, N, out_f32, warps, m_split


def check_chunk_major_out(chunk_major_out: bool, out):
    if chunk_major_out and not out.is_contiguous():
        raise ValueError("chunk_major_out: out must be contiguous")


def check_tiling(cfg: GemmSkinny, N: int, trace=None):
    """N in whole tiles of ``cfg``, and a ``trace`` tensor shaped for its CTAs."""
    if trace is not None:
        check_cuda_tensor("trace", trace, dtypes=(torch.int64,))
        if tuple(trace.shape) != trace_shape(cfg, N):
            raise ValueError(f"trace {tuple(trace.shape)}: need {trace_shape(cfg, N)}")
    if N % cfg.tile_out:
        raise ValueError(f"N = {N} must be a multiple of {cfg.tile_out}")


def gemm_skinny(x, w: PackedWeights, out, *, resid=None, swiglu: bool = False,
                pdl: bool = False, splits: int | None = None, warps: int | None = None,
                m_split: int | None = None, trace=None, a_stages: int | None = None,
                chunk_major_out: bool = False):
    """x [M, K] bf16 (16 <= M <= 128, M % 16 == 0) times W^T, ``w`` = pack_weights(W [N, K]
    or, with SwiGLU, [2N, K]: gate rows then up rows), into out [M, N] (bf16, or fp32 for
    widened bf16 results; rows may be strided). ``resid`` [M, N] bf16 laid out as out (may be
    out): add it. ``splits``: K slices per tile (the cluster size; default ``split_count``).
    ``warps``: weight groups (16 rows) per CTA, 4 or 8 (default ``tile_warps``); ``m_split``:
    warps per group (1 or 2, default ``warps_per_group``), each taking that share of the a rows.
    ``trace``: an int64 tensor [CTAs, len(TRACE_POINTS)] (``trace_shape``) that receives each
    CTA's %globaltimer stamps (ns). ``a_stages`` (1, 2, 4): copy the a slice in that many
    K-ranges, each range's mma starting once it has landed (default ``stage_count``).
    ``chunk_major_out``: ``out`` (contiguous) chunk-major, [N / 8][M][8] (SwiGLU or plain bf16
    only): the input of a wgmma projection (kernels.depth.gemm_skinny_wgmma)."""
    M, K, N, out_f32, warps, m_split = checked_operands(x, w, out, resid, swiglu, warps,
                                                        m_split)
    if not a_stages:
        k_slice = K // (splits or split_count(M, K, warps))
        a_stages = fitting_stages(stage_count(w.data.shape[0], K, M), M, k_slice,
                                  32 * warps * m_split)
    cfg = GemmSkinny(M, K, residual=resid is not None, swiglu=swiglu, out_f32=out_f32,
                     pdl=pdl, splits=splits, warps=warps, m_split=m_split,
                     trace=trace is not None, a_stages=a_stages, chunk_major_out=chunk_major_out)
    check_chunk_major_out(chunk_major_out, out)
    check_tiling(cfg, N, trace)
    ptrs = pointer_args(_ptr_specs(cfg.out_f32),
                        (x, w.data, out, resid if resid is not None else x,
                         trace if trace is not None else x))
    key = ("gemm_skinny", M, K, cfg.residual, swiglu, cfg.out_f32, pdl, cfg.splits, warps,
           m_split, cfg.trace, a_stages, chunk_major_out, timing_perturbation())
    compiled = cached_compile(key, lambda: cute.compile(
        cfg, *ptrs, Int32(N), Int32(out.stride(0)), current_stream()))
    compiled(*ptrs, Int32(N), Int32(out.stride(0)), current_stream())
    return out
