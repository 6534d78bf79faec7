"""Device-side NVFP4 arithmetic, one PTX instruction (or a short fixed sequence) per operation.

The device twin of :mod:`numerics.nvfp4`'s ``mode="cuda"``: every rounding rule here must match
the reference bit for bit, and the quantize kernel's tests check that it does. Each helper
names the exact PTX so the compile census can see it (``rcp.approx.ftz.f32``,
``cvt.rn.satfinite.e4m3x2.f32``).
"""
from __future__ import annotations

from kernels.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Float32, Int16, Uint32  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

RN_ONE_SIXTH = 0.1666666716337204  # 0x3E2AAAAB
FLT_MAX = 3.4028234663852886e38


def _asm(ret, args, text, constraints, loc, ip):
    return llvm.inline_asm(ret, [a.ir_value(loc=loc, ip=ip) for a in args], text, constraints,
                           has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def fmul_ftz(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """IEEE fp32 multiply, denormals flushed (FMUL.FTZ)."""
    return Float32(_asm(T.f32(), [Float32(a), Float32(b)], "mul.ftz.f32 $0, $1, $2;", "=f,f,f",
                        loc, ip))


@dsl_user_op
def rcp_approx_ftz(a: Float32, *, loc=None, ip=None) -> Float32:
    """MUFU.RCP; its bits are modelled by numerics.rcp_approx."""
    return Float32(_asm(T.f32(), [Float32(a)], "rcp.approx.ftz.f32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def fmin_nan_ignoring(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fminf``: a NaN operand yields the other operand."""
    return Float32(_asm(T.f32(), [Float32(a), Float32(b)], "min.f32 $0, $1, $2;", "=f,f,f",
                        loc, ip))


@dsl_user_op
def fmax_abs(acc: Float32, x: Float32, *, loc=None, ip=None) -> Float32:
    """max(acc, |x|) ignoring NaN (``__hmax`` semantics; all-NaN stays NaN)."""
    return Float32(_asm(T.f32(), [Float32(acc), Float32(x)],
                        "{ .reg .f32 t; abs.f32 t, $2; max.f32 $0, $1, t; }", "=f,f,f", loc, ip))


@dsl_user_op
def e4m3_satfinite(d: Float32, *, loc=None, ip=None) -> Uint32:
    """``cvt.rn.satfinite.e4m3x2.f32``: RNE with subnormals, saturating at ±448 -> byte."""
    text = ("{ .reg .b16 h; cvt.rn.satfinite.e4m3x2.f32 h, 0f00000000, $1; "
            "cvt.u32.u16 $0, h; }")
    return Uint32(_asm(T.i32(), [Float32(d)], text, "=r,f", loc, ip))


@dsl_user_op
def e4m3_to_f32(code: Uint32, *, loc=None, ip=None) -> Float32:
    """Exact decode of an E4M3 byte (through f16, which holds every E4M3 value)."""
    text = ("{ .reg .b16 c, lo, hi; .reg .b32 h2; cvt.u16.u32 c, $1; "
            "cvt.rn.f16x2.e4m3x2 h2, c; mov.b32 {lo, hi}, h2; cvt.f32.f16 $0, lo; }")
    return Float32(_asm(T.f32(), [Uint32(code)], text, "=f,r", loc, ip))


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
    return Uint32(_asm(T.i32(), [Float32(v_first), Float32(v_second)], text, "=r,f,f", loc, ip))


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
    return Uint32(_asm(T.i32(), [Float32(v_first), Float32(v_second)], text, "=r,f,f", loc, ip))


@dsl_user_op
def absmax_u16x2(acc: Uint32, word: Uint32, *, loc=None, ip=None) -> Uint32:
    """Per-half max of |16-bit float| bit patterns (sign cleared): NaN patterns sort above inf."""
    text = "{ .reg .b32 t; and.b32 t, $2, 0x7FFF7FFF; max.u16x2 $0, $1, t; }"
    return Uint32(_asm(T.i32(), [Uint32(acc), Uint32(word)], text, "=r,r,r", loc, ip))


@dsl_user_op
def bf16_lo(word: Uint32, *, loc=None, ip=None) -> Float32:
    """The bf16 in the low half of a word, as fp32 (exact)."""
    return Float32(_asm(T.f32(), [Uint32(word)], "{ .reg .b32 t; shl.b32 t, $1, 16; "
                        "mov.b32 $0, t; }", "=f,r", loc, ip))


@dsl_user_op
def bf16_hi(word: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [Uint32(word)], "{ .reg .b32 t; and.b32 t, $1, 0xFFFF0000; "
                        "mov.b32 $0, t; }", "=f,r", loc, ip))


@dsl_user_op
def f16_lo(word: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [Uint32(word)], "{ .reg .b16 l, h; mov.b32 {l, h}, $1; "
                        "cvt.f32.f16 $0, l; }", "=f,r", loc, ip))


@dsl_user_op
def f16_hi(word: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [Uint32(word)], "{ .reg .b16 l, h; mov.b32 {l, h}, $1; "
                        "cvt.f32.f16 $0, h; }", "=f,r", loc, ip))
