"""Exact block-scaled NVFP4 GEMM oracle and the error bound for any fp32-accumulating kernel.

D[m, n] = RN_bf16(alpha · Σ_k a[m,k] · b[n,k]),  a = e2m1 · sA, b = e2m1 · sB,  alpha = RN(gA·gB).

Exactness: 2·e2m1 is an integer in [-12, 12] and every E4M3 value is an integer multiple of 2^-9
(at most 448 = 229376·2^-9), so a·2^10 and b·2^10 are integers below 2^22 and the whole sum is
I · 2^-20 with I an int64 (|I| < K · 2^44 < 2^63 for K < 2^19). :func:`exact_sums` computes I;
:func:`round_bf16_exact` rounds alpha · I · 2^-20 to bf16 correctly, deciding the few elements
that sit within float64 error of a tie with exact rational arithmetic.

How I is computed, fast and still exact. Write a_k, b_k for the integer operands and
T = Σ_k |a_k b_k|; a GEMM is assumed to form every product exactly and to add with IEEE
operations (round to nearest; any monotone rounding will do: CPU FMA, GPU DMMA), in any order
and association, and not to be Strassen-like (the split below assumes the same).

1. Every product a_k·b_k is an integer below 2^44, exact in float64 (53-bit significand): a
   float64 GEMM of the operands (equally of the dequantized values, a power of two apart) rounds
   only in its K - 1 additions.
2. So in general |fl64(S) - S| <= γ_{K-1}(u)·T with γ_n(u) = n·u / (1 - n·u), u = 2^-53
   (Higham, Accuracy and Stability, Lemma 3.1 / Thm 4.8: any order and association): ~K·2^-53
   relative to T, an error that could be added to the fp32 bound it is checked against.
3. Sharper, and what the oracle uses: every partial sum, in any association, is an integer of
   magnitude <= T. If T < 2^53 each one is representable, so no addition rounds and
   fl64(S) = S exactly: the bound of 2 is zero and nothing needs widening. Rows where T may
   reach 2^53 take the two-GEMM split (:func:`split_sums`, exact for every K < 2^20).
   Deciding T < 2^53: with Σ|ab| at hand (:func:`abs_sums`, :func:`oracle_sums`) by T itself,
   since a float64 sum of non-negative integers is exact while the exact sum is below 2^53 and
   is >= 2^53 otherwise (rounding is monotone and 2^53 is representable); without it (a plain
   forward) by Hölder, T <= min(‖a‖₁ · max_n ‖b_n‖∞, ‖a‖∞ · max_n ‖b_n‖₁) per row of A, whose
   norms are exact integer sums below 2^42 and whose rounded products are >= 2^53 whenever the
   exact ones are.
On the synthetic H3 every T stays below 2^45 (all GEMMs of a quick-config step; 511 rows of
the full-size block 0 QKV) and the Hölder certificate below 2^47, so the split never runs
there: one float64 GEMM where it took two, Σ|ab| one more, and I, the bound and D bit for bit
those of the split (tests/test_gemm_oracle.py).

Bound (:func:`fp32_error_bound`): a kernel that forms the products exactly (they are: each has at
most 12 significant bits) and adds them in fp32 in any order, with any association, satisfies
|acc - S| <= γ_{K-1} · Σ|a_k b_k| with γ_n = n·u / (1 - n·u) (Higham, Thm 4.8 / recursive and
pairwise summation), u = 2^-23 covering round-to-nearest and truncating adders alike. The
epilogue then forms fl32(alpha · acc) (one more u) and rounds to bf16 (half a bf16 ulp). So
|D_kernel - alpha·S| <= |alpha|·γ·Σ|ab|·(1+u) + u·|alpha·S|·(1+γ) + ulp_bf16(|alpha·S| + that)/2.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from numerics.formats import BF16, e2m1_decode, round_to_format
from numerics.nvfp4 import BLOCK, e4m3_decode, from_blocked, unpack_codes

U32 = 2.0**-23


def operand_integers(packed: torch.Tensor, scales: torch.Tensor, rows: int, K: int,
                     hi_first: bool = True, row_ids: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [rows, K] (or [len(row_ids), K]): (e2m1 · s) · 2^10, exact, on the operands'
    device. Raises on NaN scales."""
    sel = torch.arange(rows, device=packed.device) if row_ids is None else row_ids.to(packed.device)
    codes = unpack_codes(packed[sel], hi_first)[:, :K]
    two_e = (e2m1_decode(codes, torch.float64) * 2).to(torch.int64)
    s8 = from_blocked(scales.view(torch.uint8), scales.shape[0], scales.shape[1])[sel]
    sv = e4m3_decode(s8[:, : K // BLOCK]).to(torch.float64)
    if torch.isnan(sv).any():
        raise ValueError("scales hold NaN (0x7F/0xFF): the GEMM output is NaN, not checkable")
    s_int = (sv * 512).to(torch.int64).repeat_interleave(BLOCK, dim=1)
    return two_e * s_int


EXACT_F64 = 2.0**53  # integers below this are exact in float64, and so is any sum of them


def split_sums(a_int: torch.Tensor, b_int: torch.Tensor) -> torch.Tensor:
    """I [M, N] int64 with Σ_k a_k b_k = I · 2^-20 exactly, for any operands (two GEMMs).

    |a_int|, |b_int| < 2^22. Splitting b = b_hi·2^11 + b_lo (|b_hi|, |b_lo| <= 2^11) keeps every
    partial sum of a·b_hi and a·b_lo an integer below 2^33·K < 2^53 for K < 2^20, so two float64
    matmuls are exact in any summation order (GPU tensor cores included); int64 recombines them.
    """
    if a_int.shape[1] >= 2**20:
        raise ValueError("K >= 2^20: the float64 split is no longer exact")
    b_lo = torch.remainder(b_int, 2048)
    b_hi = (b_int - b_lo) // 2048
    a64 = a_int.to(torch.float64)
    s_hi = (a64 @ b_hi.to(torch.float64).T).to(torch.int64)
    s_lo = (a64 @ b_lo.to(torch.float64).T).to(torch.int64)
    return s_hi * 2048 + s_lo


def _split_rows(I: torch.Tensor, rows: torch.Tensor, a_int, b_int) -> torch.Tensor:
    """I with ``rows`` (the ones one float64 GEMM may have rounded) recomputed by the split."""
    if rows.numel():
        I[rows] = split_sums(a_int[rows], b_int)
    return I


def exact_sums(a_int: torch.Tensor, b_int: torch.Tensor) -> torch.Tensor:
    """I [M, N] int64 with Σ_k a_k b_k = I · 2^-20 exactly, on the operands' device: one
    float64 GEMM for the rows whose Hölder certificate keeps T below 2^53 (module docstring,
    3), the split for the rest."""
    if a_int.shape[1] >= 2**20:
        raise ValueError("K >= 2^20: the float64 split is no longer exact")
    if not (a_int.numel() and b_int.numel()):
        return split_sums(a_int, b_int)
    a, b = a_int.to(torch.float64), b_int.to(torch.float64)
    a_abs, b_abs = a.abs(), b.abs()
    bound = torch.minimum(a_abs.sum(1) * b_abs.amax(), a_abs.amax(1) * b_abs.sum(1).amax())
    del a_abs, b_abs
    I = (a @ b.T).to(torch.int64)
    return _split_rows(I, (bound >= EXACT_F64).nonzero().flatten(), a_int, b_int)


def abs_sums(a_int: torch.Tensor, b_int: torch.Tensor) -> torch.Tensor:
    """Σ_k |a_k b_k| · 2^20 [M, N] int64, exactly: one float64 GEMM, exact wherever its
    result is below 2^53 (module docstring, 3); rows with any larger take the split."""
    return oracle_sums(a_int, b_int, signed=False)[1]


def oracle_sums(a_int: torch.Tensor, b_int: torch.Tensor, signed: bool = True):
    """(I, I_abs): exact_sums and abs_sums of one pair of operands in two float64 GEMMs, T
    itself deciding which rows need the split (I is None when not ``signed``)."""
    if a_int.shape[1] >= 2**20:
        raise ValueError("K >= 2^20: the float64 split is no longer exact")
    if not (a_int.numel() and b_int.numel()):
        return (split_sums(a_int, b_int) if signed else None,
                split_sums(a_int.abs(), b_int.abs()))
    a, b = a_int.to(torch.float64), b_int.to(torch.float64)
    T = a.abs() @ b.abs().T
    rows = (T >= EXACT_F64).any(1).nonzero().flatten()
    I_abs = _split_rows(T.to(torch.int64), rows, a_int.abs(), b_int.abs())
    del T
    I = _split_rows((a @ b.T).to(torch.int64), rows, a_int, b_int) if signed else None
    return I, I_abs


# Σ|ab| of chosen elements: per element (gathered rows, int64) while they are sparse, by a GEMM
# of their rows once more than 1/DENSE_AT of those rows' elements are chosen (a row costs N
# gathered dot products one by one, one row of a GEMM at once)
DENSE_AT = 64
GATHER_ELEMENTS = 1 << 25  # int64 operands gathered a pass: this many over K pairs


def abs_sums_at(a_int: torch.Tensor, b_int: torch.Tensor, rows: torch.Tensor,
                cols: torch.Tensor) -> torch.Tensor:
    """Σ_k |a[rows_i, k] · b[cols_i, k]| · 2^20 (int64 [len(rows)]), exactly: abs_sums's
    elements at (rows_i, cols_i) only. Each product is below 2^43 ((12 · 229376)^2), so K < 2^20
    of them sum in int64 without overflow; many elements of few rows take abs_sums of those rows
    instead (exact too), so the result never depends on which way ran."""
    if a_int.shape[1] >= 2**20:
        raise ValueError("K >= 2^20: the float64 split is no longer exact")
    if not rows.numel():
        return torch.zeros(0, dtype=torch.int64, device=a_int.device)
    used, where = torch.unique(rows, return_inverse=True)
    if rows.numel() * DENSE_AT > used.numel() * b_int.shape[0]:
        return abs_sums(a_int[used], b_int)[where, cols]
    out = torch.empty(rows.numel(), dtype=torch.int64, device=a_int.device)
    step = max(1, GATHER_ELEMENTS // a_int.shape[1])
    for i in range(0, rows.numel(), step):
        j = min(i + step, rows.numel())
        out[i:j] = (a_int[rows[i:j]].abs() * b_int[cols[i:j]].abs()).sum(1)
    return out


def _round_fraction_bf16(q: Fraction) -> float:
    """Correct RNE of an exact rational onto bf16 (8 significant bits, overflow to inf)."""
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, BF16.emin)
    ulp = Fraction(2) ** (e - BF16.mbits)
    n = a / ulp
    fl = n.numerator // n.denominator
    rem = n - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
        fl += 1
    v = float(fl * ulp)
    if v > BF16.max_finite:
        v = float("inf")
    return sign * v


# float64 keeps 52 mantissa bits, bf16 7: rounding drops the low 45, and a bf16 rounding
# boundary (a midpoint) is where the dropped bits read exactly 2^44 in r's own binade
_DROPPED = 52 - BF16.mbits
_HALF = 1 << (_DROPPED - 1)
_NEAR_HALF = 8  # float64 ulps: r = alpha·I·2^-20 is within 4 of the exact value (see below)


def round_bf16_exact(I: torch.Tensor, alpha: float) -> torch.Tensor:
    """RN_bf16(alpha · I · 2^-20), correctly rounded for every element (float32 tensor out).

    r = alpha · I · 2^-20 in float64 rounds at most twice (I's conversion, the product; the
    power of two is exact), so |r - exact| < 2^-51·|r|: under 4 ulps of r. Rounding r to 8
    significant bits by its bit pattern (add half an ulp, less one unless the kept lsb is odd,
    clear the 45 dropped bits; carries into the exponent and overflow to 2^128 -> inf included)
    is then the correct result unless a bf16 midpoint lies within those 4 ulps of r: every
    midpoint near r is in r's binade (the binade edges are bf16 values, the nearest midpoints
    beyond them 2^-9 away), so exactly the elements whose dropped bits are within a few units
    of 2^44, exact ties among them. Those, and the nonzero r below bf16's normal range (a
    coarser grid), are rounded from the exact rational alpha · I / 2^20.
    """
    alpha = float(torch.tensor(alpha, dtype=torch.float32))
    r = alpha * I.to(torch.float64) * 2.0**-20
    if not math.isfinite(alpha):  # NaN or inf everywhere but where I == 0: nothing to decide
        return round_to_format(r, BF16).to(torch.float32)
    bits = r.view(torch.int64)
    dropped = bits & ((1 << _DROPPED) - 1)
    odd = (bits >> _DROPPED) & 1
    out = ((bits + (_HALF - 1) + odd) & -(1 << _DROPPED)).view(torch.float64).to(torch.float32)
    risky = (dropped - _HALF).abs() <= _NEAR_HALF
    risky |= (r.abs() < 2.0**BF16.emin) & (r != 0)
    if bool(risky.any()):
        for idx in risky.nonzero().tolist():
            q = Fraction(alpha) * int(I[tuple(idx)]) / (1 << 20)
            out[tuple(idx)] = _round_fraction_bf16(q)
    return out


def gamma(n: int, u: float = U32) -> float:
    if n * u >= 1:
        raise ValueError(f"gamma_{n} undefined for u={u}")
    return n * u / (1 - n * u)


def fp32_error_bound(I: torch.Tensor, I_abs: torch.Tensor, alpha: float, K: int) -> torch.Tensor:
    """Per-element bound on |D_kernel - alpha·S| for fp32 accumulation in any order (float64)."""
    alpha = abs(float(torch.tensor(alpha, dtype=torch.float32)))
    gk = gamma(max(K - 1, 1))
    exact = alpha * I.to(torch.float64).abs() * 2.0**-20
    acc_err = alpha * gk * I_abs.to(torch.float64) * 2.0**-20 * (1 + U32)
    pre_round = acc_err + U32 * exact * (1 + gk)
    mag = exact + pre_round
    ulp = torch.exp2(torch.clamp(torch.floor(torch.log2(mag.clamp_min(2.0**-126))),
                                 min=BF16.emin) - BF16.mbits)
    return pre_round + ulp / 2 + exact * 2.0**-50  # last term: float64 slack of `exact`


def may_leave_bound(y: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """bool mask: where an output ``y`` (bf16) can fail the check |y - alpha·S| <= bound, in
    the float64 the checks evaluate it in (validators.rung3_projections.gemm_check), with
    ``d`` = round_bf16_exact(I, alpha) and the bound = fp32_error_bound(I, Σ|ab|, alpha, K):
    wherever y is not d bit for bit, or d is not finite. So Σ|ab| is needed only there.

    Why a finite d passes, whatever Σ|ab| >= |I| is. Let v = alpha·I·2^-20 exactly (alpha the
    fp32 value) and w = 2^(max(floor(log2|v|), -126) - 7) its bf16 spacing (subnormals
    included). d finite is v rounded to nearest on that grid: |d - v| <= w/2, and = w/2 only
    at a tie, where |v| >= w/2. The check's ``real`` = fl(fl(alpha·fl(I))·2^-20) is within
    2·2^-53·|v| of v (the power of two is exact: no underflow, |v| >= 2^-169), and |real| >= 2^k
    whenever |v| >= 2^k (rounding is monotone, 2^k representable). In fp32_error_bound,
    ``exact`` = |real| and ``pre_round`` >= u·exact with u = 2^-23 (I != 0; at I = 0 d = v = 0
    and 0 <= bound), ``mag`` >= exact, so floor(log2 mag) >= floor(log2|v|) (a faithful log2
    never returns below k for an argument >= 2^k) and its ulp term is >= w: bound >= u·|real| +
    w/2 less one float64 rounding per addition. The left side, fl(|d - real|), is <= (w/2 +
    2^-52·|v|)(1 + 2^-53). What is left, u·|v| = 2^-23·|v| against float64 slop of a few
    2^-53·max(|v|, w) (w <= 2^-7·|v| for a normal v; at a subnormal tie w <= 2|v|), keeps the
    inequality with 2^27-fold room. An infinite or NaN d (overflow, a NaN alpha) is never
    skipped: there the check fails, and must still be counted (tests/test_gemm_oracle.py)."""
    return (y.view(torch.int16) != d.to(torch.bfloat16).view(torch.int16)) | ~torch.isfinite(d)


def reference_gemm(a_q, a_s, b_q, b_s, g_a, g_b, M: int, N: int, K: int, row_ids=None):
    """(D_exact bf16-valued float32 [M, N], alpha·S as float64, bound float64) for checking;
    only rows ``row_ids`` of A when given. Runs on the operands' device."""
    a_int = operand_integers(a_q, a_s, M, K, row_ids=row_ids)
    b_int = operand_integers(b_q, b_s, N, K)
    I, I_abs = oracle_sums(a_int, b_int)
    alpha = float(torch.tensor(float(g_a), dtype=torch.float32)
                  * torch.tensor(float(g_b), dtype=torch.float32))
    d = round_bf16_exact(I, alpha)
    real = float(torch.tensor(alpha, dtype=torch.float32)) * I.to(torch.float64) * 2.0**-20
    return d, real, fp32_error_bound(I, I_abs, alpha, K)
