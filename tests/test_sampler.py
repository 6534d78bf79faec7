"""The NaN rule (models.sampler): a NaN logit is never drawn, a row with no candidate is refused.

The same inputs go through the Sampler and through the reference loop: depth_loop on tiny random
weights whose heads are poisoned, so some logits come out NaN; the loop's codes must be what a
twin Sampler draws from the loop's own logits, and what it draws with those NaN read as -inf.
"""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.codepredictor import depth_loop, random_weights
from configs.codepredictor import CodePredictorConfig
from models.sampler import Sampler, SamplerSettings, draw, filtered_scores

TINY = CodePredictorConfig(hidden=64, intermediate=128, layers=2, q_heads=4, kv_heads=2,
                           head_dim=16, talker_hidden=48, vocab=32)
NAN, INF = math.nan, math.inf
R = 4
# top-k small enough that a NaN ranked first (as torch's sort ranks it) would be in the draw,
# and a greedy row: before the rule a NaN logit won every one of these draws
SETTINGS = [SamplerSettings(temperature=0.9, top_k=3), SamplerSettings(temperature=1.3, top_k=0),
            SamplerSettings(temperature=0.0), SamplerSettings(temperature=0.7, top_p=0.8)]


def _inputs(cfg, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cfg.talker_hidden, generator=g),
            torch.randint(0, cfg.vocab, (rows,), generator=g))


def _poisoned(seed=3):
    """fp32 weights whose head s makes logit columns {s, s + 7, argmax-prone 5} NaN."""
    w = random_weights(TINY, seed=seed, dtype=torch.float32)
    cols = []
    for s, head in enumerate(w.heads):
        c = sorted({s % TINY.vocab, (s + 7) % TINY.vocab, 5})
        head[c] = NAN
        cols.append(c)
    return w, cols


def _nan_as_neg_inf(x):
    return torch.where(torch.isnan(x), torch.full_like(x, -INF), x)


def test_nan_logits_are_never_drawn_by_the_sampler_or_the_loop():
    w, cols = _poisoned()
    h, g0 = _inputs(TINY, R)
    out = depth_loop(w, h, g0, sampler=Sampler(R, SETTINGS, seeds=[4, 5, 6, 7]))
    twin = Sampler(R, SETTINGS, seeds=[4, 5, 6, 7])
    clean = Sampler(R, SETTINGS, seeds=[4, 5, 6, 7])
    for s in range(TINY.heads_drawn):
        logits = out.logits[:, s]
        assert torch.isnan(logits[:, cols[s]]).all()  # the poison reached the logits
        assert torch.equal(twin.sample(logits), out.codes[:, s])
        assert torch.equal(clean.sample(_nan_as_neg_inf(logits)), out.codes[:, s])
        assert not any(int(c) in cols[s] for c in out.codes[:, s])
    greedy = depth_loop(w, h, g0)  # no sampler: argmax under the same rule
    assert torch.equal(greedy.codes, _nan_as_neg_inf(greedy.logits).argmax(-1))


def test_the_draw_functions_follow_the_rule_without_a_host_read():
    logits = torch.tensor([[NAN, 1.0, 3.0, NAN], [NAN, NAN, NAN, NAN],
                           [-INF, -INF, -INF, -INF], [NAN, -INF, -2.0, NAN]])
    T = torch.tensor([0.0, 1.0, 0.0, 0.7])
    s = filtered_scores(logits, T, torch.tensor([1, 0, 2, 1]))
    assert not torch.isnan(s).any()
    tok = draw(s, T, torch.arange(4), torch.zeros(4, dtype=torch.int64))
    assert tok.tolist() == [2, 4, 4, 2]  # V = 4 where a row has no candidate (as the fused draw)


@pytest.mark.parametrize("row", [[NAN] * 6, [-INF] * 6, [NAN, -INF, NAN, -INF, NAN, -INF]])
def test_a_row_with_no_candidate_is_refused_naming_it(row):
    logits = torch.randn(3, 6)
    logits[1] = torch.tensor(row)
    smp = Sampler(3, seeds=[1, 2, 3])
    with pytest.raises(ValueError, match=r"row\(s\) \[1\]"):
        smp.sample(logits)
    assert smp.offset.tolist() == [0, 0, 0]  # nothing moved
    lossy = Sampler(3, SamplerSettings(temperature=0.5))  # finite logits that 1/T sends to -inf
    with pytest.raises(ValueError, match=r"row\(s\) \[0, 1, 2\]"):
        lossy.sample(torch.full((3, 6), -3e38))


@pytest.mark.parametrize("with_sampler", [False, True])
def test_the_loop_refuses_a_group_with_no_candidate_naming_group_and_row(with_sampler):
    w, _ = _poisoned()
    w.heads[4][:] = NAN  # every logit of group 5 is NaN
    h, g0 = _inputs(TINY, R)
    smp = Sampler(R, SETTINGS) if with_sampler else None
    with pytest.raises(ValueError, match=r"group 5 logits: row\(s\) \[0, 1, 2, 3\]"):
        depth_loop(w, h, g0, sampler=smp)
    w, _ = _poisoned()
    h[2] = NAN  # one row's hidden: its every logit is NaN from the first group on
    with pytest.raises(ValueError, match=r"group 1 logits: row\(s\) \[2\]"):
        depth_loop(w, h, g0, sampler=smp)


def test_the_issue_cases_are_refused():
    smp = Sampler(4)
    with pytest.raises(ValueError, match="rows"):
        smp.sample(torch.randn(1, 8))  # one row into a 4-row sampler returned 4 tokens
    with pytest.raises(ValueError, match="2-D"):
        smp.sample(torch.randn(8))  # 1-D logits: an unpacking error
    with pytest.raises(ValueError, match="temperature"):
        Sampler(2, SamplerSettings(temperature=NAN))  # passed, and then drew greedily
    with pytest.raises(ValueError, match=r"settings\[0\].repetition_penalty"):
        Sampler(2, SamplerSettings(repetition_penalty=NAN))


# --- argument checks that named no field, or came from torch (round 2) ---------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of CUDA on a CPU-only torch")
def test_cuda_refused_on_a_cpu_only_torch(tmp_path):
    from models.codepredictor import load_checkpoint

    for device in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(ValueError, match="no CUDA GPU is visible"):
            Sampler(2, device=device)  # was torch's "Torch not compiled with CUDA enabled"
        # refused before the file is looked at: no checkpoint needed
        with pytest.raises(ValueError, match="no CUDA GPU is visible"):
            load_checkpoint(tmp_path / "absent.safetensors", TINY, device=device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_index_past_the_visible_devices_refused():
    n = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"only {n} CUDA device"):
        Sampler(2, device=f"cuda:{n}")


@given(top_k=st.integers(2**63, 2**80))
def test_a_top_k_past_int64_names_the_field(top_k):
    with pytest.raises(ValueError, match=r"settings\[1\]\.top_k = \d+; expected an int in "
                                         r"\[0, 2\*\*63\)"):
        Sampler(2, [SamplerSettings(), SamplerSettings(top_k=top_k)])


@given(i=st.integers(0, 2), big=st.integers(2**63, 2**90), sign=st.sampled_from([1, -1]))
def test_a_seed_past_int64_names_its_index(i, big, sign):
    seeds = [1, 2, 3]
    seeds[i] = sign * big if sign > 0 else -big - 1  # -2**63 itself is an int64
    with pytest.raises(ValueError, match=rf"seeds\[{i}\] = -?\d+; expected an int in "
                                         r"\[-2\*\*63, 2\*\*63\)"):
        Sampler(3, seeds=seeds)


@given(seeds=st.lists(st.integers(-2**63, 2**63 - 1), min_size=3, max_size=3))
def test_every_int64_seed_is_taken(seeds):
    assert Sampler(3, seeds=seeds).seed.tolist() == seeds


def test_seed_refusals_name_the_seed():
    with pytest.raises(TypeError, match=r"seeds\[1\] = True; expected an int"):
        Sampler(2, seeds=[1, True])
    with pytest.raises(TypeError, match=r"seeds\[0\] = 1\.0; expected an int"):
        Sampler(2, seeds=[1.0, 2])
    with pytest.raises(ValueError, match="3 seeds for 2 rows"):
        Sampler(2, seeds=[1, 2, 3])
    with pytest.raises(TypeError, match="seeds must be a sequence of 2 ints"):
        Sampler(2, seeds=7)


@pytest.mark.parametrize("name, value, shown", [
    ("temperature", 1e39, "inf"), ("temperature", 2**1100, "inf"),
    ("repetition_penalty", 1e-50, "0.0"), ("top_p", 1e-50, "0.0"), ("min_p", 1 - 1e-12, "1.0")])
def test_float_settings_are_checked_as_the_fp32_values_stored(name, value, shown):
    with pytest.raises(ValueError, match=rf"settings\[0\]\.{name} = .*\({shown} in fp32\)"):
        Sampler(1, SamplerSettings(**{name: value}))
