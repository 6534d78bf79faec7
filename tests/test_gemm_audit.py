"""The GEMM audit with Σ|ab| only where the output is not the correctly rounded one
(Nvfp4Linear.audit, numerics.gemm_oracle.may_leave_bound): the same verdicts and details as
the check against the full oracle, on the QUICK config's real projections and on outputs built
to leave the bound; the lemma behind it (a finite correctly rounded output is inside the bound
however small Σ|ab| is) on random and adversarial sums; the sparse Σ|ab| exact either way."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.h3 import QUICK, H3Config, H3Model, initial_latent
from models.nvfp4_linear import Audit, Nvfp4Linear
from numerics import gemm_oracle as G
from validators import rung4_block, trajectory_pass
from validators.rung3_projections import gemm_check


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def quick_inputs():
    """(block, role) -> (its reference linear, the input the QUICK reference feeds it, y the
    reference output) for every linear of step 0."""
    ref = H3Model(QUICK, seed=0)
    seen = {}

    def record(block, role, lin):
        def rec(x, rows=None, **epilogue):
            seen[(block, role)] = (lin, x, lin(x))
            return lin(x, rows=rows, **epilogue)
        return rec

    ref.derived(wrap=record).denoiser_step(initial_latent(QUICK, 0), 0)
    return seen


def _variants(oracle, d: torch.Tensor, seed: int):
    """Outputs to check: the correctly rounded one; the legal adversary's move; moves of 1, 2
    and 64 bf16 steps at random places (inside, near and past the bound); NaN, ±inf, -0.0."""
    _, real, bound = oracle
    gen = torch.Generator().manual_seed(seed)
    side = torch.randint(0, 2, d.shape, generator=gen) * 2 - 1
    yield "correct", d
    yield "legal", rung4_block.legal_move(d, real, bound, side)
    dd = d.double()
    ulp = torch.exp2(torch.floor(torch.log2(dd.abs().clamp_min(2.0**-126))) - 7)
    for steps in (1, 2, 64):
        pick = torch.rand(d.shape, generator=gen) < 0.01
        yield f"{steps} steps", torch.where(pick, (dd + steps * side * ulp).to(torch.bfloat16), d)
    y = d.clone()
    flat = y.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[:4]
    flat[idx[0]], flat[idx[1]], flat[idx[2]] = float("nan"), float("inf"), -float("inf")
    flat[idx[3]] = -0.0 if float(flat[idx[3]]) == 0.0 else flat[idx[3]]
    yield "nonfinite", y


def test_quick_audit_gives_the_full_oracles_verdicts_and_details(quick_inputs):
    n_fail = 0
    for (block, role), (lin, x, d) in quick_inputs.items():
        oracle = lin.oracle(x)
        for name, y in _variants(oracle, d, seed=block * 7 + len(role)):
            full = gemm_check(f"{block} {role} {name}", y, oracle)
            audit = lin.audit(x, y)
            assert gemm_check(f"{block} {role} {name}", y, audit) == full, (block, role, name)
            wrong = (y.view(torch.int16) != audit.d.view(torch.int16)).flatten()
            assert torch.equal(audit.at, wrong.nonzero().flatten())  # the bound only there
            n_fail += not full["pass"]
    assert n_fail >= 2 * len(quick_inputs)  # the 64-step and non-finite outputs fail


def test_row_slices_audit_as_the_oracle_does(quick_inputs):
    lin, x, d = quick_inputs[(1, "fc2")]
    y = d[128:].clone()
    y[3, 5] = float(y[3, 5]) * 1.5 + 1.0
    full = gemm_check("slice", y, lin.oracle(x, rows=(128, x.shape[0])))
    assert not full["pass"] and "element (3, 5)" in full["detail"]
    assert gemm_check("slice", y, lin.audit(x, y, rows=(128, x.shape[0]))) == full


def test_bound_gemm_runs_only_for_outputs_that_differ(quick_inputs, monkeypatch):
    calls = []
    real_abs_sums = G.abs_sums
    monkeypatch.setattr(G, "abs_sums", lambda a, b: calls.append(a.shape) or real_abs_sums(a, b))
    monkeypatch.setattr(G, "DENSE_AT", 10**9)  # any chosen element: the rows' GEMM, counted
    lin, x, d = quick_inputs[(0, "qkv")]
    assert lin.audit(x, d).at.numel() == 0 and calls == []
    y = d.clone()
    y[[7, 7, 200], [1, 9, 3]] = 0.5
    assert lin.audit(x, y).at.numel() == 3 and calls == [(2, x.shape[1])]  # rows 7 and 200


def _old_audit(self, x, y, rows=None):
    return self.oracle(x, rows=rows)


def test_trajectory_pass_rung_5_unchanged_by_the_sparse_audit(monkeypatch):
    """Rung 5 on QUICK (every block of step 0, every GEMM audited) with a legal backend whose
    fc1 of block 1 also leaves the bound at one element: the RungResult (every check's verdict
    and detail, the elements) is the full oracle's, to the byte."""
    def backend(block, role, lin):
        legal = rung4_block.edge_wrap(seed=3)(block, role, lin)

        def run(x, rows=None, **epilogue):
            y = legal(x, rows=rows, **epilogue)
            if block == 1 and role == "fc1":
                y = y.clone()
                y[5, 7] = y[5, 7] * 2 + 1
            return y
        return run

    ref = H3Model(QUICK, seed=0)
    new = trajectory_pass.run_rungs(ref, wrap=backend, rungs=(5,), log=_quiet)[5].to_json()
    monkeypatch.setattr(Nvfp4Linear, "audit", _old_audit)
    old = trajectory_pass.run_rungs(ref, wrap=backend, rungs=(5,), log=_quiet)[5].to_json()
    assert new == old and new["status"] == "fail"
    details = [c["detail"] for c in new["checks"].values()]
    assert any("outside the oracle bound" in t for t in details)
    assert any("relative deviation" in t for t in details)  # the legal moves propagated


# --- the lemma: a finite correctly rounded output is inside the bound for any Σ|ab| >= |I| --
@given(alpha_exp=st.integers(-150, 126), alpha_bits=st.integers(0, 2**23 - 1),
       seed=st.integers(0, 2**31), span=st.sampled_from([4, 20, 40, 52, 62]),
       K=st.sampled_from([16, 1024, 14336, 2**19]))
def test_correctly_rounded_output_is_inside_the_smallest_bound(alpha_exp, alpha_bits, seed,
                                                               span, K):
    """Random I (up to 2^62) and fp32 alphas from subnormal to huge, the bound at its smallest
    (Σ|ab| = |I|): every finite D passes the check in its float64, and the mask keeps every
    element that is not finite."""
    alpha = float(torch.tensor(math.ldexp(1 + alpha_bits / 2**23, alpha_exp),
                               dtype=torch.float32))
    gen = torch.Generator().manual_seed(seed)
    I = torch.randint(-2**span, 2**span, (64, 64), generator=gen, dtype=torch.int64)
    I[0, :8] = torch.tensor([0, 1, -1, 2**span, -2**span, 3, 2**20, -2**20])
    _inside_or_kept(I, alpha, K)


@given(alpha_bits=st.integers(0, 2**23 - 1), alpha_exp=st.integers(-30, 30),
       mantissa=st.integers(2**7, 2**8 - 1), i_exp=st.integers(21, 60))
def test_ties_and_binade_edges_are_inside_the_smallest_bound(alpha_bits, alpha_exp, mantissa,
                                                             i_exp):
    """I placed at and around bf16 midpoints and powers of two of alpha·I·2^-20."""
    alpha = float(torch.tensor(math.ldexp(1 + alpha_bits / 2**23, alpha_exp),
                               dtype=torch.float32))
    centre = (2 * mantissa + 1) * 2 ** (i_exp - 9)  # a midpoint of I's own grid
    I = torch.tensor([centre + o for o in range(-3, 4)] + [2**i_exp + o for o in (-1, 0, 1)],
                     dtype=torch.int64)[None]
    _inside_or_kept(I, alpha, 5376)


def _inside_or_kept(I, alpha, K):
    d = G.round_bf16_exact(I, alpha)
    real = alpha * I.to(torch.float64) * 2.0**-20  # as Nvfp4Linear.oracle forms it
    bound = G.fp32_error_bound(I, I.abs(), alpha, K)
    passes = (d.double() - real).abs() <= bound
    fin = torch.isfinite(d)
    assert passes[fin].all(), (alpha, I[fin & ~passes][:4])
    kept = G.may_leave_bound(d.to(torch.bfloat16), d)
    assert torch.equal(kept, ~fin)  # y = D is skipped exactly where D is finite


def test_overflowing_output_is_checked_and_fails():
    I = torch.tensor([[2**60, 1, -2**60]])
    d = G.round_bf16_exact(I, 2.0**120)
    assert torch.isinf(d[0, 0]) and torch.isinf(d[0, 2])
    assert G.may_leave_bound(d.to(torch.bfloat16), d).tolist() == [[True, False, True]]


# --- Σ|ab| at chosen elements: exact, gathered or by the rows' GEMM --------------------------
@pytest.mark.parametrize("dense_at", [10**9, 1])
def test_abs_sums_at_chosen_elements_equals_the_full_abs_sums(dense_at, monkeypatch):
    monkeypatch.setattr(G, "DENSE_AT", dense_at)
    monkeypatch.setattr(G, "GATHER_ELEMENTS", 5000)  # several gather passes
    gen = torch.Generator().manual_seed(5)
    K = 4096
    a = torch.randint(-2**21, 2**21, (40, K), generator=gen)
    b = torch.randint(-2**21, 2**21, (24, K), generator=gen)
    a[3] = 2**21 + 12345  # T past 2^53 in row 3: abs_sums takes the split there
    full = G.abs_sums(a, b)
    assert int(full[3].max()) >= 2**53
    rows = torch.randint(0, 40, (300,), generator=gen)
    cols = torch.randint(0, 24, (300,), generator=gen)
    rows[:4] = 3
    assert torch.equal(G.abs_sums_at(a, b, rows, cols), full[rows, cols])
    assert G.abs_sums_at(a, b, rows[:0], cols[:0]).shape == (0,)


def test_audit_refuses_a_wrong_output(quick_inputs):
    lin, x, d = quick_inputs[(0, "out")]
    for bad in (d.float(), d[1:], d.T.contiguous(), "y"):
        with pytest.raises(ValueError, match="y must be a bf16 tensor"):
            lin.audit(x, bad)
    assert isinstance(lin.audit(x, d), Audit)


def test_tiny_config_audit_agrees_with_the_oracle_on_every_linear():
    """The same on a config whose linears have K = 128 and 256 (other chunking)."""
    tiny = H3Config(blocks=1, hidden=128, mlp=256, head_dim=64, video_tokens=300,
                    audio_tokens=20)
    ref = H3Model(tiny, seed=4)
    x = ref.embed(initial_latent(tiny, 4), 0)
    for role, lin in ref.linears(0).items():
        xi = x if role != "fc2" else torch.randn(x.shape[0], 256).to(torch.bfloat16)
        d, oracle = lin(xi), lin.oracle(xi)
        for name, y in _variants(oracle, d, seed=11):
            assert gemm_check(name, y, lin.audit(xi, y)) == gemm_check(name, y, oracle)
