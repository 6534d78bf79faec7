"""Nvfp4Linear (P3): the reference backend against an independent float64 computation, row
slicing, refusals, and (GPU) the p0 backend against the reference within the oracle's bound."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.nvfp4_linear import BackendUnavailable, Nvfp4Linear, resolve_backend
from numerics import nvfp4

HAVE_CUDA = torch.cuda.is_available()


def _data(M, N, K, seed, heavy=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen)
    if heavy:  # heavy-tailed channels, as H3's activations
        x = x * torch.exp(1.5 * torch.randn(K, generator=gen))
    w = torch.randn(N, K, generator=gen) / K**0.5
    return x.to(torch.bfloat16), w.to(torch.bfloat16)


def _independent(x, w):
    """alpha·S from numerics.dequantize: fp32 dequantized operands, their product in float64.

    Each dequantized element is e2m1 · fl32(s·g) rounded once more to fp32, so each product
    carries relative error <= ~2·2^-24 and alpha one more 2^-24: |this - alpha·S| <=
    3·2^-24·alpha·Σ|a·b|, inside the oracle bound's accumulation term (γ_{K-1} >= 31·2^-23 for
    K >= 32). The correctly rounded D is within half a bf16 ulp of alpha·S, the bound's other
    term, so |D - this| <= the oracle's bound."""
    gx, gw = nvfp4.global_scale(x), nvfp4.global_scale(w)
    qx, sx = nvfp4.quantize(x, gx, pad_16x=True)
    qw, sw = nvfp4.quantize(w, gw)
    a = nvfp4.dequantize(qx, sx, gx, x.shape, torch.float32).double()
    b = nvfp4.dequantize(qw, sw, gw, w.shape, torch.float32).double()
    return a @ b.T


@given(M=st.integers(1, 300), nb=st.integers(1, 4), kb=st.integers(1, 6),
       seed=st.integers(0, 2**30), heavy=st.booleans())
def test_reference_matches_independent_float64(M, nb, kb, seed, heavy):
    x, w = _data(M, 16 * nb, 32 * kb, seed, heavy)
    lin = Nvfp4Linear(w)
    y = lin(x)
    d, _, bound = lin.oracle(x)
    assert y.dtype == torch.bfloat16 and y.shape == (M, 16 * nb)
    assert torch.equal(y.view(torch.int16), d.view(torch.int16))
    err = (y.double() - _independent(x, w)).abs()
    bad = ~(err <= bound)
    assert not bad.any(), f"{int(bad.sum())} elements outside the bound (seed {seed})"


@given(M=st.integers(129, 400), r1=st.integers(1, 400), seed=st.integers(0, 2**30))
def test_row_slice_equals_slice_of_output(M, r1, seed):
    x, w = _data(M, 64, 64, seed)
    lin = Nvfp4Linear(w)
    y = lin(x)
    r1 = min(max(r1, 129), M)
    for rows in ((128, r1), (0, min(r1, 64))):
        part = lin(x, rows=rows)
        assert torch.equal(part.view(torch.int16), y[rows[0]:rows[1]].view(torch.int16)), rows


def test_out_receives_the_output_and_is_checked():
    """``out=``: the result is stored there and returned (p0 and p2 store into it directly: a
    caller that poisoned it sees every element written; the reference copies), with gate and
    residual and on a row slice; a wrong dtype, shape or a non-contiguous out is refused."""
    x, w = _data(300, 32, 64, 4)
    lin = Nvfp4Linear(w)
    gate = torch.randn(32).to(torch.bfloat16)
    res = torch.randn(300, 32).to(torch.bfloat16)
    out = torch.full((300, 32), float("nan"), dtype=torch.bfloat16)
    y = lin(x, gate=gate, residual=res, out=out)
    assert y is out and torch.equal(out.view(torch.int16),
                                    lin(x, gate=gate, residual=res).view(torch.int16))
    part = torch.empty(172, 32, dtype=torch.bfloat16)
    assert lin(x, rows=(128, 300), out=part) is part
    assert torch.equal(part.view(torch.int16), lin(x)[128:].view(torch.int16))
    with pytest.raises(TypeError, match="out must be a bf16"):
        lin(x, out=out.float())
    with pytest.raises(ValueError, match=r"out has shape \(300, 32\); need \[172, 32\]"):
        lin(x, rows=(128, 300), out=out)
    with pytest.raises(ValueError, match="contiguous"):
        lin(x, out=torch.empty(32, 300, dtype=torch.bfloat16).T)


def test_refusals():
    x, w = _data(32, 64, 64, 1)
    lin = Nvfp4Linear(w)
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        Nvfp4Linear(w.tolist())
    with pytest.raises(TypeError, match="weight has dtype torch.float32"):
        Nvfp4Linear(w.float())
    with pytest.raises(ValueError, match="N a multiple of 16 and K a multiple of 32"):
        Nvfp4Linear(w[:24])
    with pytest.raises(ValueError, match="N a multiple of 16 and K a multiple of 32"):
        Nvfp4Linear(w[:, :48])
    with pytest.raises(ValueError, match="weight is on meta"):
        Nvfp4Linear(torch.empty(64, 64, dtype=torch.bfloat16, device="meta"))
    bad = w.clone()
    bad[3, 4] = float("inf")
    with pytest.raises(ValueError, match="weight holds NaN or inf"):
        Nvfp4Linear(bad)
    with pytest.raises(ValueError, match="backend must be one of"):
        Nvfp4Linear(w, backend="cublas")
    if not (HAVE_CUDA and torch.cuda.get_device_capability(0) == (9, 0)):
        for backend in ("p1", "p2"):
            with pytest.raises(BackendUnavailable, match=f"the {backend} backend needs"):
                Nvfp4Linear(w, backend=backend, role="qkv")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        lin(x.float().numpy())
    with pytest.raises(TypeError, match="x has dtype torch.float16"):
        lin(x.half())
    with pytest.raises(ValueError, match=r"expected \[M >= 1, 64\]"):
        lin(x[:, :32])
    with pytest.raises(ValueError, match=r"expected \[M >= 1, 64\]"):
        lin(x[0])
    with pytest.raises(ValueError, match="x is on meta"):
        lin(torch.empty(32, 64, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(ValueError, match="0 <= r0 < r1 <= M = 32"):
        lin(x, rows=(0, 33))
    with pytest.raises(ValueError, match="multiple of 128"):
        Nvfp4Linear(w)(_data(256, 64, 64, 2)[0], rows=(64, 200))
    with pytest.raises(TypeError, match="rows must be a pair of ints"):
        lin(x, rows=(0.0, 8))


def test_fc2_pinned_to_p0():
    """A streamed backend asked for FC2 resolves to p0 (the seed keeps FC2 off streaming)."""
    if HAVE_CUDA and torch.cuda.get_device_capability(0) == (9, 0):
        assert resolve_backend("p1", "fc2") == "p0"
    else:
        with pytest.raises(BackendUnavailable, match="p0 backend needs"):
            resolve_backend("p1", "fc2")


@pytest.mark.skipif(HAVE_CUDA, reason="checks the refusal on a machine without CUDA")
def test_p0_refused_without_cuda():
    _, w = _data(32, 64, 64, 3)
    with pytest.raises(BackendUnavailable, match="p0 backend needs a CUDA GPU"):
        Nvfp4Linear(w, backend="p0")
    with pytest.raises(BackendUnavailable, match="p0 backend needs a CUDA GPU"):
        Nvfp4Linear(w).with_backend("p0")


@pytest.mark.gpu
@pytest.mark.parametrize("role", ["qkv", "out", "fc1", "fc2"])
def test_p0_within_oracle_bound_at_scaled_config(role):
    """p0 (amax + quantize kernel + gemm_nvfp4) on the scaled H3 shapes: every element within
    the oracle's proven bound of the exact result, reruns and row slices bit-identical."""
    from models.h3 import QUICK

    N, K = QUICK.shapes()[role]
    x, w = _data(QUICK.tokens + 37, N, K, 11)  # ragged M: 16-padding inside the backend
    ref = Nvfp4Linear(w.cuda())
    p0 = ref.with_backend("p0")
    assert p0.backend == "p0"
    x = x.cuda()
    y = p0(x)
    _, real, bound = ref.oracle(x)
    assert y.shape == (x.shape[0], N)
    assert bool(((y.double() - real).abs() <= bound).all())
    assert torch.equal(p0(x).view(torch.int16), y.view(torch.int16))
    part = p0(x, rows=(128, x.shape[0]))
    assert torch.equal(part.view(torch.int16), y[128:].view(torch.int16))


def test_oracle_in_row_chunks_equals_one_pass(monkeypatch):
    import models.nvfp4_linear as L

    x, w = _data(700, 64, 128, 4)
    lin = Nvfp4Linear(w)
    whole = lin.oracle(x, rows=(128, 700))
    monkeypatch.setattr(L, "CHUNK_ELEMENTS", 128 * 128)  # 128-row chunks, the last ragged
    for a, b in zip(whole, lin.oracle(x, rows=(128, 700))):
        assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.int16) if b.dtype == torch.bfloat16 else b)


@given(bad=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
       i=st.integers(0, 31), j=st.integers(0, 63), sliced=st.booleans())
def test_nonfinite_input_refused_naming_x(bad, i, j, sliced):
    """NaN or ±inf anywhere in x (in the sliced rows or not: x is quantized as a whole) is
    refused before the GEMM, with no mention of a parameter Nvfp4Linear does not take."""
    x, w = _data(32, 64, 64, 5)
    x[i, j] = bad
    lin = Nvfp4Linear(w)
    rows = (0, 16) if sliced else None
    for call in (lambda: lin(x, rows=rows), lambda: lin.oracle(x, rows=rows)):
        with pytest.raises(ValueError, match="x holds NaN or inf") as err:
            call()
        assert "nonfinite_g" not in str(err.value)


@pytest.mark.parametrize("role, error", [("bogus", ValueError), ("QKV", ValueError),
                                         ("", ValueError), (123, TypeError),
                                         (True, TypeError), (("qkv",), TypeError)])
def test_unknown_role_refused(role, error):
    _, w = _data(32, 64, 64, 6)
    with pytest.raises(error, match=r"role must be None or one of \('qkv', 'out', 'fc1', "
                                    r"'fc2'\)"):
        Nvfp4Linear(w, role=role)
    with pytest.raises(error, match="role must be None or one of"):
        resolve_backend("reference", role)


def test_known_roles_taken():
    _, w = _data(32, 64, 64, 7)
    for role in (None, "qkv", "out", "fc1"):
        assert Nvfp4Linear(w, role=role).role == role
