"""Exact block-scaled NVFP4 GEMM oracle and the error bound for any fp32-accumulating kernel.

D[m, n] = RN_bf16(alpha · Σ_k a[m,k] · b[n,k]),  a = e2m1 · sA, b = e2m1 · sB,  alpha = RN(gA·gB).

Exactness: 2·e2m1 is an integer in [-12, 12] and every E4M3 value is an integer multiple of 2^-9
(at most 448 = 229376·2^-9), so a·2^10 and b·2^10 are integers below 2^22 and the whole sum is
I · 2^-20 with I an int64 (|I| < K · 2^44 < 2^63 for K < 2^19). :func:`exact_sums` computes I with
one integer matmul; :func:`round_bf16_exact` rounds alpha · I · 2^-20 to bf16 correctly, using
exact rational arithmetic for the few elements that sit within float64 error of a tie.

Bound (:func:`fp32_error_bound`): a kernel that forms the products exactly (they are: each has at
most 12 significant bits) and adds them in fp32 in any order, with any association, satisfies
|acc - S| <= γ_{K-1} · Σ|a_k b_k| with γ_n = n·u / (1 - n·u) (Higham, Thm 4.8 / recursive and
pairwise summation), u = 2^-23 covering round-to-nearest and truncating adders alike. The
epilogue then forms fl32(alpha · acc) (one more u) and rounds to bf16 (half a bf16 ulp). So
|D_kernel - alpha·S| <= |alpha|·γ·Σ|ab|·(1+u) + u·|alpha·S|·(1+γ) + ulp_bf16(|alpha·S| + that)/2.
"""
from __future__ import annotations

from fractions import Fraction

import torch

from numerics.formats import BF16, round_to_format
from numerics.nvfp4 import BLOCK, e4m3_decode, from_blocked, unpack_codes

U32 = 2.0**-23


def operand_integers(packed: torch.Tensor, scales: torch.Tensor, rows: int, K: int,
                     hi_first: bool = True, row_ids: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [rows, K] (or [len(row_ids), K]): (e2m1 · s) · 2^10, exact, on the operands'
    device. Raises on NaN scales."""
    from numerics.formats import e2m1_decode

    sel = torch.arange(rows, device=packed.device) if row_ids is None else row_ids.to(packed.device)
    codes = unpack_codes(packed[sel], hi_first)[:, :K]
    two_e = (e2m1_decode(codes, torch.float64) * 2).to(torch.int64)
    s8 = from_blocked(scales.view(torch.uint8), scales.shape[0], scales.shape[1])[sel]
    sv = e4m3_decode(s8[:, : K // BLOCK]).to(torch.float64)
    if torch.isnan(sv).any():
        raise ValueError("scales hold NaN (0x7F/0xFF): the GEMM output is NaN, not checkable")
    s_int = (sv * 512).to(torch.int64).repeat_interleave(BLOCK, dim=1)
    return two_e * s_int


def exact_sums(a_int: torch.Tensor, b_int: torch.Tensor) -> torch.Tensor:
    """I [M, N] int64 with Σ_k a_k b_k = I · 2^-20 exactly, on the operands' device.

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


def abs_sums(a_int: torch.Tensor, b_int: torch.Tensor) -> torch.Tensor:
    return exact_sums(a_int.abs(), b_int.abs())


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


def round_bf16_exact(I: torch.Tensor, alpha: float) -> torch.Tensor:
    """RN_bf16(alpha · I · 2^-20), correctly rounded for every element (float32 tensor out)."""
    alpha = float(torch.tensor(alpha, dtype=torch.float32))
    r = alpha * I.to(torch.float64) * 2.0**-20  # relative error <= ~2^-52
    out = round_to_format(r, BF16)
    # elements within float64 error of a bf16 midpoint are decided exactly
    ulp = torch.exp2(torch.clamp(torch.floor(torch.log2(out.abs().clamp_min(2.0**-126))),
                                 min=BF16.emin) - BF16.mbits)
    dist = ((r - out).abs() - ulp / 2).abs()
    risky = (dist <= r.abs() * 2.0**-48) & torch.isfinite(r)
    for idx in risky.nonzero().tolist():
        q = Fraction(alpha) * int(I[tuple(idx)]) / (1 << 20)
        out[tuple(idx)] = _round_fraction_bf16(q)
    return out.to(torch.float32)


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


def reference_gemm(a_q, a_s, b_q, b_s, g_a, g_b, M: int, N: int, K: int, row_ids=None):
    """(D_exact bf16-valued float32 [M, N], alpha·S as float64, bound float64) for checking;
    only rows ``row_ids`` of A when given. Runs on the operands' device."""
    a_int = operand_integers(a_q, a_s, M, K, row_ids=row_ids)
    b_int = operand_integers(b_q, b_s, N, K)
    I = exact_sums(a_int, b_int)
    alpha = float(torch.tensor(float(g_a), dtype=torch.float32)
                  * torch.tensor(float(g_b), dtype=torch.float32))
    d = round_bf16_exact(I, alpha)
    real = float(torch.tensor(alpha, dtype=torch.float32)) * I.to(torch.float64) * 2.0**-20
    return d, real, fp32_error_bound(I, abs_sums(a_int, b_int), alpha, K)
