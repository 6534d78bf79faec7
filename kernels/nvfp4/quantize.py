"""Standalone NVFP4 quantize kernel (sm_90a): bf16/fp16 [M, K] -> packed E2M1 + swizzled E4M3.

Bit-exact with ``numerics.nvfp4.quantize(x, g, mode="cuda")`` (Comfy Kitchen's CUDA kernel).
It writes into caller-owned buffers at a row offset, so it is also P2's ``_into`` producer, and it
never touches memory outside them (Comfy's kernel runs past its buffers when M·K % 512 == 256).

Work split: one thread per 16-element block (row r, block column c), elements [16(r·K/16 + c), +16)
of the row-major input: two 16-byte loads, one 8-byte store of packed codes, one scale byte at the
cuBLAS 128x4 swizzle offset. A warp takes 32 consecutive blocks of one row, so loads and packed
stores are fully coalesced; its scale bytes fall in 4-byte runs that merge in L2.
``rows_per_thread`` > 1 puts several blocks' loads in flight before the first use.

The tensor scale g is read from device memory (it comes from the on-device amax), so nothing
synchronises with the host.
"""
from __future__ import annotations

import torch

from device import ffi
from device.ffi import plain_cuda, require_hopper
from device.nvfp4 import expand_block16, quantize_block16, scale_swizzle_offset
from device.ptx import rcp_approx_ftz
from device.runtime import check_cuda_tensor, cute_modules
from numerics.nvfp4 import BLOCK, SCALE_TILE_COLS, scale_shape

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint8, Uint32  # noqa: E402


class QuantizeNvfp4Kernel:
    """Static config: input dtype (bf16/fp16), CTA shape and rows per thread.

    Thread (tx, ty) of CTA (bx, by) quantizes block column c = bx·32 + tx of rows
    r = (by·rows_per_thread + i)·rows_per_cta + ty: a warp covers 32 consecutive blocks of one
    row (1 KB of input, 256 packed bytes), and no thread divides. Per block: the 8 input words
    are loaded with two 16-byte loads, then :func:`device.nvfp4.quantize_block16` gives
    the bytes of ``numerics.nvfp4.quantize(mode="cuda")`` (its docstring has the three paths).
    """

    COLS = 32  # block columns per CTA: one warp-wide run of a row
    emit_f16 = False  # QuantizeExpandNvfp4Kernel: also the exact f16 expansion

    def __init__(self, dtype_name: str = "bfloat16", rows_per_cta: int = 8,
                 rows_per_thread: int = 2):
        if dtype_name not in ("bfloat16", "float16"):
            raise ValueError(f"dtype {dtype_name!r}: the kernel takes bfloat16 or float16")
        self.is_bf16 = dtype_name == "bfloat16"
        self.rows_per_cta = rows_per_cta
        self.rows_per_thread = rows_per_thread
        self.key = (dtype_name, rows_per_cta, rows_per_thread)

    def grid(self, rows: int, k_blocks: int) -> tuple[int, int]:
        return (-(-k_blocks // self.COLS),
                -(-rows // (self.rows_per_cta * self.rows_per_thread)))

    @cute.jit
    def __call__(self, x, q, s, g, rows: Int32, k_blocks: Int32, row_offset: Int32,
                 s_bytes: Int32, grid_x: Int32, grid_y: Int32, stream):  # x..g: see ffi.pointer
        n_blocks = rows * k_blocks
        # 16-bit pairs as words; 8 packed bytes per block; swizzled scale bytes; g
        mX = cute.make_tensor(ffi.pointer(x, Uint32), cute.make_layout(n_blocks * 8))
        mQ = cute.make_tensor(ffi.pointer(q, Uint32), cute.make_layout(n_blocks * 2))
        mS = cute.make_tensor(ffi.pointer(s, Uint8), cute.make_layout(s_bytes))
        mG = cute.make_tensor(ffi.pointer(g, Float32), cute.make_layout(1))
        self.kernel(mX, mQ, mS, mG, mX, rows, k_blocks, row_offset).launch(
            grid=[grid_x, grid_y, 1], block=[self.COLS, self.rows_per_cta, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mQ: cute.Tensor, mS: cute.Tensor, mG: cute.Tensor,
               mF: cute.Tensor, rows: Int32, k_blocks: Int32, row_offset: Int32):
        tx, ty, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        gX = cute.zipped_divide(mX, (8,))  # ((8 words = 16 elements), n_blocks)
        gQ = cute.zipped_divide(mQ, (2,))  # ((2 words = 8 bytes), n_blocks)
        gF = cute.zipped_divide(mF, (8,))  # ((8 words = 16 f16), n_blocks): emit_f16 only
        g = mG[0]
        rcp_g = rcp_approx_ftz(g)
        scale_col_groups = (k_blocks + (SCALE_TILE_COLS - 1)) // SCALE_TILE_COLS  # per 128 rows
        c = bx * self.COLS + tx
        r0 = by * (self.rows_per_cta * self.rows_per_thread) + ty
        nrt = self.rows_per_thread
        frgs = [cute.make_rmem_tensor((8,), Uint32) for _ in range(nrt)]
        for i in cutlass.range_constexpr(nrt):  # every load in flight before the first use
            r = r0 + i * self.rows_per_cta
            if c < k_blocks and r < rows:
                cute.autovec_copy(gX[(None, r * k_blocks + c)], frgs[i])
        for i in cutlass.range_constexpr(nrt):
            r = r0 + i * self.rows_per_cta
            if c < k_blocks and r < rows:
                b = r * k_blocks + c
                words = cute.make_rmem_tensor((2,), Uint32)
                s8 = quantize_block16(frgs[i], g, rcp_g, words, self.is_bf16)
                cute.autovec_copy(words, gQ[(None, b)])
                off = scale_swizzle_offset(Uint32(r + row_offset), Uint32(c),
                                           scale_col_groups)
                mS[Int32(off)] = Uint8(s8)
                if cutlass.const_expr(self.emit_f16):
                    # e2m1 · s as exact f16 (the values P0's activation stage expands)
                    cute.autovec_copy(expand_block16(words, s8), gF[(None, b)])


class QuantizeExpandNvfp4Kernel(QuantizeNvfp4Kernel):
    """The quantize kernel that also writes each block's exact f16 expansion e2m1 · s (16
    halves, 32 bytes) to an [M, K] f16 tensor: the wgmma B operand of the register-A designs
    that take the activation by TMA (kernels.nvfp4.gemm_shell.V3Study(activation="f16_tma*"),
    notes/p0-gemm.md), made in the same pass as the packed bytes (M x K x 2 bytes more
    written)."""

    emit_f16 = True

    def __init__(self, dtype_name: str = "bfloat16", rows_per_cta: int = 8,
                 rows_per_thread: int = 2):
        super().__init__(dtype_name, rows_per_cta, rows_per_thread)
        self.key = (*self.key, "f16")

    @cute.jit
    def __call__(self, x, q, s, g, f, rows: Int32, k_blocks: Int32, row_offset: Int32,
                 s_bytes: Int32, grid_x: Int32, grid_y: Int32, stream):  # see ffi.pointer
        n_blocks = rows * k_blocks
        mX = cute.make_tensor(ffi.pointer(x, Uint32), cute.make_layout(n_blocks * 8))
        mQ = cute.make_tensor(ffi.pointer(q, Uint32), cute.make_layout(n_blocks * 2))
        mS = cute.make_tensor(ffi.pointer(s, Uint8), cute.make_layout(s_bytes))
        mG = cute.make_tensor(ffi.pointer(g, Float32), cute.make_layout(1))
        mF = cute.make_tensor(ffi.pointer(f, Uint32), cute.make_layout(n_blocks * 8))
        self.kernel(mX, mQ, mS, mG, mF, rows, k_blocks, row_offset).launch(
            grid=[grid_x, grid_y, 1], block=[self.COLS, self.rows_per_cta, 1], stream=stream)


class ExpandNvfp4Kernel:
    """The exact f16 expansion of packed NVFP4 codes: f16 [M, K], element = e2m1 · s (the
    E4M3 block scale, no tensor scale), what :class:`QuantizeExpandNvfp4Kernel` writes for the
    same codes. The f16 builds' A operand made from an already packed activation
    (kernels.nvfp4.gemm.gemm_nvfp4 without ``a16``).

    Thread (tx, ty) of CTA (bx, by) expands block column c = bx·32 + tx of rows
    r = (by·rows_per_thread + i)·rows_per_cta + ty, as the quantize kernel's work split: per
    block one 8-byte load of codes, one scale byte at the cuBLAS 128x4 swizzle offset,
    :func:`device.nvfp4.expand_block16` (the quantize kernel's expansion rule, shared), two
    16-byte f16 stores. A warp's 32 blocks are 256 contiguous code bytes and 1 KB of f16."""

    COLS = QuantizeNvfp4Kernel.COLS
    grid = QuantizeNvfp4Kernel.grid

    def __init__(self, rows_per_cta: int = 8, rows_per_thread: int = 2):
        self.rows_per_cta = rows_per_cta
        self.rows_per_thread = rows_per_thread
        self.key = ("expand", rows_per_cta, rows_per_thread)

    @cute.jit
    def __call__(self, q, s, f, rows: Int32, k_blocks: Int32, s_bytes: Int32, grid_x: Int32,
                 grid_y: Int32, stream):  # q, s, f: see ffi.pointer
        n_blocks = rows * k_blocks
        mQ = cute.make_tensor(ffi.pointer(q, Uint32), cute.make_layout(n_blocks * 2))
        mS = cute.make_tensor(ffi.pointer(s, Uint8), cute.make_layout(s_bytes))
        mF = cute.make_tensor(ffi.pointer(f, Uint32), cute.make_layout(n_blocks * 8))
        self.kernel(mQ, mS, mF, rows, k_blocks).launch(
            grid=[grid_x, grid_y, 1], block=[self.COLS, self.rows_per_cta, 1], stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mS: cute.Tensor, mF: cute.Tensor, rows: Int32,
               k_blocks: Int32):
        tx, ty, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        gQ = cute.zipped_divide(mQ, (2,))  # ((2 words = 16 codes), n_blocks)
        gF = cute.zipped_divide(mF, (8,))  # ((8 words = 16 f16), n_blocks)
        scale_col_groups = (k_blocks + (SCALE_TILE_COLS - 1)) // SCALE_TILE_COLS
        c = bx * self.COLS + tx
        r0 = by * (self.rows_per_cta * self.rows_per_thread) + ty
        nrt = self.rows_per_thread
        codes = [cute.make_rmem_tensor((2,), Uint32) for _ in range(nrt)]
        s8 = cute.make_rmem_tensor((nrt,), Uint32)
        for i in cutlass.range_constexpr(nrt):  # every load in flight before the first use
            r = r0 + i * self.rows_per_cta
            if c < k_blocks and r < rows:
                cute.autovec_copy(gQ[(None, r * k_blocks + c)], codes[i])
                off = scale_swizzle_offset(Uint32(r), Uint32(c), scale_col_groups)
                s8[i] = Uint32(mS[Int32(off)])
        for i in cutlass.range_constexpr(nrt):
            r = r0 + i * self.rows_per_cta
            if c < k_blocks and r < rows:
                cute.autovec_copy(expand_block16(codes[i], s8[i]), gF[(None, r * k_blocks + c)])


PTRS = ((Uint32, 16), (Uint32, 8), (Uint8, 4), (Float32, 4))  # x words, packed, scales, g
# (x, q rows, s, g), (rows, k_blocks, row_offset, s_bytes, grid_x, grid_y)
# every buffer but x is an address (outputs and g its caller checked: an int costs less host
# time than a tensor's conversion, notes/p0-gemm.md session 27); x carries the stream's device
ENTRY = ffi.Entry("quantize_nvfp4", PTRS, scalars=6, addresses=(1, 2, 3))


PTRS_F16 = (*PTRS, (Uint32, 16))  # ... and the f16 expansion
ENTRY_F16 = ffi.Entry("quantize_expand_nvfp4", PTRS_F16, scalars=6, addresses=(1, 2, 3, 4))

PTRS_EXPAND = ((Uint32, 8), (Uint8, 1), (Uint32, 16))  # codes, scales, f16
# (q, s, f), (rows, k_blocks, s_bytes, grid_x, grid_y)
ENTRY_EXPAND = ffi.Entry("expand_nvfp4", PTRS_EXPAND, scalars=5)


def compile_args(dtype=None):
    """Arguments for cute.compile offline: the pointer path's, or with ``dtype`` (cutlass
    BFloat16 / Float16) the TVM-FFI path's (2-D x and packed, 2-D uint8 scales, 1-D g; compile
    with options="--enable-tvm-ffi")."""
    if dtype is None:
        return ENTRY.compile_args(ffi=False)
    return ENTRY.compile_args([(dtype, 2), (Uint8, 2), (Uint8, 2), (Float32, 1)])


# each tensor's check: the cheap common case (ffi.plain_cuda), else check_cuda_tensor's verdict
X_DTYPES, G_DTYPES = (torch.bfloat16, torch.float16), (torch.float32,)
Q_DTYPES, S_DTYPES = (torch.uint8,), (torch.float8_e4m3fn, torch.uint8)


def _validate(x, g, out, row_offset):
    require_hopper()
    plain_cuda(x, X_DTYPES, 16) or check_cuda_tensor("x", x, dtypes=X_DTYPES)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K]; got shape {tuple(x.shape)}")
    M, K = x.shape
    if K % BLOCK:
        raise ValueError(f"K = {K} must be a multiple of 16 (pad K first)")
    if M == 0 or K == 0:
        raise ValueError(f"x is empty (shape {tuple(x.shape)})")
    plain_cuda(g, G_DTYPES, 16) or check_cuda_tensor("g", g, dtypes=G_DTYPES)
    if g.numel() != 1:
        raise ValueError(f"g must hold one fp32 value; it has {g.numel()}")
    if g.device != x.device:
        raise ValueError(f"g is on {g.device}; x is on {x.device}")
    if x.numel() >= 2**31:
        raise ValueError("x has 2^31 or more elements; the kernel indexes with int32")
    if isinstance(row_offset, bool) or not isinstance(row_offset, int) or row_offset < 0:
        raise ValueError(f"row_offset must be an int >= 0, got {row_offset!r}")
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"out must be a (packed, scales) pair, got {type(out).__name__}")
        q, s = out
        plain_cuda(q, Q_DTYPES, 8) or check_cuda_tensor("out packed", q, dtypes=Q_DTYPES, align=8)
        plain_cuda(s, S_DTYPES, 4) or check_cuda_tensor("out scales", s, dtypes=S_DTYPES, align=4)
        if q.device != x.device or s.device != x.device:
            raise ValueError(f"out is on {q.device} / {s.device}; x is on {x.device}")
        qs, ss = q.shape, s.shape
        if len(qs) != 2 or qs[1] != K // 2 or qs[0] < row_offset + M:
            raise ValueError(f"out packed has shape {tuple(qs)}; need [>= {row_offset + M}, "
                             f"{K // 2}] for rows [{row_offset}, {row_offset + M})")
        need = scale_shape(row_offset + M, K)
        if len(ss) != 2 or ss[1] != need[1] or ss[0] < need[0] or ss[0] % 128:
            raise ValueError(f"out scales has shape {tuple(ss)}; need [multiple of 128 >= "
                             f"{need[0]}, {need[1]}]")


_DEFAULT: dict = {}  # dtype name -> the default config
# validated signatures (:func:`signature`) -> the launch plan (config, key, scalars, q rows);
# what is not in the key, the buffers' addresses, is checked for alignment on every call
_PLANS = ffi.PlanCache()


def _tensor_key(t):
    return (type(t), t.shape, t.dtype, t.device, t.is_contiguous())


def signature(x, g, out, row_offset, pad_16x, config):
    """The cache key of a call: every property the slow checks read but the addresses."""
    if out is None:
        o = None
    elif type(out) is tuple and len(out) == 2:
        o = (_tensor_key(out[0]), _tensor_key(out[1]))
    else:
        raise TypeError  # a list or a malformed out: the slow path names the problem
    return (_tensor_key(x), _tensor_key(g), o, type(row_offset), row_offset, pad_16x, config)


def _aligned(x, g, out) -> bool:
    if (x.data_ptr() | g.data_ptr()) % 16:
        return False
    return out is None or not (out[0].data_ptr() % 8 or out[1].data_ptr() % 4)


def plan(x, g, out, row_offset, pad_16x, config):
    """The slow path: every check, then what the launch needs but the tensors (cached)."""
    _validate(x, g, out, row_offset)
    M, K = x.shape
    kb = K // BLOCK
    if out is None and not pad_16x and M % BLOCK:
        raise ValueError(f"M = {M} is not a multiple of 16; pass pad_16x=True")
    dtype_name = "bfloat16" if x.dtype == torch.bfloat16 else "float16"
    if config is None:
        config = _DEFAULT.get(dtype_name) or _DEFAULT.setdefault(
            dtype_name, QuantizeNvfp4Kernel(dtype_name))
    elif config.is_bf16 != (x.dtype == torch.bfloat16):
        raise ValueError(f"config is for {'bfloat16' if config.is_bf16 else 'float16'}, x is "
                         f"{dtype_name}")
    gx, gy = config.grid(M, kb)
    if gy > 65535:
        raise ValueError(f"M = {M} needs {gy} CTAs along grid y (> 65535); quantize in row "
                         "chunks with out= and row_offset=")
    if out is None:
        Mp = -(-M // BLOCK) * BLOCK if pad_16x else M
        s_shape = scale_shape(Mp, K)
        s_bytes = s_shape[0] * s_shape[1]
    else:
        Mp, s_shape, s_bytes = None, None, out[1].numel()
    return config, config.key, (M, kb, row_offset, s_bytes, gx, gy), Mp, s_shape


def quantize_nvfp4(x, g, *, pad_16x: bool = False, out=None, row_offset: int = 0,
                   config: QuantizeNvfp4Kernel | None = None):
    """Quantize x [M, K] with the device tensor scale ``g`` (fp32, one element).

    Returns (packed uint8 [Mp, K/2], float8_e4m3fn scales [roundup(Mp,128), roundup(K/16,4)]),
    as numerics.nvfp4.quantize(x, g, pad_16x=pad_16x). With ``out=(packed, scales)`` it writes
    rows [row_offset, row_offset + M) of those caller-owned buffers instead (their padding is
    left as it is: allocate them zeroed). ``g`` may be an amax workspace's ``g``
    (kernels.nvfp4.amax.AmaxWorkspace: the tensor scale the amax kernel wrote on the device).
    A call whose signature (every tensor's type, shape, dtype, device and contiguity, the
    scalars, the config) passed the checks before skips them but the alignment checks.
    """
    try:
        key = signature(x, g, out, row_offset, pad_16x, config)
        p = _PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors, a malformed out, an unhashable value
        key = p = None
    if p is None or not _aligned(x, g, out):
        p = plan(x, g, out, row_offset, pad_16x, config)
        if key is not None:
            _PLANS.put(key, p)
    config, ckey, scalars, Mp, s_shape = p
    if out is None:
        M, kb = scalars[0], scalars[1]
        # the kernel writes every byte but the padding: zero only buffers that have some
        q = (torch.empty if Mp == M else torch.zeros)(Mp, x.shape[1] // 2, dtype=torch.uint8,
                                                      device=x.device)
        s = (torch.empty if M % 128 == 0 and kb % SCALE_TILE_COLS == 0 else torch.zeros)(
            s_shape, dtype=torch.uint8, device=x.device)
    else:
        q, s = out
    q_rows = q if row_offset == 0 else q[row_offset:row_offset + scalars[0]]  # no shape read
    ENTRY(config, ckey, (x, q_rows.data_ptr(), s.data_ptr(), g.data_ptr()), scalars)
    return q, s if s.dtype == torch.float8_e4m3fn else s.view(torch.float8_e4m3fn)


_EXPAND: dict = {}  # dtype name -> the expanding kernel's config


def expand_config(is_bf16: bool) -> QuantizeExpandNvfp4Kernel:
    """The expanding quantize kernel's config for x's dtype (one object per dtype)."""
    name = "bfloat16" if is_bf16 else "float16"
    return _EXPAND.get(name) or _EXPAND.setdefault(name, QuantizeExpandNvfp4Kernel(name))


def quantize_expand_nvfp4(x, g, *, pad_16x: bool = False, out=None):
    """As :func:`quantize_nvfp4`, plus the exact f16 expansion e2m1 · s of every block, [M, K]
    float16 (numerics.nvfp4.dequantize(q, s, 1.0, dtype=float16) of the result, written in the
    same pass): (packed, scales, f16). With ``out=(packed, scales, f16)`` it writes those
    caller-owned buffers (packed and scales as quantize_nvfp4's ``out``, f16 [M, K] float16).
    With ``pad_16x`` packed has M rounded up to 16 rows and f16 M rows: give the GEMM
    ``rows=(0, M)`` (or ``packed[:M]``). A call whose signature passed the checks before skips
    them but the alignment checks, as :func:`quantize_nvfp4`."""
    if out is not None and (type(out) not in (tuple, list) or len(out) != 3):
        raise TypeError("out must be (packed, scales, f16)")
    q_out = None if out is None else (out[0], out[1])
    try:
        key = ("expand", signature(x, g, q_out, 0, pad_16x, None),
               None if out is None else _tensor_key(out[2]))
        p = _PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors, a malformed out: the checks name it
        key = p = None
    if p is None or not _aligned(x, g, q_out) or (out is not None and out[2].data_ptr() % 16):
        p = plan(x, g, q_out, 0, pad_16x, None)
        if out is not None:
            f16 = out[2]
            check_cuda_tensor("f16", f16, dtypes=(torch.float16,))
            if tuple(f16.shape) != tuple(x.shape) or not f16.is_contiguous() \
                    or f16.device != x.device:
                raise ValueError(f"out's f16 must be a contiguous float16 {list(x.shape)} on "
                                 f"{x.device}; got {tuple(f16.shape)} on {f16.device}")
        p = (expand_config(p[0].is_bf16), *p[1:])
        if key is not None:
            _PLANS.put(key, p)
    config, _, scalars, Mp, s_shape = p
    M, kb = scalars[0], scalars[1]
    if out is None:
        q = (torch.empty if Mp == M else torch.zeros)(Mp, x.shape[1] // 2, dtype=torch.uint8,
                                                      device=x.device)
        s = (torch.empty if M % 128 == 0 and kb % SCALE_TILE_COLS == 0 else torch.zeros)(
            s_shape, dtype=torch.uint8, device=x.device)
        f16 = torch.empty(M, x.shape[1], dtype=torch.float16, device=x.device)
    else:
        q, s, f16 = out
    ENTRY_F16(config, config.key,  # rows [0, M) of q and s
              (x, q.data_ptr(), s.data_ptr(), g.data_ptr(), f16.data_ptr()), scalars)
    return q, s if s.dtype == torch.float8_e4m3fn else s.view(torch.float8_e4m3fn), f16


EXPAND = ExpandNvfp4Kernel()  # expand_nvfp4's config (one static config: no choice to make)
_F16 = (torch.float16,)


def expand_nvfp4(a_q, a_s, *, out=None):
    """The exact f16 expansion of packed NVFP4 codes: float16 [M, K], element 2i of row r =
    e2m1(high nibble of a_q[r, i]) · s (its E4M3 block scale), 2i + 1 the low nibble's; no
    tensor scale. The same bits as :func:`quantize_expand_nvfp4`'s f16 output for the same codes
    and numerics.nvfp4.dequantize(a_q, a_s, 1.0, (M, K), dtype=float16) (every value an exact
    normal f16 or zero; NaN where the scale byte is NaN). ``a_q``: uint8 [M, K/2], K a multiple
    of 16; ``a_s``: the swizzled E4M3 scales (float8_e4m3fn or uint8,
    numerics.nvfp4.scale_shape(M, K)), as gemm_nvfp4's A operand. ``out``: a caller-owned
    contiguous float16 [M, K] to write (else one is allocated). Every check before the launch."""
    require_hopper()
    plain_cuda(a_q, Q_DTYPES, 8) or check_cuda_tensor("a_q", a_q, dtypes=Q_DTYPES, align=8)
    if a_q.dim() != 2:
        raise ValueError(f"a_q must be 2-D [M, K/2]; got shape {tuple(a_q.shape)}")
    M, kh = a_q.shape
    if M == 0 or kh == 0 or kh % (BLOCK // 2):
        raise ValueError(f"a_q has shape {tuple(a_q.shape)}; need M >= 1 rows of K/2 bytes, K a "
                         f"positive multiple of {BLOCK}")
    K = 2 * kh
    plain_cuda(a_s, S_DTYPES, 1) or check_cuda_tensor("a_s", a_s, dtypes=S_DTYPES, align=1)
    if tuple(a_s.shape) != scale_shape(M, K):
        raise ValueError(f"a_s has shape {tuple(a_s.shape)}; a_q [{M}, {kh}] needs the swizzled "
                         f"scale shape {list(scale_shape(M, K))}")
    if a_s.device != a_q.device:
        raise ValueError(f"a_s is on {a_s.device}; a_q is on {a_q.device}")
    if M * K >= 2**31:
        raise ValueError(f"a_q holds M x K = {M} x {K} >= 2^31 elements; the kernel indexes "
                         "with int32: expand it in row slices of whole 128-row scale tiles")
    kb = K // BLOCK
    gx, gy = EXPAND.grid(M, kb)
    if gy > 65535:
        raise ValueError(f"M = {M} needs {gy} CTAs along grid y (> 65535): expand it in row "
                         "slices of whole 128-row scale tiles")
    if out is None:
        out = torch.empty(M, K, dtype=torch.float16, device=a_q.device)
    else:
        plain_cuda(out, _F16, 16) or check_cuda_tensor("out", out, dtypes=_F16)
        if tuple(out.shape) != (M, K) or out.device != a_q.device:
            raise ValueError(f"out must be a contiguous float16 [{M}, {K}] on {a_q.device}; got "
                             f"{tuple(out.shape)} on {out.device}")
    ENTRY_EXPAND(EXPAND, EXPAND.key, (a_q, a_s, out), (M, kb, a_s.numel(), gx, gy))
    return out

