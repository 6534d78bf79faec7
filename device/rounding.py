"""The device rounding rules, once: bf16 roundings the compiler cannot fold away and the RMSNorm
order every row norm uses. The device twins of :mod:`numerics` / ``models.codepredictor.rms_norm``;
compile tests count the ``cvt.rn.bf16.f32`` / ``cvt.rn.bf16x2.f32`` a kernel must contain."""
from __future__ import annotations

from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Float32, Uint32  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402
from device.ptx import (asm, bf16_hi, bf16_lo, fadd_rn, fma_rn, fmul_rn,  # noqa: E402
                                rcp_approx)


@dsl_user_op
def round_bf16(x: Float32, *, loc=None, ip=None) -> Float32:
    """x rounded to nearest-even bf16, kept as fp32: a rounding the compiler cannot fold away
    (an ``extf(truncf(x))`` pair can be simplified to x)."""
    return Float32(asm(T.f32(), [Float32(x)], "{ .reg .b16 h; .reg .b32 w; "
                        "cvt.rn.bf16.f32 h, $1; mov.b32 w, {0, h}; mov.b32 $0, w; }", "=f,f",
                        loc, ip))

@dsl_user_op
def bf16x2_rn(lo: Float32, hi: Float32, *, loc=None, ip=None) -> Uint32:
    """``cvt.rn.bf16x2.f32``: two fp32 values rounded to nearest-even bf16, ``lo`` in bits 0-15."""
    return Uint32(asm(T.i32(), [Float32(hi), Float32(lo)], "cvt.rn.bf16x2.f32 $0, $1, $2;",
                       "=r,f,f", loc, ip))

def swiglu_value(gate: Float32, up: Float32) -> Float32:
    """SwiGLU of a gate and an up projection's fp32 sums, rounded as the eager reference rounds:
    ``bf16(bf16(silu(bf16(gate))) * bf16(up))``, kept as fp32 (before the last rounding, which
    the caller's store does). The division is :func:`div_newton`: for every one of the 65536
    bf16 gates its bf16 silu equals the IEEE division's (tests/test_device_rounding.py), and
    it has no slow-path call."""
    y = round_bf16(gate)
    s = round_bf16(div_newton(y, Float32(1.0) + cute.math.exp(-y)))
    return s * round_bf16(up)


def div_newton(a: Float32, b: Float32) -> Float32:
    """a / b without IEEE division's slow-path call: q0 = a · rcp.approx(b), then one
    Newton correction with the residual a - b · q0 (two FMAs). Within an ulp of a / b for
    normal operands, not correctly rounded in every case: its users round to bf16 afterwards.
    For SwiGLU's silu tests/test_device_rounding.py compares it with the IEEE division over
    every bf16 input; the softmax's bf16(e / den) (two inputs) is not compared exhaustively. Where
    the residual is NaN (a or q0 infinite), or q0 is zero, q0 stands: +inf / 1 stays +inf and
    -0 / 1 stays -0 (the correction would add +0)."""
    r = rcp_approx(b)
    q0 = a * r
    e = fma_rn(-b, q0, a)
    q = fma_rn(e, r, q0)
    return cutlass.select_((e == e) & (q0 != Float32(0.0)), q, q0)

def add_squares(acc: Float32, word: Uint32) -> Float32:
    """acc + lo^2 + hi^2 of the two bf16 packed in ``word`` (low half first, fp32): the one
    order in which every row norm accumulates its sum of squares."""
    lo, hi = bf16_lo(word), bf16_hi(word)
    return acc + lo * lo + hi * hi

def rms_factor(sum_sq: Float32, n: int, eps: float) -> Float32:
    """r = rsqrt(mean(x^2) + eps) of a row of ``n`` elements from its fp32 sum of squares: the
    factor :func:`rmsnorm_value` / :func:`rmsnorm_pair` scale by (shared by every row norm)."""
    return cute.math.rsqrt(sum_sq * Float32(1.0 / n) + Float32(eps))

def rmsnorm_value(x: Float32, gamma: Float32, r: Float32) -> Float32:
    """One element of an RMS-normalised bf16 row, rounded as the eager reference rounds:
    ``bf16(gamma * bf16(x * r))`` (models.codepredictor.rms_norm), r = rsqrt(mean(x^2) + eps);
    kept as fp32."""
    return round_bf16(gamma * round_bf16(x * r))

def rmsnorm_pair(x_word: Uint32, gamma_word: Uint32, r: Float32) -> Uint32:
    """:func:`rmsnorm_value` for the two bf16 packed in a word, packed again (bf16x2 roundings)."""
    y = bf16x2_rn(bf16_lo(x_word) * r, bf16_hi(x_word) * r)
    return bf16x2_rn(bf16_lo(gamma_word) * bf16_lo(y), bf16_hi(gamma_word) * bf16_hi(y))

def gate_residual_pair(y_word: Uint32, gate_word: Uint32, residual_word: Uint32) -> Uint32:
    """``RN_bf16(residual + gate·y)`` for the two bf16 packed in each word, in the order of
    numerics.epilogue.gate_residual (H3's gated residual add): an fp32 multiply, rounded; an
    fp32 add, rounded; one bf16 rounding. ``mul.rn`` / ``add.rn`` keep that order by
    construction: ptxas never contracts them into an FMA. (For bf16 operands the fp32 product is
    exact unless it is subnormal, so an FMA would rarely differ; equality must not rest on it.)"""
    lo = fadd_rn(bf16_lo(residual_word), fmul_rn(bf16_lo(gate_word), bf16_lo(y_word)))
    hi = fadd_rn(bf16_hi(residual_word), fmul_rn(bf16_hi(gate_word), bf16_hi(y_word)))
    return bf16x2_rn(lo, hi)


def quad_ssq(v0: Float32, v1: Float32, v2: Float32, v3: Float32) -> Float32:
    """One quad thread's part of a 16-feature tile's sum of squares: its features 2q, 2q + 1,
    8 + 2q, 9 + 2q in that order (the m64nF fragment's order)."""
    sq = Float32(0.0)
    for v in (v0, v1, v2, v3):
        sq = sq + v * v
    return sq


def tile_ssq(x: list) -> Float32:
    """A 16-feature tile's sum of squares in the projection epilogue's order: the four quad
    parts (:func:`quad_ssq`), then (t0 + t1) + (t2 + t3) as its xor shuffles add them."""
    t = [quad_ssq(x[2 * q], x[2 * q + 1], x[8 + 2 * q], x[9 + 2 * q]) for q in range(4)]
    return (t[0] + t[1]) + (t[2] + t[3])
