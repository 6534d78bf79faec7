"""The exact GEMM oracle and its proven fp32-accumulation bound: the fast exact sums (one
float64 GEMM where every partial sum stays an exact integer) against the two-GEMM split, bit for
bit, on random, log-normal, raw, cancelling and saturated operands; the correct rounding."""
import math
from fractions import Fraction

import torch
from hypothesis import given
from hypothesis import strategies as st

from numerics import gemm_oracle as G
from numerics import nvfp4
from validators.tiles import make_tile, tensor_scale_for


def _operands(M, N, K, kind, seed):
    a = make_tile(kind, M, K, torch.bfloat16, seed)
    b = make_tile("normal", N, K, torch.bfloat16, seed + 1)
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    ga, gb = tensor_scale_for(a), tensor_scale_for(b)
    aq, as_ = nvfp4.quantize(a, ga)
    bq, bs = nvfp4.quantize(b, gb)
    return aq, as_, bq, bs, ga, gb


@given(kind=st.sampled_from(["normal", "lognormal", "ties"]), seed=st.integers(0, 1000),
       kb=st.integers(1, 24))
def test_fp32_accumulation_in_any_order_is_within_the_bound(kind, seed, kb):
    M, N, K = 32, 16, 16 * kb
    aq, as_, bq, bs, ga, gb = _operands(M, N, K, kind, seed)
    d, real, bound = G.reference_gemm(aq, as_, bq, bs, ga, gb, M, N, K)
    A = nvfp4.dequantize_operand(aq, as_, (M, K)).float()
    B = nvfp4.dequantize_operand(bq, bs, (N, K)).float()
    alpha = torch.tensor(ga, dtype=torch.float32) * torch.tensor(gb, dtype=torch.float32)
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(seed))
    for A_, B_ in ((A, B), (A[:, perm], B[:, perm])):
        acc = torch.zeros(M, N, dtype=torch.float32)
        for k in range(K):  # strictly sequential fp32 adds: the worst order for error growth
            acc += A_[:, k:k + 1] * B_[:, k:k + 1].T
        out = (acc * alpha).bfloat16().double()
        assert ((out - real).abs() <= bound).all()


def test_exact_rounding_breaks_ties_to_even():
    # alpha * I * 2^-20 exactly halfway between bf16 neighbours 1.0 and 1.0078125
    I = torch.tensor([[int((1 + 2**-8) * 2**20)], [int((1 + 3 * 2**-8) * 2**20)]])
    d = G.round_bf16_exact(I, 1.0)
    assert d[0, 0].item() == 1.0 and d[1, 0].item() == 1.015625
    assert G._round_fraction_bf16(Fraction(257, 256)) == 1.0


def test_integer_sums_are_exact():
    aq, as_, bq, bs, ga, gb = _operands(16, 16, 64, "normal", 3)
    a_int = G.operand_integers(aq, as_, 16, 64)
    A = nvfp4.dequantize_operand(aq, as_, (16, 64)).double()
    assert torch.equal(a_int.double() * 2.0**-10, A)


# --- the fast exact sums: one float64 GEMM where T = Σ|ab| < 2^53, the split elsewhere ------
OPERAND_KINDS = ("normal", "lognormal", "raw", "cancel")


def _ints(kind, rows, K, seed):
    from validators.gemm_operands import make_operand

    q, s, _ = make_operand(kind, rows, K, seed, "cpu")
    return G.operand_integers(q, s, rows, K)


def _saturated(rows, K, odd=True):
    """Integer operands whose sums pass 2^53: every code +6 at scale 448, but (``odd``) one
    element 0.5 at the smallest subnormal scale, so that Σ a·b is odd and above 2^53: no
    float64 holds it, and a plain float64 GEMM must round it."""
    codes = torch.full((rows, K), 7, dtype=torch.uint8)
    scales = torch.full((rows, K // 16), 0x7E, dtype=torch.uint8)
    if odd:
        codes[:, -16:] = 0
        codes[:, -1] = 1
        scales[:, -1] = 0x01
    q = nvfp4.pack_codes(codes)
    s = nvfp4.to_blocked(scales).view(torch.float8_e4m3fn)
    return G.operand_integers(q, s, rows, K)


@given(kind=st.sampled_from(OPERAND_KINDS), seed=st.integers(0, 10**6),
       M=st.integers(1, 24), N=st.integers(1, 24), kb=st.integers(1, 160))
def test_fast_sums_equal_the_split_bit_for_bit(kind, seed, M, N, kb):
    K = 16 * kb
    a, b = _ints(kind, M, K, seed), _ints(kind, N, K, seed + 1)
    want, want_abs = G.split_sums(a, b), G.split_sums(a.abs(), b.abs())
    assert torch.equal(G.exact_sums(a, b), want)
    assert torch.equal(G.abs_sums(a, b), want_abs)
    I, I_abs = G.oracle_sums(a, b)
    assert torch.equal(I, want) and torch.equal(I_abs, want_abs)


def test_sums_past_2_53_take_the_split_and_stay_exact(monkeypatch):
    K = 2048
    a = torch.cat([_saturated(3, K), _ints("normal", 5, K, 1)])  # rows 0-2 pass 2^53
    b = torch.cat([_saturated(2, K), _ints("lognormal", 4, K, 2)])
    want = G.split_sums(a, b)
    assert int(want[0, 0]) % 2 == 1 and int(want[0, 0]) > 2**53
    plain = (a.double() @ b.double().T).to(torch.int64)
    assert not torch.equal(plain, want)  # what one float64 GEMM gives there: rounded
    split_rows = []
    real_split = G.split_sums
    monkeypatch.setattr(G, "split_sums", lambda x, y: split_rows.append(x.shape[0])
                        or real_split(x, y))
    assert torch.equal(G.exact_sums(a, b), want)
    assert split_rows == [3]  # only the rows whose certificate reaches 2^53
    split_rows.clear()
    I, I_abs = G.oracle_sums(a, b)
    assert torch.equal(I, want) and torch.equal(I_abs, real_split(a.abs(), b.abs()))
    assert split_rows == [3, 3]


def test_every_row_through_the_split_gives_the_same_bits(monkeypatch):
    a, b = _ints("cancel", 40, 512, 3), _ints("raw", 24, 512, 4)
    want = G.exact_sums(a, b), G.abs_sums(a, b), G.oracle_sums(a, b)
    monkeypatch.setattr(G, "EXACT_F64", 2.0**20)  # no row certified: the merge path everywhere
    got = G.exact_sums(a, b), G.abs_sums(a, b), G.oracle_sums(a, b)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert all(torch.equal(x, y) for x, y in zip(got[2], want[2]))


@given(kind=st.sampled_from(OPERAND_KINDS + ("saturated",)), seed=st.integers(0, 10**6),
       M=st.integers(1, 12), N=st.integers(1, 12), kb=st.sampled_from([1, 8, 64, 128]))
def test_reference_gemm_is_correctly_rounded_and_its_bound_unchanged(kind, seed, M, N, kb):
    from validators.gemm_operands import make_operand

    K = 16 * kb
    if kind == "saturated":
        a_q = nvfp4.pack_codes(torch.full((M, K), 7, dtype=torch.uint8))
        b_q = nvfp4.pack_codes(torch.full((N, K), 7, dtype=torch.uint8))
        sa, sb = (nvfp4.to_blocked(torch.full((r, K // 16), 0x7E, dtype=torch.uint8)).view(
            torch.float8_e4m3fn) for r in (M, N))
        ga, gb = 1.25, 0.75
    else:
        a_q, sa, ga = make_operand(kind, M, K, seed, "cpu")
        b_q, sb, gb = make_operand(kind, N, K, seed + 1, "cpu")
    d, real, bound = G.reference_gemm(a_q, sa, b_q, sb, ga, gb, M, N, K)
    a, b = G.operand_integers(a_q, sa, M, K), G.operand_integers(b_q, sb, N, K)
    I = G.split_sums(a, b)
    alpha = float(torch.tensor(ga, dtype=torch.float32) * torch.tensor(gb, dtype=torch.float32))
    for (m, n), v in zip(torch.cartesian_prod(torch.arange(M), torch.arange(N)).tolist(),
                         d.reshape(-1).tolist()):
        assert v == G._round_fraction_bf16(Fraction(alpha) * int(I[m, n]) / (1 << 20))
    want_bound = G.fp32_error_bound(I, G.split_sums(a.abs(), b.abs()), alpha, K)
    assert torch.equal(bound, want_bound)
    assert torch.equal(real, alpha * I.to(torch.float64) * 2.0**-20)


# --- correct rounding of alpha·I·2^-20 onto bf16 -------------------------------------------
def _exact_bf16(I: torch.Tensor, alpha: float) -> list:
    alpha = float(torch.tensor(alpha, dtype=torch.float32))
    return [G._round_fraction_bf16(Fraction(alpha) * int(i) / (1 << 20)) for i in I.tolist()]


@given(alpha_exp=st.integers(-140, 100), alpha_bits=st.integers(0, 2**23 - 1),
       seed=st.integers(0, 10**6), span=st.sampled_from([2**10, 2**40, 2**62]))
def test_rounding_matches_exact_rationals_on_random_integers(alpha_exp, alpha_bits, seed, span):
    alpha = (1 + alpha_bits / 2**23) * 2.0**alpha_exp
    gen = torch.Generator().manual_seed(seed)
    I = torch.randint(-span, span, (256,), generator=gen, dtype=torch.int64)
    I[:3] = torch.tensor([0, 1, -1])
    assert G.round_bf16_exact(I, alpha).tolist() == _exact_bf16(I, alpha)


@given(alpha_bits=st.integers(0, 2**23 - 1), alpha_exp=st.integers(-30, 10),
       mantissa=st.integers(0, 127), i_exp=st.integers(20, 61))
def test_rounding_near_midpoints_and_binade_edges(alpha_bits, alpha_exp, mantissa, i_exp):
    """Exact values around a bf16 midpoint, in steps of 1/8 of r's float64 ulp over 8 ulps
    either side, |I| up to 2^62 (where I's own conversion rounds): where a float64 r and the
    exact value can round apart. Two midpoints: above a random bf16 value, and the one just
    below the next power of two (the binade edge)."""
    alpha = float(torch.tensor((1 + alpha_bits / 2**23) * 2.0**alpha_exp, dtype=torch.float32))
    k = math.floor(i_exp - 20 + math.log2(alpha))  # bf16 values near alpha·2^(i_exp - 20)
    lo = (1 + mantissa / 128) * 2.0**k
    step = max(1, 2**(i_exp - 55))
    rows = []
    for mid in (lo * (1 + 2.0**-8), 2.0**(k + 1) * (1 - 2.0**-9)):
        centre = round(Fraction(mid) * (1 << 20) / Fraction(alpha))
        rows += [centre + step * d for d in range(-64, 65) if abs(centre + step * d) < 2**62]
    I = torch.tensor(rows, dtype=torch.int64)
    assert G.round_bf16_exact(I, alpha).tolist() == _exact_bf16(I, alpha)


def test_rounding_of_ties_subnormals_and_overflow():
    # ties: alpha·I·2^-20 exactly halfway, both parities of the kept bit
    I = torch.tensor([int((1 + 2**-8) * 2**20), int((1 + 3 * 2**-8) * 2**20)])
    assert G.round_bf16_exact(I, 1.0).tolist() == [1.0, 1.015625]
    # below bf16's normal range (a coarser grid) and at the overflow boundary
    tiny = torch.tensor([1, 3, 5, 2**20, -7], dtype=torch.int64)
    assert G.round_bf16_exact(tiny, 2.0**-140).tolist() == _exact_bf16(tiny, 2.0**-140)
    top = (2 - 2**-8) * 2.0**127  # halfway between bf16's largest finite value and 2^128
    alpha = 2.0**100
    I = torch.tensor([int(top / alpha * 2**20) + d for d in (-1, 0, 1)], dtype=torch.int64)
    got = G.round_bf16_exact(I, alpha).tolist()
    assert got == _exact_bf16(I, alpha) and got[-1] == float("inf")
