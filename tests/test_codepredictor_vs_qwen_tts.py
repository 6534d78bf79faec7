"""Optional: the reference loop against qwen-tts 0.1.1's CodePredictor built from config (CPU).

Skipped unless qwen-tts (and transformers 4.57.3, librosa) are importable; the package's
torchaudio import is satisfied by a stub, since nothing here decodes audio. Greedy codes and
seeded-sampled codes (torch.multinomial on the global generator, as HF's generate draws) must be
identical, and the teacher-forced logits equal to float rounding.
"""
import importlib.machinery
import sys
import types

import pytest
import torch

from models.codepredictor import CP_PREFIX, TALKER_EMBED_KEY, depth_loop, load_checkpoint
from configs.codepredictor import CodePredictorConfig
from models.sampler import filtered_scores


def _import_qwen_tts():
    import importlib.util

    if importlib.util.find_spec("qwen_tts") is None:
        return None
    try:
        import transformers  # noqa: F401  (before the stub: its find_spec needs real specs)
    except ImportError:
        return None
    if "torchaudio" not in sys.modules:
        for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi",
                     "torchaudio.functional", "torchaudio.transforms"):
            m = types.ModuleType(name)
            m.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = m
    try:
        from qwen_tts.core.models import configuration_qwen3_tts as C
        from qwen_tts.core.models import modeling_qwen3_tts as M
    except Exception:
        return None
    return C, M


QT = _import_qwen_tts()
pytestmark = pytest.mark.skipif(QT is None, reason="qwen-tts 0.1.1 not importable")

CFG = CodePredictorConfig(hidden=64, intermediate=128, layers=2, q_heads=4, kv_heads=2,
                          head_dim=16, talker_hidden=48, vocab=64)


class MultinomialSampler:
    """HF generate's draw: temperature, top-k (ties kept), fp32 softmax, torch.multinomial."""

    def __init__(self, temperature, top_k):
        self.t, self.k = temperature, top_k

    def sample(self, logits):
        R = logits.shape[0]
        s = filtered_scores(logits, torch.full((R,), self.t), torch.full((R,), self.k))
        return torch.multinomial(torch.softmax(s, dim=-1), 1).view(-1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    C, M = QT
    cp_cfg = C.Qwen3TTSTalkerCodePredictorConfig(
        vocab_size=CFG.vocab, hidden_size=CFG.hidden, intermediate_size=CFG.intermediate,
        num_hidden_layers=CFG.layers, num_attention_heads=CFG.q_heads,
        num_key_value_heads=CFG.kv_heads, head_dim=CFG.head_dim, rope_theta=CFG.rope_theta,
        rms_norm_eps=CFG.rms_eps, num_code_groups=CFG.groups)
    talker_cfg = C.Qwen3TTSTalkerConfig(hidden_size=CFG.talker_hidden)
    torch.manual_seed(0)
    hf = M.Qwen3TTSTalkerCodePredictorModelForConditionalGeneration(cp_cfg, talker_cfg).eval()
    with torch.no_grad():  # norms away from 1 so that they are exercised
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    from safetensors.torch import save_file

    tensors = {CP_PREFIX + k: v.contiguous() for k, v in hf.state_dict().items()}
    talker_embed = torch.randn(3072, CFG.talker_hidden) * 0.05
    tensors[TALKER_EMBED_KEY] = talker_embed
    path = tmp_path_factory.mktemp("ckpt") / "cp.safetensors"
    save_file(tensors, str(path))
    ours = load_checkpoint(path, CFG, dtype=torch.float32)
    return hf, ours, talker_embed


def _inputs(R, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(R, CFG.talker_hidden, generator=g), torch.randint(0, 2048, (R,),
                                                                         generator=g)


def _hf_generate(hf, talker_embed, h, g0, **kw):
    emb = torch.cat([h.view(-1, 1, CFG.talker_hidden), talker_embed[g0].view(-1, 1,
                                                                             CFG.talker_hidden)], 1)
    with torch.no_grad():
        out = hf.generate(inputs_embeds=emb, max_new_tokens=CFG.heads_drawn,
                          return_dict_in_generate=True, output_scores=True, **kw)
    return out.sequences[:, -CFG.heads_drawn:], torch.stack(out.scores, 1)


def test_greedy_codes_and_logits_match_hf(models):
    hf, ours, te = models
    h, g0 = _inputs(3, 1)
    codes, _ = _hf_generate(hf, te, h, g0, do_sample=False)
    mine = depth_loop(ours, h, g0)
    assert torch.equal(mine.codes, codes)
    with torch.no_grad():  # teacher-forced logits of HF's forward on the same codes
        _, scores = _hf_generate(hf, te, h, g0, do_sample=False)
    assert torch.allclose(mine.logits, scores.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_sampled_codes_match_hf(models, seed):
    hf, ours, te = models
    h, g0 = _inputs(4, 10 + seed)
    torch.manual_seed(seed)
    codes, _ = _hf_generate(hf, te, h, g0, do_sample=True, temperature=0.9, top_k=8, top_p=1.0)
    torch.manual_seed(seed)
    mine = depth_loop(ours, h, g0, sampler=MultinomialSampler(0.9, 8))
    assert torch.equal(mine.codes, codes)


def test_bf16_greedy_codes_match_hf(models):
    hf, ours, te = models
    hf16 = hf.to(torch.bfloat16)
    try:
        ours16 = ours.to(dtype=torch.bfloat16)
        h, g0 = _inputs(4, 5)
        codes, scores = _hf_generate(hf16, te.to(torch.bfloat16), h.to(torch.bfloat16), g0,
                                     do_sample=False)
        mine = depth_loop(ours16, h.to(torch.bfloat16), g0)
        assert torch.equal(mine.codes, codes)
        # same codes; logits within bf16 noise (HF's SDPA and our attention round differently)
        assert (mine.logits - scores.float()).abs().max() <= 2 ** -6 * scores.abs().max()
    finally:
        hf.to(torch.float32)
