"""CodePredictor reference loop, checkpoint loader and the sampler resource."""
import math

import pytest
import torch

from models.codepredictor import (checkpoint_names, depth_loop, load_checkpoint, random_weights)
from configs.codepredictor import CodePredictorConfig
from models.sampler import Sampler, SamplerSettings, draw, filtered_scores
from numerics.formats import BF16, round_to_format
from numerics.gemm_oracle import gamma

TINY = CodePredictorConfig(hidden=64, intermediate=128, layers=2, q_heads=4, kv_heads=2,
                           head_dim=16, talker_hidden=48, vocab=32)


def _inputs(cfg, R, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(R, cfg.talker_hidden, generator=g), torch.randint(
        0, cfg.talker_vocab, (R,), generator=g)


def test_teacher_forcing_reproduces_the_free_run():
    w = random_weights(TINY, seed=1, dtype=torch.float32)
    h, g0 = _inputs(TINY, 3)
    free = depth_loop(w, h, g0, sampler=Sampler(3, seeds=[7, 8, 9]))
    forced = depth_loop(w, h, g0, codes=free.codes)
    assert torch.equal(forced.codes, free.codes) and torch.equal(forced.logits, free.logits)
    assert forced.kv[0][0].shape == (3, TINY.kv_heads, TINY.positions, TINY.head_dim)
    greedy = depth_loop(w, h, g0)
    assert torch.equal(greedy.codes, greedy.logits.argmax(-1))


def test_talker_sum_is_one_rounding_of_the_16_embeddings():
    """The talker sum (HF's bf16 ``sum(1)`` over E_t[g0] and the 15 drawn embeddings) rounds
    once: torch accumulates the 16 bf16 rows in fp32 (in some order) and rounds the result to
    bf16. Derivation: any fp32 summation of 16 terms is within gamma_15(2^-24) · sum|e_i| of
    the exact sum S (Higham, Thm 4.8; round-to-nearest fp32 on the CPU), so its one rounding,
    being monotone, lies between RN_bf16(S - err) and RN_bf16(S + err), err including the
    float64 sum's own gamma_15(2^-53) slack. Adding in bf16 (a rounding a step) leaves that
    interval."""
    w = random_weights(TINY, seed=2, dtype=torch.bfloat16)
    h, g0 = _inputs(TINY, 2)
    out = depth_loop(w, h, g0)
    embs = torch.stack([w.talker_embed[g0]] + [w.embeds[i][out.codes[:, i]]
                                               for i in range(TINY.heads_drawn)], 1)
    terms = embs.double()
    exact, mag = terms.sum(1), terms.abs().sum(1)
    err = (gamma(15, 2.0**-24) + gamma(15, 2.0**-53)) * mag
    lo, hi = round_to_format(exact - err, BF16), round_to_format(exact + err, BF16)

    def one_rounding(t):
        return ((lo <= t.double()) & (t.double() <= hi)).all()

    assert one_rounding(out.talker_sum)
    stepwise = embs[:, 0]
    for i in range(1, embs.shape[1]):
        stepwise = stepwise + embs[:, i]  # bf16 + bf16: rounded to bf16 each step
    assert not one_rounding(stepwise)


def test_rows_do_not_depend_on_the_batch():
    w = random_weights(TINY, seed=3, dtype=torch.float64)
    h, g0 = _inputs(TINY, 3)
    batch = depth_loop(w, h.double(), g0, sampler=Sampler(3, seeds=[11, 12, 13]))
    for r in range(3):
        one = depth_loop(w, h[r:r + 1].double(), g0[r:r + 1],
                         sampler=Sampler(1, seeds=[11 + r]))
        assert torch.equal(one.codes[0], batch.codes[r])


def test_bf16_loop_tracks_fp32_under_teacher_forcing():
    w32 = random_weights(TINY, seed=4, dtype=torch.float32)
    h, g0 = _inputs(TINY, 4)
    ref = depth_loop(w32, h, g0)
    b = depth_loop(w32.to(dtype=torch.bfloat16), h, g0, codes=ref.codes)
    rel = (b.logits - ref.logits).norm() / ref.logits.norm()
    assert rel < 3e-2


def test_checkpoint_loader_round_trip(tmp_path):
    from safetensors.torch import save_file

    w = random_weights(TINY, seed=5, dtype=torch.bfloat16)
    tensors = {}
    names = iter(checkpoint_names(TINY))
    for lw in w.layers:
        for f in ("wq", "wk", "wv", "wo", "q_norm", "k_norm", "in_norm", "post_norm", "gate",
                  "up", "down"):
            tensors[next(names)] = getattr(lw, f).contiguous()
    for t in (w.final_norm, w.proj_w, w.proj_b, w.talker_embed, *w.embeds, *w.heads):
        tensors[next(names)] = t.contiguous()
    tensors["talker.model.layers.0.mlp.up_proj.weight"] = torch.zeros(2)  # unrelated tensor
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    back = load_checkpoint(path, TINY)
    h, g0 = _inputs(TINY, 2)
    assert torch.equal(depth_loop(back, h, g0).logits, depth_loop(w, h, g0).logits)
    del tensors[checkpoint_names(TINY)[0]]
    save_file(tensors, str(path))
    with pytest.raises(KeyError, match="missing"):
        load_checkpoint(path, TINY)


# --- sampler --------------------------------------------------------------------------------
SETTINGS = [SamplerSettings(), SamplerSettings(temperature=0.7, top_k=5, top_p=0.8),
            SamplerSettings(temperature=0.0), SamplerSettings(temperature=1.3, top_k=0)]


@pytest.mark.parametrize("filters", [False, True])
def test_fused_draws_plus_advance_equal_fifteen_sample_calls(filters):
    R, V = 4, 2048
    st = SETTINGS if filters else [SamplerSettings(top_k=0, temperature=1.0)] * R
    logits = [torch.randn(R, V, generator=torch.Generator().manual_seed(j)).to(torch.bfloat16)
              .float() for j in range(15)]
    a = Sampler(R, st, seeds=[3, 1, 4, 1])
    want = [a.sample(lg) for lg in logits]
    b = Sampler(R, st, seeds=[3, 1, 4, 1])
    b.device = torch.device("cuda")  # the contract, exercised without a GPU
    args = b.fused_draw_args()
    got = []
    for j, lg in enumerate(logits):  # what a kernel does: draw at offset + j, in place
        s = filtered_scores(lg, args["temperature"], args["top_k"], args["top_p"])
        got.append(draw(s, args["temperature"], args["seed"], args["offset"] + j))
    b.advance_offsets(15)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert torch.equal(a.offset, b.offset) and int(a.offset[0]) == 15


def test_fused_draw_args_refuses_what_one_plain_draw_cannot_do():
    def s(**kw):
        x = Sampler(2, **kw)
        x.device = torch.device("cuda")
        return x

    assert s().fused_draw_args() is not None
    assert Sampler(2).fused_draw_args() is None  # a CPU sampler
    assert s(eager=True).fused_draw_args() is None
    assert s(logprobs=True).fused_draw_args() is None
    assert s(keep_last_token=True).fused_draw_args() is None
    assert s(settings=SamplerSettings(repetition_penalty=1.05)).fused_draw_args() is None
    assert s(settings=SamplerSettings(min_p=0.1)).fused_draw_args() is None


def test_sampled_distribution_chi_square_with_ties_at_k():
    V, k, n = 64, 8, 40_000
    base = torch.linspace(0.5, -3, V)
    base[k - 1] = base[k] = base[k + 1] = 1.0  # three-way tie at the k-th value: all survive
    base[:k - 1] = torch.linspace(3, 1.5, k - 1)
    T = 0.9
    scores = filtered_scores(base.view(1, -1), torch.tensor([T]), torch.tensor([k]))
    surv = torch.isfinite(scores[0])
    assert int(surv.sum()) == k + 2
    p = torch.softmax(scores[0].double(), dim=0)
    toks = draw(scores.expand(n, -1), torch.full((n,), T), torch.full((n,), 42),
                torch.arange(n))
    counts = torch.bincount(toks, minlength=V).double()
    assert counts[~surv].sum() == 0
    exp = p[surv] * n
    chi2 = float(((counts[surv] - exp) ** 2 / exp).sum())
    df = int(surv.sum()) - 1
    assert chi2 < df + 6 * math.sqrt(2 * df), f"chi2 {chi2:.1f} with {df} dof"


def test_greedy_and_top_p_semantics():
    lg = torch.tensor([[0.0, 2.0, 1.0, 5.0]])
    assert int(draw(lg, torch.tensor([0.0]), torch.tensor([0]), torch.tensor([0]))) == 3
    s = filtered_scores(lg, torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.5]))
    assert torch.isfinite(s).sum() == 1  # p(5) = 0.94 > 0.5: only the top token remains
    with pytest.raises(ValueError):
        Sampler(1, SamplerSettings(top_p=0.0))


@pytest.mark.gpu
@pytest.mark.fast
def test_loop_on_cuda_matches_cpu_and_captures():
    from models.codepredictor import CapturedLoop

    w = random_weights(TINY, seed=6, dtype=torch.float32)
    h, g0 = _inputs(TINY, 3)
    cpu = depth_loop(w, h, g0)
    wc = w.to(device="cuda")
    gpu = depth_loop(wc, h.cuda(), g0.cuda())
    assert torch.equal(gpu.codes.cpu(), cpu.codes)
    assert torch.allclose(gpu.logits.cpu(), cpu.logits, rtol=1e-4, atol=1e-4)
    loop = CapturedLoop(wc, rows=3, sampler=Sampler(3, seeds=[1, 2, 3], device="cuda"))
    out = loop(h.cuda(), g0.cuda())
    ref = depth_loop(wc, h.cuda(), g0.cuda(), sampler=Sampler(3, seeds=[1, 2, 3], device="cuda"))
    assert torch.equal(out.codes, ref.codes)
