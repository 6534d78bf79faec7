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

from kernels.nvfp4_device import (FLT_MAX, RN_ONE_SIXTH, e2m1_pair, e4m3_satfinite, e4m3_to_f32,
                                  fmax_abs, fmin_nan_ignoring, fmul_ftz, rcp_approx_ftz)
from kernels.runtime import cached_compile, check_cuda_tensor, cute_modules, current_stream, \
    require_hopper

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint8, Uint32  # noqa: E402

BLOCK = 16


class QuantizeNvfp4Kernel:
    """Static config: threads per CTA and 16-element blocks per thread."""

    def __init__(self, threads: int = 256, blocks_per_thread: int = 2):
        self.threads = threads
        self.blocks_per_thread = blocks_per_thread

    @cute.jit
    def __call__(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, mG: cute.Tensor,
                 n_blocks: Int32, k_blocks: Int32, row_offset: Int32, grid_x: Int32, stream):
        # mX: (M*K,) bf16/fp16; mQ: (M*K/8,) uint32 = packed bytes; mS: (rows_buf*cols_buf,)
        # uint8 swizzled scales; mG: (1,) fp32 tensor scale
        self.kernel(mX, mQ, mS, mG, n_blocks, k_blocks, row_offset).launch(
            grid=[grid_x, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, mG: cute.Tensor,
               n_blocks: Int32, k_blocks: Int32, row_offset: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gX = cute.zipped_divide(mX, (BLOCK,))  # ((16), n_blocks)
        gQ = cute.zipped_divide(mQ, (2,))  # ((2 words = 8 bytes), n_blocks)
        g = mG[0]
        rcp_g = rcp_approx_ftz(g)
        scale_cols_groups = (k_blocks + 3) // 4  # Cb: 4-column groups per 128-row tile
        first = (bidx * self.threads + tidx) * self.blocks_per_thread
        frgs = [cute.make_rmem_tensor((BLOCK,), mX.element_type)
                for _ in range(self.blocks_per_thread)]
        for j in cutlass.range_constexpr(self.blocks_per_thread):
            if first + j < n_blocks:
                cute.autovec_copy(gX[(None, first + j)], frgs[j])
        for j in cutlass.range_constexpr(self.blocks_per_thread):
            b = first + j
            if b < n_blocks:
                xf = cute.make_rmem_tensor((BLOCK,), Float32)
                xf.store(frgs[j].load().to(Float32))
                # block amax in the input type (exact), NaN ignored unless all 16 are NaN
                amax = fmax_abs(xf[0], xf[0])
                for i in cutlass.range_constexpr(1, BLOCK):
                    amax = fmax_abs(amax, xf[i])
                d = fmul_ftz(fmul_ftz(amax, Float32(RN_ONE_SIXTH)), rcp_g)
                d = fmin_nan_ignoring(d, Float32(448.0))
                s8 = e4m3_satfinite(d)
                enc = fmin_nan_ignoring(rcp_approx_ftz(fmul_ftz(g, e4m3_to_f32(s8))),
                                        Float32(FLT_MAX))
                words = cute.make_rmem_tensor((2,), Uint32)
                for w in cutlass.range_constexpr(2):
                    word = Uint32(0)
                    for p in cutlass.range_constexpr(4):
                        e = w * 8 + p * 2
                        byte = e2m1_pair(fmul_ftz(xf[e], enc), fmul_ftz(xf[e + 1], enc))
                        word = word | (byte << Uint32(8 * p))
                    words[w] = word
                cute.autovec_copy(words, gQ[(None, b)])
                r = b // k_blocks + row_offset
                c = b % k_blocks
                off = ((((r // 128) * scale_cols_groups + c // 4) * 32 + r % 32) * 16
                       + ((r % 128) // 32) * 4 + c % 4)
                mS[off] = Uint8(s8)


def _wrap(x1d, q32, s8, g):
    from cutlass.cute.runtime import from_dlpack

    return (from_dlpack(x1d, assumed_align=16).mark_layout_dynamic(),
            from_dlpack(q32, assumed_align=8).mark_layout_dynamic(),
            from_dlpack(s8, assumed_align=4).mark_layout_dynamic(),
            from_dlpack(g, assumed_align=4))


def compile_args(dtype, M: int = 256, K: int = 512, device="cpu"):
    """Arguments for cute.compile (CPU tensors work: nothing runs)."""
    import torch

    from numerics.nvfp4 import scale_shape

    x = torch.zeros(M * K, dtype=dtype, device=device)
    q = torch.zeros(M * K // 8, dtype=torch.int32, device=device).view(torch.uint32)
    s = torch.zeros(scale_shape(M, K)[0] * scale_shape(M, K)[1], dtype=torch.uint8,
                    device=device)
    g = torch.ones(1, dtype=torch.float32, device=device)
    from cutlass.cute.runtime import make_fake_stream

    return (*_wrap(x, q, s, g), Int32(0), Int32(0), Int32(0), Int32(1), make_fake_stream())


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
    config = config or QuantizeNvfp4Kernel()
    q_rows = q[row_offset:row_offset + M].view(-1).view(torch.uint32)
    args = _wrap(x.view(-1), q_rows, s.view(-1).view(torch.uint8), g.view(1))
    key = ("quantize_nvfp4", x.dtype, config.threads, config.blocks_per_thread)
    compiled = cached_compile(key, lambda: cute.compile(
        config, *args, Int32(0), Int32(0), Int32(0), Int32(1), current_stream()))
    n_blocks = M * K // BLOCK
    per_cta = config.threads * config.blocks_per_thread
    compiled(*args, Int32(n_blocks), Int32(K // BLOCK), Int32(row_offset),
             Int32(-(-n_blocks // per_cta)), current_stream())
    return q, s.view(torch.float8_e4m3fn)
