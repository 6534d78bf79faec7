"""Device-side NVFP4 arithmetic, one PTX instruction (or a short fixed sequence) per operation.

The device twin of :mod:`numerics.nvfp4`'s ``mode="cuda"``: every rounding rule here must match
the reference bit for bit, and the quantize kernel's tests check that it does. Each helper
names the exact PTX so the compile census can see it (``rcp.approx.ftz.f32``,
``cvt.rn.satfinite.e4m3x2.f32``). :func:`quantize_block16` is the one device block quantizer
(the quantize kernel's, and P1's to come); :func:`scale_swizzle_offset` the one device form of
the 128x4 scale swizzle, derived from :mod:`numerics.nvfp4`'s constants;
:func:`global_scale_bits` the device form of ``numerics.nvfp4.global_scale_from_amax``.
"""
from __future__ import annotations

import struct

from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint32  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

from device.ptx import (asm, bf16_hi, bf16_lo, f16_hi, f16_lo, fmax_abs,  # noqa: E402
                                fmin_nan_ignoring, fmul_ftz, prmt, rcp_approx_ftz)
from numerics.formats import FLT_MAX, RN_ONE_SIXTH  # noqa: E402
from numerics.nvfp4 import (BLOCK, F4_E2M1_MAX, F8_E4M3_MAX, SCALE_LINE_BYTES,  # noqa: E402
                            SCALE_LINE_ROWS, SCALE_TILE_BYTES, SCALE_TILE_COLS, SCALE_TILE_ROWS)


# --- the 128x4 scale swizzle ----------------------------------------------------------------
def _log2(n: int) -> int:
    assert n > 0 and n & (n - 1) == 0, f"{n} is not a power of two"
    return n.bit_length() - 1


_TILE_ROW_SHIFT = _log2(SCALE_TILE_ROWS)
_TILE_COL_SHIFT = _log2(SCALE_TILE_COLS)
_TILE_BYTE_SHIFT = _log2(SCALE_TILE_BYTES)
_LINE_ROW_SHIFT = _log2(SCALE_LINE_ROWS)
_LINE_BYTE_SHIFT = _log2(SCALE_LINE_BYTES)
_LINE_GROUPS = SCALE_TILE_ROWS // SCALE_LINE_ROWS


def _like(x, v: int):
    """The constant ``v`` in ``x``'s DSL integer type (a plain int for ints and torch tensors)."""
    return type(x)(v) if isinstance(x, cutlass.Numeric) else v


def _line_byte(r):  # r % 32 picks the 16-byte line
    return (r & _like(r, SCALE_LINE_ROWS - 1)) << _like(r, _LINE_BYTE_SHIFT)


def _group_byte(r):  # (r % 128) // 32 picks the 4-byte group in the line
    group = (r >> _like(r, _LINE_ROW_SHIFT)) & _like(r, _LINE_GROUPS - 1)
    return group << _like(r, _TILE_COL_SHIFT)


def _col_byte(c):  # c % 4 picks the byte in the group
    return c & _like(c, SCALE_TILE_COLS - 1)


def scale_swizzle_offset(r, c, col_groups):
    """Byte offset of scale (row r, block column c) in the cuBLAS 128x4 swizzle, ``col_groups``
    = ceil(block columns / 4): :func:`numerics.nvfp4.swizzle_offset` in shifts and masks.

    For r, c >= 0 of one DSL integer type (constants follow it), or Python ints / integer torch
    tensors, which is how tests/test_numerics.py checks it against the reference on CPU. The
    terms are or-ed in one left-to-right chain (the quantize kernel's PTX depends on it).
    """
    tile = ((r >> _like(r, _TILE_ROW_SHIFT)) * _like(r, col_groups)
            + (c >> _like(c, _TILE_COL_SHIFT)))
    return (tile << _like(r, _TILE_BYTE_SHIFT)) | _line_byte(r) | _group_byte(r) | _col_byte(c)


@dsl_user_op
def e4m3_satfinite(d: Float32, *, loc=None, ip=None) -> Uint32:
    """``cvt.rn.satfinite.e4m3x2.f32``: RNE with subnormals, saturating at ±448 -> byte."""
    text = ("{ .reg .b16 h; cvt.rn.satfinite.e4m3x2.f32 h, 0f00000000, $1; "
            "cvt.u32.u16 $0, h; }")
    return Uint32(asm(T.i32(), [Float32(d)], text, "=r,f", loc, ip))


# --- the tensor scale g from the tensor amax --------------------------------------------------
def _rn_f32_hex(v: float) -> str:
    return struct.pack(">f", v).hex().upper()  # Python's float -> fp32 pack rounds to nearest


# RN_fp32(1 / 2688): 2688 = 2^7 · 21 is exact in fp32 and double, and the double quotient's
# rounding to fp32 cannot double-round here (1/21's binary expansion has period 6)
_RCP_AMAX_TO_G = _rn_f32_hex(1.0 / (F8_E4M3_MAX * F4_E2M1_MAX))


@dsl_user_op
def global_scale_bits(amax_bits: Uint32, bf16: bool, *, loc=None, ip=None) -> Uint32:
    """fp32 bits of ``numerics.nvfp4.global_scale_from_amax``: g = fp32(RN_dtype(amax / 2688))
    for the bf16 (``bf16``) or fp16 amax whose bit pattern is the low half of ``amax_bits``.

    ``mul.rn.f32`` by RN_fp32(1/2688) (what torch does on CUDA for a tensor divided by a
    scalar), then ``cvt.rn`` to the amax's dtype and back, subnormals kept (no .ftz): for every
    finite or infinite amax of either dtype this equals the correctly rounded quotient the host
    rule gives (tests/test_host_fast_path.py checks all 2 x 2^15 patterns on the CPU); a NaN amax
    gives a NaN (its payload is no part of the rule: the host's differs between CPU paths)."""
    if bf16:
        text = ("{ .reg .b32 w; .reg .f32 f, q; .reg .b16 h; shl.b32 w, $1, 16; mov.b32 f, w; "
                f"mul.rn.f32 q, f, 0f{_RCP_AMAX_TO_G}; cvt.rn.bf16.f32 h, q; "
                "cvt.u32.u16 w, h; shl.b32 $0, w, 16; }")
    else:
        text = ("{ .reg .b16 h; .reg .f32 f, q; cvt.u16.u32 h, $1; cvt.f32.f16 f, h; "
                f"mul.rn.f32 q, f, 0f{_RCP_AMAX_TO_G}; cvt.rn.f16.f32 h, q; cvt.f32.f16 f, h; "
                "mov.b32 $0, f; }")
    return Uint32(asm(T.i32(), [Uint32(amax_bits)], text, "=r,r", loc, ip))


@dsl_user_op
def e4m3_to_f32(code: Uint32, *, loc=None, ip=None) -> Float32:
    """Exact decode of an E4M3 byte (through f16, which holds every E4M3 value)."""
    text = ("{ .reg .b16 c, lo, hi; .reg .b32 h2; cvt.u16.u32 c, $1; "
            "cvt.rn.f16x2.e4m3x2 h2, c; mov.b32 {lo, hi}, h2; cvt.f32.f16 $0, lo; }")
    return Float32(asm(T.f32(), [Uint32(code)], text, "=f,r", loc, ip))


_E2M1_CODE = (
    "mov.b32 b, {v}; and.b32 a, b, 0x7FFFFFFF; mov.u32 c, 0; "
    "set.gt.u32.u32 t, a, 0x3E800000; sub.s32 c, c, t; "  # > 0.25
    "set.ge.u32.u32 t, a, 0x3F400000; sub.s32 c, c, t; "  # >= 0.75
    "set.gt.u32.u32 t, a, 0x3FA00000; sub.s32 c, c, t; "  # > 1.25
    "set.ge.u32.u32 t, a, 0x3FE00000; sub.s32 c, c, t; "  # >= 1.75
    "set.gt.u32.u32 t, a, 0x40200000; sub.s32 c, c, t; "  # > 2.5
    "set.ge.u32.u32 t, a, 0x40600000; sub.s32 c, c, t; "  # >= 3.5
    "set.gt.u32.u32 t, a, 0x40A00000; sub.s32 c, c, t; "  # > 5
    "shr.u32 s, b, 31; set.le.u32.u32 t, a, 0x7F800000; and.b32 s, s, t; "  # sign unless NaN
    "shl.b32 s, s, 3; or.b32 {out}, c, s; "
)


@dsl_user_op
def e2m1_pair(v_first: Float32, v_second: Float32, *, loc=None, ip=None) -> Uint32:
    """Two E2M1 codes in one byte, ``first`` in the high nibble (Comfy's hi_first order).

    Code = RNE onto {0, .5, 1, 1.5, 2, 3, 4, 6} saturating at 6, by comparing the magnitude's
    bits with the seven midpoints; the sign bit is kept (-0 -> 0x8) except for NaN (-> 0x7).
    """
    text = ("{ .reg .b32 a, b, c, s, t, hi; "
            + _E2M1_CODE.format(v="$1", out="hi")
            + _E2M1_CODE.format(v="$2", out="c")
            + "shl.b32 hi, hi, 4; or.b32 $0, hi, c; }")
    return Uint32(asm(T.i32(), [Float32(v_first), Float32(v_second)], text, "=r,f,f", loc, ip))


# --- fast paths -----------------------------------------------------------------------------
# RNE onto the E2M1 grid with one FFMA. In the binade j = clamp(exponent(|v|), 0, 2) the grid step
# is 2^(j-1), so the magnitude code is rint(|v|·2^(1-j)) + 2j. With e = the biased exponent of
# clamp(|v|, 1, 4) = j + 127: m = 2^(128-e) has exponent field 255 - e, and FFMA(|v|, m, C - 254) with
# C = 1.5·2^23 rounds exactly once, to nearest-even, at the integer position (ulp 1 there), so
# bits(r) + 2e = bits(C) + code. A min against bits(C) + 7 saturates (|v| >= 7 and inf give 6.0),
# and the code is the low 3 bits (bits(C) ends in zeros). v is never denormal (it comes from an
# FTZ multiply). NaN is NOT handled (its sign bit would be kept): callers route blocks that can
# produce NaN to :func:`e2m1_pair`. tests/test_quantize_kernel.py models this bit for bit.
_E2M1_FAST = (
    "mov.b32 b, {v}; abs.f32 af, {v}; max.f32 tf, af, 0f3F800000; min.f32 tf, tf, 0f40800000; "
    "mov.b32 e, tf; shr.u32 e, e, 23; "  # e = clamp(biased exponent of |v|, 127, 129)
    "mad.lo.u32 m, e, -8388608, 0x7F800000; mov.b32 mf, m; "  # m = 2^(128 - e)
    "fma.rn.f32 rf, af, mf, 0f4B3FFF02; mov.b32 c, rf; mad.lo.u32 c, e, 2, c; "
    "min.u32 c, c, 0x4B400007; shr.u32 b, b, 28; and.b32 b, b, 8; and.b32 c, c, 7; "
    "or.b32 {out}, c, b; "
)


@dsl_user_op
def e2m1_pair_fast(v_first: Float32, v_second: Float32, *, loc=None, ip=None) -> Uint32:
    """Same byte as :func:`e2m1_pair` for non-NaN inputs, in about a third of the instructions."""
    text = ("{ .reg .b32 b, c, e, m, hi; .reg .f32 af, tf, mf, rf; "
            + _E2M1_FAST.format(v="$1", out="hi")
            + _E2M1_FAST.format(v="$2", out="c")
            + "shl.b32 hi, hi, 4; or.b32 $0, hi, c; }")
    return Uint32(asm(T.i32(), [Float32(v_first), Float32(v_second)], text, "=r,f,f", loc, ip))


_E2M1_UNSAT = (  # _E2M1_FAST without saturation or sign: the code + bits(C) in {out}
    "abs.f32 af, {v}; max.f32 tf, af, 0f3F800000; min.f32 tf, tf, 0f40800000; "
    "mov.b32 e, tf; shr.u32 e, e, 23; mad.lo.u32 m, e, -8388608, 0x7F800000; mov.b32 mf, m; "
    "fma.rn.f32 rf, af, mf, 0f4B3FFF02; mov.b32 {out}, rf; mad.lo.u32 {out}, e, 2, {out}; "
)


@dsl_user_op
def e2m1_word_fast(v0: Float32, v1: Float32, v2: Float32, v3: Float32, v4: Float32,
                   v5: Float32, v6: Float32, v7: Float32, w0: Uint32, w1: Uint32, w2: Uint32,
                   w3: Uint32, *, loc=None, ip=None) -> Uint32:
    """Eight E2M1 codes packed hi-first into one word, for blocks where no code saturates.

    Preconditions (checked per block by the caller): no NaN, encode factor in (0, 2^126] and a
    normal, unsaturated block scale, so |v| < 6.4 and the sign of v is the sign of x. The codes'
    low bytes are paired with one multiply-add each and gathered with PRMT; the signs come
    straight from the four input words w0..w3 (16-bit elements 2p, 2p+1 in the halves of w_p).
    """
    body = "".join(_E2M1_UNSAT.format(v=f"${k + 1}", out=f"c{k}") for k in range(8))
    text = (
        "{ .reg .b32 e, m, c0, c1, c2, c3, c4, c5, c6, c7, lo, hi, t, u; "
        ".reg .f32 af, tf, mf, rf; " + body +
        # pair byte p = code(2p) << 4 | code(2p+1): exact in the low byte (bits(C) ends in 0s)
        "mad.lo.u32 c0, c0, 16, c1; mad.lo.u32 c2, c2, 16, c3; "
        "mad.lo.u32 c4, c4, 16, c5; mad.lo.u32 c6, c6, 16, c7; "
        "prmt.b32 lo, c0, c2, 0x0040; prmt.b32 hi, c4, c6, 0x0040; "
        "prmt.b32 $0, lo, hi, 0x5410; "
        # signs: bit 15 of w_p -> bit 7 of byte p; bit 31 of w_p -> bit 3 of byte p
        "prmt.b32 lo, $9, $10, 0x0051; prmt.b32 hi, $11, $12, 0x0051; "
        "prmt.b32 t, lo, hi, 0x5410; "
        "prmt.b32 lo, $9, $10, 0x0073; prmt.b32 hi, $11, $12, 0x0073; "
        "prmt.b32 u, lo, hi, 0x5410; shr.u32 u, u, 4; "
        "and.b32 t, t, 0x80808080; and.b32 u, u, 0x08080808; or.b32 t, t, u; "
        "or.b32 $0, $0, t; }"
    )
    args = [Float32(v) for v in (v0, v1, v2, v3, v4, v5, v6, v7)] + \
           [Uint32(w) for w in (w0, w1, w2, w3)]
    return Uint32(asm(T.i32(), args, text, "=r," + ",".join(["f"] * 8 + ["r"] * 4), loc, ip))


@dsl_user_op
def absmax16_words(w0: Uint32, w1: Uint32, w2: Uint32, w3: Uint32, w4: Uint32, w5: Uint32,
                   w6: Uint32, w7: Uint32, *, bf16: bool = True, loc=None, ip=None) -> Uint32:
    """max |x| over the 16 halves of 8 words, as a sign-cleared 16-bit pattern; NaN anywhere
    gives the canonical NaN (0x7FFF), which sorts above every finite value and inf.

    ``max.NaN.xorsign.abs`` takes |·| for free (the xor-ed sign is discarded at the end) and
    keeps denormals (no .ftz), so the result is the exact block amax when no NaN is present.
    """
    t = "bf16x2" if bf16 else "f16x2"
    s = "bf16" if bf16 else "f16"
    text = ("{ .reg .b32 a, b, c, d; .reg .b16 lo, hi, m; "
            f"max.NaN.xorsign.abs.{t} a, $1, $2; max.NaN.xorsign.abs.{t} b, $3, $4; "
            f"max.NaN.xorsign.abs.{t} c, $5, $6; max.NaN.xorsign.abs.{t} d, $7, $8; "
            f"max.NaN.xorsign.abs.{t} a, a, b; max.NaN.xorsign.abs.{t} c, c, d; "
            f"max.NaN.xorsign.abs.{t} a, a, c; mov.b32 {{lo, hi}}, a; "
            f"max.NaN.xorsign.abs.{s} m, lo, hi; cvt.u32.u16 $0, m; and.b32 $0, $0, 0x7FFF; }}")
    return Uint32(asm(T.i32(), [Uint32(w) for w in (w0, w1, w2, w3, w4, w5, w6, w7)], text,
                       "=r," + ",".join(["r"] * 8), loc, ip))


# --- the block quantizer -------------------------------------------------------------------
@cute.jit
def half_to_f32(word: Uint32, hi: cutlass.Constexpr, bf16: cutlass.Constexpr) -> Float32:
    """The low or high 16-bit element of ``word`` (bf16 or f16), exactly as fp32."""
    if cutlass.const_expr(bf16):
        return bf16_hi(word) if cutlass.const_expr(hi) else bf16_lo(word)
    return f16_hi(word) if cutlass.const_expr(hi) else f16_lo(word)


@cute.jit
def quantize_block16(w: cute.Tensor, g: Float32, rcp_g: Float32, words: cute.Tensor,
                     bf16: cutlass.Constexpr) -> Uint32:
    """Quantize one 16-element block as Comfy Kitchen's CUDA kernel does (numerics.nvfp4,
    mode="cuda"): returns the E4M3 scale byte and writes the 16 E2M1 codes, packed hi-first, to
    ``words`` (2 x Uint32, elements 0..7 then 8..15).

    ``w``: the block as 8 Uint32 words of bf16/f16 pairs (element 2e in the low half of word e);
    ``g``: the tensor scale and ``rcp_g`` = rcp.approx.ftz(g), hoisted by the caller.
    The block amax is an integer max over sign-cleared 16-bit magnitudes (``max.NaN.xorsign.abs``
    on bf16x2 / f16x2), which also says whether the block holds a NaN. Three code paths:
    * ordinary blocks (normal, unsaturated scale): one FFMA per element rounds onto the E2M1
      grid, no saturation needed, signs taken from the input words (``e2m1_word_fast``);
    * other finite blocks (subnormal or saturated scales, odd g): the same rounding with
      saturation and the sign of v (``e2m1_pair_fast``);
    * blocks with a NaN or a zero encode factor (the only ways an element becomes NaN): the
      exact threshold path with Comfy's NaN-ignoring amax (``e2m1_pair``).
    """
    nan_bits = Uint32(0x7F80) if cutlass.const_expr(bf16) else Uint32(0x7C00)
    amax_bits = absmax16_words(*[w[e] for e in range(8)], bf16=bf16)
    has_nan = amax_bits > nan_bits
    xf = cute.make_rmem_tensor((16,), Float32)
    for e in cutlass.range_constexpr(8):
        xf[2 * e] = half_to_f32(w[e], False, bf16)
        xf[2 * e + 1] = half_to_f32(w[e], True, bf16)
    amax = Float32(0.0)
    if cutlass.const_expr(bf16):
        amax = bf16_lo(amax_bits)
    else:
        amax = f16_lo(amax_bits)
    if has_nan:  # Comfy's amax ignores NaN unless all 16 are NaN
        amax = fmax_abs(xf[0], xf[0])
        for e in cutlass.range_constexpr(1, BLOCK):
            amax = fmax_abs(amax, xf[e])
    d_raw = fmul_ftz(fmul_ftz(amax, Float32(RN_ONE_SIXTH)), rcp_g)
    d = fmin_nan_ignoring(d_raw, Float32(448.0))
    s8 = e4m3_satfinite(d)
    enc = fmin_nan_ignoring(rcp_approx_ftz(fmul_ftz(g, e4m3_to_f32(s8))), Float32(FLT_MAX))
    # No code can saturate when the scale is normal and unsaturated and enc is the reciprocal
    # of a normal g·s: then |v| <= 6·(1 + 2^-4)·(1 + 2^-21) < 7.
    unsaturated = ((not has_nan) and s8 >= Uint32(8) and d_raw <= Float32(448.0)
                   and enc > Float32(0.0) and enc <= Float32(2.0**126))
    if unsaturated:
        for q in cutlass.range_constexpr(2):
            e = q * 8
            words[q] = e2m1_word_fast(*[fmul_ftz(xf[e + k], enc) for k in range(8)],
                                      w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3])
    elif has_nan or enc == Float32(0.0):  # the only blocks that can produce NaN
        _pack_pairs(e2m1_pair, xf, enc, words)
    else:
        _pack_pairs(e2m1_pair_fast, xf, enc, words)
    return s8


def _pack_pairs(pair, xf, enc, words):
    """The block's 16 codes, two at a time by ``pair`` (e2m1_pair or e2m1_pair_fast), into
    two words, byte p of word q from elements 8q + 2p and 8q + 2p + 1 (plain Python loops:
    unrolled while tracing, as range_constexpr is; the quantize kernel's PTX is unchanged)."""
    for q in range(2):
        word = Uint32(0)
        for p in range(4):
            e = q * 8 + p * 2
            byte = pair(fmul_ftz(xf[e], enc), fmul_ftz(xf[e + 1], enc))
            word = word | (byte << Uint32(8 * p))
        words[q] = word


# ---- dequantisation (P0 consumer): E2M1 codes x E4M3 scale -> exact f16 -------------------------
# An E2M1 code s.e1e0.m placed as the E4M3 byte s.00e1e0.m00 is worth exactly 2^-6 times the
# E2M1 value (subnormal m/2 maps to the E4M3 subnormal m·2^-7), and Hopper converts E4M3 pairs to
# f16 in one instruction. Multiplying by 64·scale (exact in f16, <= 28672) then yields e2m1·scale
# exactly: at most 6 significant bits, between 2^-10 and 2688, always an f16 normal or zero.


@dsl_user_op
def e2m1_bytes_as_e4m3(w: Uint32, *, loc=None, ip=None) -> Uint32:
    """The high nibble of each byte of ``w`` (sign at bit 7) as an E4M3 byte worth 2^-6·e2m1."""
    return Uint32(asm(T.i32(), [Uint32(w)],
                       "{ .reg .b32 t; shr.b32 t, $1, 2; and.b32 t, t, 0x1C1C1C1C; "
                       "lop3.b32 $0, $1, 0x80808080, t, 0xEA; }", "=r,r", loc, ip))


@dsl_user_op
def e4m3x2_times_f16x2(word: Uint32, high_half: bool, scale: Uint32, *, loc=None,
                       ip=None) -> Uint32:
    """Two E4M3 bytes (the low or high 16 bits of ``word``) as f16x2, times the f16x2 ``scale``."""
    pick = "hi" if high_half else "lo"
    text = ("{ .reg .b16 lo, hi; .reg .b32 h; mov.b32 {lo, hi}, $1; "
            f"cvt.rn.f16x2.e4m3x2 h, {pick}; mul.rn.f16x2 $0, h, $2; }}")
    return Uint32(asm(T.i32(), [Uint32(word), Uint32(scale)], text, "=r,r,r", loc, ip))


@dsl_user_op
def e4m3x2_scales_x64(pair: Uint32, *, loc=None, ip=None) -> Uint32:
    """Two E4M3 scale bytes (low 16 bits) as f16x2 (s0·64, s1·64), exact."""
    text = ("{ .reg .b16 lo, hi; .reg .b32 h, k; mov.b32 {lo, hi}, $1; mov.b32 k, 0x54005400; "
            "cvt.rn.f16x2.e4m3x2 h, lo; mul.rn.f16x2 $0, h, k; }")
    return Uint32(asm(T.i32(), [Uint32(pair)], text, "=r,r", loc, ip))


def dequant_e2m1_word(w, scale_x64):
    """Eight packed E2M1 codes (``hi_first``: element 2j in the high nibble of byte j) times one
    block scale -> four f16x2 words in element order. ``scale_x64``: f16x2 (64·s, 64·s)."""
    even = e2m1_bytes_as_e4m3(w)  # elements 0, 2, 4, 6
    odd = e2m1_bytes_as_e4m3(w << Uint32(4))  # elements 1, 3, 5, 7
    lo = prmt(even, odd, 0x5140)  # bytes of elements 0..3
    hi = prmt(even, odd, 0x7362)  # elements 4..7
    return (e4m3x2_times_f16x2(lo, False, scale_x64), e4m3x2_times_f16x2(lo, True, scale_x64),
            e4m3x2_times_f16x2(hi, False, scale_x64), e4m3x2_times_f16x2(hi, True, scale_x64))



def expand_block16(words, s8):
    """One quantized block's exact f16 expansion e2m1 · s: its two code words (as
    :func:`quantize_block16` writes them) and its scale byte -> 8 f16x2 words in element order
    (the quantize kernel's f16 output and the work queue's ring rows)."""
    scale = e4m3x2_scales_x64(s8 | (s8 << Uint32(8)))
    f16 = cute.make_rmem_tensor((8,), Uint32)
    for h in range(2):  # plain loops: unrolled while tracing (callable outside a jit body)
        ws = dequant_e2m1_word(words[h], scale)
        for e in range(4):
            f16[4 * h + e] = ws[e]
    return f16


ROW_CHUNKS = 8  # 16-byte chunks of one 64-element f16 row (128 B, one swizzle row)


@cute.jit
def quantize_expand_stage_rows(t: Int32, threads: cutlass.Constexpr[int],
                               rows: cutlass.Constexpr[int], x_words: cute.Tensor,
                               f16_words: cute.Tensor, stage: Int32, buf: Int32, g: Float32,
                               rcp_g: Float32, dump=None):
    """P1's activation stage: ``rows`` x 64 bf16 of ring stage ``stage`` (a [rows, 64]
    128-byte-swizzled K-major tile, as the producer's TMA wrote it) quantized block by block
    with :func:`quantize_block16` (Comfy's rule, tensor scale ``g``, ``rcp_g`` its rcp.approx)
    and expanded to exact f16 (:func:`dequant_e2m1_word`: e2m1 · scale, the values
    :func:`expand_block16` writes from the quantize kernel's packed output) into buffer
    ``buf`` of the f16 tiles, same swizzle. ``threads`` threads share the rows, one row a thread
    a pass (with fewer rows than threads, threads / rows threads a row, each some of its four
    blocks: the 64-row tile of P1's N-group reuse); a 16-element block is two 16-byte chunks,
    read and written at the same swizzled chunk positions (conflict-free: the 8 lanes of a
    phase hit 8 different chunk columns).

    ``x_words`` / ``f16_words``: (4 words, 16-byte chunk) views of the bf16 ring and the f16
    tiles (:func:`word_view`).

    ``dump`` (P1's debug build only; None compiles none of it): (words, row0, row_stride,
    rows_valid): each row r < rows_valid also writes its 4 blocks' packed codes (8 words, the
    quantize kernel's byte order) and their 4 scale bytes (1 word, block j in byte j) to
    ``words`` at 9 x (row0 + r x row_stride)."""
    if cutlass.const_expr(rows >= threads and rows % threads):
        raise ValueError(f"{threads} threads cannot share {rows} rows evenly")
    if cutlass.const_expr(rows < threads):  # several threads a row, each some of its blocks
        share = threads // rows
        if cutlass.const_expr(threads % rows or (ROW_CHUNKS // 2) % share or dump is not None):
            raise ValueError(f"{threads} threads on {rows} rows: each row's 4 blocks must split "
                             "evenly, without the debug dump")
        r = t % rows
        first = (t // rows) * (ROW_CHUNKS // 2 // share)
        for jj in cutlass.range_constexpr(ROW_CHUNKS // 2 // share):
            _quantize_expand_block(first + jj, r, (stage * rows + r) * ROW_CHUNKS,
                                   (buf * rows + r) * ROW_CHUNKS, x_words, f16_words, g, rcp_g,
                                   None)
        return
    for i in cutlass.range_constexpr(rows // threads):
        r = i * threads + t
        src_row = (stage * rows + r) * ROW_CHUNKS
        dst_row = (buf * rows + r) * ROW_CHUNKS
        scale_word = Uint32(0)
        for j in cutlass.range_constexpr(ROW_CHUNKS // 2):  # the row's four 16-element blocks
            codes, s8 = _quantize_expand_block(j, r, src_row, dst_row, x_words, f16_words, g,
                                               rcp_g, dump)
            if cutlass.const_expr(dump is not None):
                dump_words, row0, row_stride, rows_valid = dump
                if r < rows_valid:
                    base = (row0 + r * row_stride) * 9
                    dump_words[base + 2 * j] = codes[0]
                    dump_words[base + 2 * j + 1] = codes[1]
                scale_word = scale_word | (s8 << Uint32(8 * j))
        if cutlass.const_expr(dump is not None):
            dump_words, row0, row_stride, rows_valid = dump
            if r < rows_valid:
                dump_words[(row0 + r * row_stride) * 9 + 8] = scale_word


@cute.jit
def _quantize_expand_block(j, r, src_row, dst_row, x_words: cute.Tensor,
                           f16_words: cute.Tensor, g: Float32, rcp_g: Float32, dump):
    """Block ``j`` (0-3) of row ``r``: its two 16-byte chunks read at their swizzled positions
    (row phase r mod 8), quantized (:func:`quantize_block16`), expanded to exact f16 and stored
    at the same positions of the f16 row. Returns (the two code words, the scale byte)."""
    phase = r & 7
    lo_chunk = (2 * j) ^ phase
    hi_chunk = (2 * j + 1) ^ phase
    w = cute.make_rmem_tensor((8,), Uint32)
    lo = cute.make_rmem_tensor((4,), Uint32)
    hi = cute.make_rmem_tensor((4,), Uint32)
    cute.autovec_copy(x_words[(None, src_row + lo_chunk)], lo)
    cute.autovec_copy(x_words[(None, src_row + hi_chunk)], hi)
    for e in cutlass.range_constexpr(4):
        w[e] = lo[e]
        w[4 + e] = hi[e]
    codes = cute.make_rmem_tensor((2,), Uint32)
    s8 = quantize_block16(w, g, rcp_g, codes, True)
    scale = e4m3x2_scales_x64(s8 | (s8 << Uint32(8)))
    for h, chunk in ((0, lo_chunk), (1, hi_chunk)):
        words = dequant_e2m1_word(codes[h], scale)
        out = cute.make_rmem_tensor((4,), Uint32)
        for e in cutlass.range_constexpr(4):
            out[e] = words[e]
        cute.autovec_copy(out, f16_words[(None, dst_row + chunk)])
    return codes, s8


def word_view(byte_ptr, nbytes: int):
    """(4 words, 16-byte chunk) view of a 16-byte-aligned smem byte range."""
    words = cute.recast_ptr(byte_ptr, dtype=Uint32)
    return cute.make_tensor(words, cute.make_layout((4, nbytes // 16), stride=(1, 4)))


def dequant_a_fragment(codes: Uint32, scale_pair: Uint32):
    """One k16 step of a register-A wgmma fragment from the register-order prepack
    (kernels/nvfp4/prepack.py): ``codes`` byte j = the E2M1 pair of register j (element k in the
    high nibble), ``scale_pair`` = the E4M3 scales of rows groupID (low byte) and groupID + 8
    (bits 8-15). Returns the four f16x2 registers, exact (the E4M3-byte trick above): per two
    elements one packed convert and one packed multiply."""
    even = e2m1_bytes_as_e4m3(codes)  # element k of every register
    odd = e2m1_bytes_as_e4m3(codes << Uint32(4))  # element k + 1
    lo = prmt(even, odd, 0x5140)  # registers 0 (row g) and 1 (row g + 8)
    hi = prmt(even, odd, 0x7362)  # registers 2 (row g) and 3 (row g + 8)
    sv = e4m3x2_scales_x64(scale_pair)
    s_g, s_g8 = prmt(sv, sv, 0x1010), prmt(sv, sv, 0x3232)
    return (e4m3x2_times_f16x2(lo, False, s_g), e4m3x2_times_f16x2(lo, True, s_g8),
            e4m3x2_times_f16x2(hi, False, s_g), e4m3x2_times_f16x2(hi, True, s_g8))
