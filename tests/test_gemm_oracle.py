"""The exact GEMM oracle and its proven fp32-accumulation bound."""
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
