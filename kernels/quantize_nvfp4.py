"""Standalone NVFP4 quantize kernel (sm_90a): bf16/fp16 [M, K] -> packed E2M1 + swizzled E4M3.

Bit-exact with ``numerics.nvfp4.quantize(x, g, mode="cuda")`` (Comfy Kitchen's CUDA kernel).
It writes into caller-owned buffers at a row offset, so it is also P2's ``_into`` producer, and it
never touches memory outside them (Comfy's kernel runs past its buffers when M·K % 512 == 256).

Work split: one thread per 16-element block. A row-major [M, K] tensor with K % 16 == 0 is a flat
sequence of blocks, block b = (row, c) = (b // (K/16), b % (K/16)) covering elements
[16b, 16b + 16); a thread loads them with two 16-byte loads, writes 8 packed bytes with one 8-byte
store and its scale byte at the cuBLAS 128x4 swizzle offset. Consecutive threads take consecutive
blocks of a row, so loads and packed stores are fully coalesced; the scale bytes of a warp fall in
a few 512-byte swizzle tiles and merge in L2. ``blocks_per_thread`` > 1 puts several blocks'
loads in flight before the first use.

The tensor scale g is read from device memory (it comes from the on-device amax), so nothing
synchronises with the host.
"""
from __future__ import annotations

from kernels.nvfp4_device import (FLT_MAX, RN_ONE_SIXTH, absmax_u16x2, bf16_hi, bf16_lo,
                                  e2m1_pair, e2m1_pair_fast, e4m3_satfinite, e4m3_to_f32,
                                  f16_hi, f16_lo, fmax_abs, fmin_nan_ignoring, fmul_ftz,
                                  rcp_approx_ftz)
from kernels.runtime import cached_compile, check_cuda_tensor, cute_modules, current_stream, \
    require_hopper

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint8, Uint32  # noqa: E402

BLOCK = 16


class QuantizeNvfp4Kernel:
    """Static config: input dtype (bf16/fp16), threads per CTA, 16-element blocks per thread.

    Per block: the 8 input words are loaded with two 16-byte loads; the block amax is an
    integer max over sign-cleared 16-bit patterns (``max.u16x2``), which also says whether the
    block holds a NaN. Ordinary blocks take the fast E2M1 path (one FFMA per element); blocks
    with a NaN or a zero encode factor (the only ways an element can become NaN) take the exact
    threshold path with Comfy's NaN-ignoring amax. Both paths give the bytes of
    ``numerics.nvfp4.quantize(mode="cuda")``.
    """

    def __init__(self, dtype_name: str = "bfloat16", threads: int = 256,
                 blocks_per_thread: int = 2):
        if dtype_name not in ("bfloat16", "float16"):
            raise ValueError(f"dtype {dtype_name!r}: the kernel takes bfloat16 or float16")
        self.is_bf16 = dtype_name == "bfloat16"
        self.threads = threads
        self.blocks_per_thread = blocks_per_thread

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, q_ptr: cute.Pointer, s_ptr: cute.Pointer,
                 g_ptr: cute.Pointer, n_blocks: Int32, k_blocks: Int32, row_offset: Int32,
                 s_bytes: Int32, grid_x: Int32, stream):
        mX = cute.make_tensor(x_ptr, cute.make_layout(n_blocks * 8))  # 16-bit pairs as words
        mQ = cute.make_tensor(q_ptr, cute.make_layout(n_blocks * 2))  # 8 packed bytes per block
        mS = cute.make_tensor(s_ptr, cute.make_layout(s_bytes))  # swizzled scale bytes
        mG = cute.make_tensor(g_ptr, cute.make_layout(1))
        self.kernel(mX, mQ, mS, mG, n_blocks, k_blocks, row_offset).launch(
            grid=[grid_x, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.jit
    def _to_f32(self, word: Uint32, hi: cutlass.Constexpr):
        if cutlass.const_expr(self.is_bf16):
            return bf16_hi(word) if cutlass.const_expr(hi) else bf16_lo(word)
        return f16_hi(word) if cutlass.const_expr(hi) else f16_lo(word)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, mG: cute.Tensor,
               n_blocks: Int32, k_blocks: Int32, row_offset: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gX = cute.zipped_divide(mX, (8,))  # ((8 words = 16 elements), n_blocks)
        gQ = cute.zipped_divide(mQ, (2,))  # ((2 words = 8 bytes), n_blocks)
        g = mG[0]
        rcp_g = rcp_approx_ftz(g)
        nan_bits = Uint32(0x7F80) if cutlass.const_expr(self.is_bf16) else Uint32(0x7C00)
        scale_col_groups = (k_blocks + 3) // 4  # Cb: 4-column groups per 128-row tile
        first = (bidx * self.threads + tidx) * self.blocks_per_thread
        frgs = [cute.make_rmem_tensor((8,), Uint32) for _ in range(self.blocks_per_thread)]
        for j in cutlass.range_constexpr(self.blocks_per_thread):
            if first + j < n_blocks:
                cute.autovec_copy(gX[(None, first + j)], frgs[j])
        for j in cutlass.range_constexpr(self.blocks_per_thread):
            b = first + j
            if b < n_blocks:
                w = frgs[j]
                acc = Uint32(0)
                for i in cutlass.range_constexpr(8):
                    acc = absmax_u16x2(acc, w[i])
                amax_bits = cutlass.max(acc & Uint32(0xFFFF), acc >> Uint32(16))
                has_nan = amax_bits > nan_bits
                xf = cute.make_rmem_tensor((16,), Float32)
                for i in cutlass.range_constexpr(8):
                    xf[2 * i] = self._to_f32(w[i], False)
                    xf[2 * i + 1] = self._to_f32(w[i], True)
                amax = Float32(0.0)
                if cutlass.const_expr(self.is_bf16):
                    amax = bf16_lo(amax_bits)
                else:
                    amax = f16_lo(amax_bits)
                if has_nan:  # Comfy's amax ignores NaN unless all 16 are NaN
                    amax = fmax_abs(xf[0], xf[0])
                    for i in cutlass.range_constexpr(1, BLOCK):
                        amax = fmax_abs(amax, xf[i])
                d = fmul_ftz(fmul_ftz(amax, Float32(RN_ONE_SIXTH)), rcp_g)
                d = fmin_nan_ignoring(d, Float32(448.0))
                s8 = e4m3_satfinite(d)
                enc = fmin_nan_ignoring(rcp_approx_ftz(fmul_ftz(g, e4m3_to_f32(s8))),
                                        Float32(FLT_MAX))
                words = cute.make_rmem_tensor((2,), Uint32)
                if has_nan or enc == Float32(0.0):  # the only blocks that can produce NaN
                    for q in cutlass.range_constexpr(2):
                        word = Uint32(0)
                        for p in cutlass.range_constexpr(4):
                            e = q * 8 + p * 2
                            byte = e2m1_pair(fmul_ftz(xf[e], enc), fmul_ftz(xf[e + 1], enc))
                            word = word | (byte << Uint32(8 * p))
                        words[q] = word
                else:
                    for q in cutlass.range_constexpr(2):
                        word = Uint32(0)
                        for p in cutlass.range_constexpr(4):
                            e = q * 8 + p * 2
                            byte = e2m1_pair_fast(fmul_ftz(xf[e], enc),
                                                  fmul_ftz(xf[e + 1], enc))
                            word = word | (byte << Uint32(8 * p))
                        words[q] = word
                cute.autovec_copy(words, gQ[(None, b)])
                r = b // k_blocks + row_offset
                c = b % k_blocks
                off = ((((r // 128) * scale_col_groups + c // 4) * 32 + r % 32) * 16
                       + ((r % 128) // 32) * 4 + c % 4)
                mS[off] = Uint8(s8)


def _ptrs(x, q, s, g):
    """Raw device pointers with their alignment (cheap to build on every call)."""
    from cutlass.cute.runtime import make_ptr

    gmem = cute.AddressSpace.gmem
    return (make_ptr(Uint32, x.data_ptr(), gmem, assumed_align=16),
            make_ptr(Uint32, q.data_ptr(), gmem, assumed_align=8),
            make_ptr(Uint8, s.data_ptr(), gmem, assumed_align=4),
            make_ptr(Float32, g.data_ptr(), gmem, assumed_align=4))


def compile_args(dtype=None):
    """Arguments for cute.compile offline (pointer values are never dereferenced)."""
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    gmem = cute.AddressSpace.gmem
    return (make_ptr(Uint32, 1 << 20, gmem, assumed_align=16),
            make_ptr(Uint32, 1 << 21, gmem, assumed_align=8),
            make_ptr(Uint8, 1 << 22, gmem, assumed_align=4),
            make_ptr(Float32, 1 << 23, gmem, assumed_align=4),
            Int32(0), Int32(0), Int32(0), Int32(0), Int32(1), make_fake_stream())


def _validate(x, g, out, row_offset):
    import torch

    from numerics.nvfp4 import scale_shape

    require_hopper()
    check_cuda_tensor("x", x, dtypes=(torch.bfloat16, torch.float16))
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K]; got shape {tuple(x.shape)}")
    M, K = x.shape
    if K % BLOCK:
        raise ValueError(f"K = {K} must be a multiple of 16 (pad K first)")
    if M == 0:
        raise ValueError("x has no rows")
    check_cuda_tensor("g", g, dtypes=(torch.float32,))
    if g.numel() != 1:
        raise ValueError(f"g must hold one fp32 value; it has {g.numel()}")
    if x.numel() >= 2**31:
        raise ValueError("x has 2^31 or more elements; the kernel indexes with int32")
    if out is not None:
        q, s = out
        check_cuda_tensor("out packed", q, dtypes=(torch.uint8,), align=8)
        check_cuda_tensor("out scales", s, dtypes=(torch.float8_e4m3fn, torch.uint8), align=4)
        if q.dim() != 2 or q.shape[1] != K // 2 or q.shape[0] < row_offset + M:
            raise ValueError(f"out packed has shape {tuple(q.shape)}; need [>= {row_offset + M}, "
                             f"{K // 2}] for rows [{row_offset}, {row_offset + M})")
        need = scale_shape(row_offset + M, K)
        if s.dim() != 2 or s.shape[1] != need[1] or s.shape[0] < need[0] or s.shape[0] % 128:
            raise ValueError(f"out scales has shape {tuple(s.shape)}; need [multiple of 128 >= "
                             f"{need[0]}, {need[1]}]")
    if row_offset < 0:
        raise ValueError(f"row_offset must be >= 0, got {row_offset}")


def quantize_nvfp4(x, g, *, pad_16x: bool = False, out=None, row_offset: int = 0,
                   config: QuantizeNvfp4Kernel | None = None):
    """Quantize x [M, K] with the device tensor scale ``g`` (fp32, one element).

    Returns (packed uint8 [Mp, K/2], float8_e4m3fn scales [roundup(Mp,128), roundup(K/16,4)]),
    as numerics.nvfp4.quantize(x, g, pad_16x=pad_16x). With ``out=(packed, scales)`` it writes
    rows [row_offset, row_offset + M) of those caller-owned buffers instead (their padding is
    left as it is: allocate them zeroed).
    """
    import torch

    from numerics.nvfp4 import scale_shape

    _validate(x, g, out, row_offset)
    M, K = x.shape
    if out is None:
        Mp = -(-M // BLOCK) * BLOCK if pad_16x else M
        if not pad_16x and M % BLOCK:
            raise ValueError(f"M = {M} is not a multiple of 16; pass pad_16x=True")
        q = torch.zeros(Mp, K // 2, dtype=torch.uint8, device=x.device)
        s = torch.zeros(scale_shape(Mp, K), dtype=torch.uint8, device=x.device)
    else:
        q, s = out
    dtype_name = str(x.dtype).replace("torch.", "")
    config = config or QuantizeNvfp4Kernel(dtype_name)
    if (config.is_bf16) != (x.dtype == torch.bfloat16):
        raise ValueError(f"config is for {'bfloat16' if config.is_bf16 else 'float16'}, x is "
                         f"{dtype_name}")
    q_rows = q[row_offset:row_offset + M]
    ptrs = _ptrs(x, q_rows, s, g)
    key = ("quantize_nvfp4", dtype_name, config.threads, config.blocks_per_thread)
    compiled = cached_compile(key, lambda: cute.compile(
        config, *ptrs, Int32(0), Int32(0), Int32(0), Int32(0), Int32(1), current_stream()))
    n_blocks = M * K // BLOCK
    per_cta = config.threads * config.blocks_per_thread
    compiled(*ptrs, Int32(n_blocks), Int32(K // BLOCK), Int32(row_offset), Int32(s.numel()),
             Int32(-(-n_blocks // per_cta)), current_stream())
    return q, s.view(torch.float8_e4m3fn)
