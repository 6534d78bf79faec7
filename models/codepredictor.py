"""Qwen3-TTS 1.7B CodePredictor: weights, a checkpoint loader, and the reference depth loop.

The loop follows the HF model (qwen-tts 0.1.1) as the model notes (§3) describe it: pass 0 runs
positions 0 and 1 (P·h and P·E_t[g0]), pass s = 1..14 runs position s + 1 on P·E[s-1][g_s];
every layer is a pre-norm Qwen3 block with q/k RMSNorm before RoPE (theta 1e6, positions restart
each frame), GQA 16:8, SwiGLU; Head[s] on the final norm of the last position gives g_{s+1}.
In bf16 it rounds where HF rounds: RMSNorm statistics in fp32, cast back, times the weight in
bf16; RoPE tables computed in fp32 and cast; attention softmax in fp32; logits bf16 -> fp32.

``depth_loop`` returns codes g1..g15, the bf16 Talker sum (E_t[g0] + Σ E[i][g_{i+1}], one
rounding), the KV cache and per-group logits; with ``codes=`` it is teacher-forced (frame tests).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from models.codepredictor_config import QWEN3_TTS_1P7B, CodePredictorConfig
from models.sampler import Sampler


@dataclass
class LayerWeights:
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


@dataclass
class CodePredictorWeights:
    config: CodePredictorConfig
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    proj_w: torch.Tensor  # [hidden, talker_hidden]
    proj_b: torch.Tensor
    embeds: list[torch.Tensor]  # 15 x [vocab, talker_hidden]: E[i] embeds g_{i+1}
    heads: list[torch.Tensor]  # 15 x [vocab, hidden]: Head[i] predicts g_{i+1}
    talker_embed: torch.Tensor  # E_t: the Talker's codec embedding [3072, talker_hidden] (for g0)
    extra: dict = field(default_factory=dict)

    def to(self, device=None, dtype=None) -> "CodePredictorWeights":
        f = (lambda t: t.to(device=device, dtype=dtype))
        return CodePredictorWeights(
            self.config, [LayerWeights(**{k: f(v) for k, v in vars(lw).items()})
                          for lw in self.layers], f(self.final_norm), f(self.proj_w),
            f(self.proj_b), [f(e) for e in self.embeds], [f(h) for h in self.heads],
            f(self.talker_embed))


def random_weights(cfg: CodePredictorConfig = QWEN3_TTS_1P7B, seed: int = 0,
                   dtype=torch.bfloat16, device="cpu", talker_vocab: int = 3072
                   ) -> CodePredictorWeights:
    """Seeded weights at realistic scales: N(0, 0.02) matrices, norms near 1, small bias."""
    g = torch.Generator().manual_seed(seed)

    def mat(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(device=device, dtype=dtype)

    def norm(n):
        return (1 + 0.05 * torch.randn(n, generator=g)).to(device=device, dtype=dtype)

    h, i, th = cfg.hidden, cfg.intermediate, cfg.talker_hidden
    layers = [LayerWeights(mat(cfg.q_dim, h), mat(cfg.kv_dim, h), mat(cfg.kv_dim, h),
                           mat(h, cfg.q_dim), norm(cfg.head_dim), norm(cfg.head_dim), norm(h),
                           norm(h), mat(i, h), mat(i, h), mat(h, i)) for _ in range(cfg.layers)]
    return CodePredictorWeights(
        cfg, layers, norm(h), mat(h, th), mat(h, std=0.01), [mat(cfg.vocab, th, std=0.05)
                                                             for _ in range(cfg.heads_drawn)],
        [mat(cfg.vocab, h) for _ in range(cfg.heads_drawn)], mat(talker_vocab, th, std=0.05))


# Checkpoint names (HF Qwen3TTS talker): suffix after the CodePredictor prefix -> field
_LAYER_KEYS = {
    "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv", "self_attn.o_proj.weight": "wo",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "input_layernorm.weight": "in_norm", "post_attention_layernorm.weight": "post_norm",
    "mlp.gate_proj.weight": "gate", "mlp.up_proj.weight": "up", "mlp.down_proj.weight": "down",
}
CP_PREFIX = "talker.code_predictor."
TALKER_EMBED_KEY = "talker.model.codec_embedding.weight"


def checkpoint_names(cfg: CodePredictorConfig = QWEN3_TTS_1P7B) -> list[str]:
    names = [f"{CP_PREFIX}model.layers.{li}.{k}" for li in range(cfg.layers) for k in _LAYER_KEYS]
    names += [f"{CP_PREFIX}model.norm.weight", f"{CP_PREFIX}small_to_mtp_projection.weight",
              f"{CP_PREFIX}small_to_mtp_projection.bias", TALKER_EMBED_KEY]
    names += [f"{CP_PREFIX}model.codec_embedding.{i}.weight" for i in range(cfg.heads_drawn)]
    names += [f"{CP_PREFIX}lm_head.{i}.weight" for i in range(cfg.heads_drawn)]
    return names


def load_checkpoint(path, cfg: CodePredictorConfig = QWEN3_TTS_1P7B, device="cpu",
                    dtype=torch.bfloat16) -> CodePredictorWeights:
    """The CodePredictor's tensors from a local safetensors file (no hub access)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        have = set(f.keys())
        missing = [n for n in checkpoint_names(cfg) if n not in have]
        if missing:
            raise KeyError(f"{path}: {len(missing)} CodePredictor tensors missing, e.g. "
                           f"{missing[0]}")

        def get(name):
            return f.get_tensor(name).to(device=device, dtype=dtype)

        layers = [LayerWeights(**{field_: get(f"{CP_PREFIX}model.layers.{li}.{k}")
                                  for k, field_ in _LAYER_KEYS.items()})
                  for li in range(cfg.layers)]
        w = CodePredictorWeights(
            cfg, layers, get(f"{CP_PREFIX}model.norm.weight"),
            get(f"{CP_PREFIX}small_to_mtp_projection.weight"),
            get(f"{CP_PREFIX}small_to_mtp_projection.bias"),
            [get(f"{CP_PREFIX}model.codec_embedding.{i}.weight") for i in range(cfg.heads_drawn)],
            [get(f"{CP_PREFIX}lm_head.{i}.weight") for i in range(cfg.heads_drawn)],
            get(TALKER_EMBED_KEY))
    _check_shapes(w)
    return w


def _check_shapes(w: CodePredictorWeights) -> None:
    c = w.config
    want = {"wq": (c.q_dim, c.hidden), "wk": (c.kv_dim, c.hidden), "wo": (c.hidden, c.q_dim),
            "gate": (c.intermediate, c.hidden), "down": (c.hidden, c.intermediate)}
    for li, lw in enumerate(w.layers):
        for k, shape in want.items():
            if tuple(getattr(lw, k).shape) != shape:
                raise ValueError(f"layer {li} {k}: shape {tuple(getattr(lw, k).shape)}, "
                                 f"expected {shape} for this config")


# --- the reference loop ---------------------------------------------------------------------
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def rope_tables(cfg: CodePredictorConfig, positions: torch.Tensor, dtype, device):
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32,
                                                 device=device) / cfg.head_dim))
    f = positions.to(torch.float32).view(-1, 1) * inv.view(1, -1)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


@dataclass
class LoopOutput:
    codes: torch.Tensor  # [R, 15] int64: g1..g15
    talker_sum: torch.Tensor  # [R, talker_hidden] in the loop's dtype
    kv: list  # per layer (K, V): [R, kv_heads, 16, head_dim]
    logits: torch.Tensor  # [R, 15, vocab] fp32


def _layer(x, lw: LayerWeights, cfg, cos, sin, kv_cache, li):
    R, T, _ = x.shape
    a = rms_norm(x, lw.in_norm, cfg.rms_eps)
    q = (a @ lw.wq.T).view(R, T, cfg.q_heads, cfg.head_dim)
    k = (a @ lw.wk.T).view(R, T, cfg.kv_heads, cfg.head_dim)
    v = (a @ lw.wv.T).view(R, T, cfg.kv_heads, cfg.head_dim)
    q = rms_norm(q, lw.q_norm, cfg.rms_eps)
    k = rms_norm(k, lw.k_norm, cfg.rms_eps)
    c, s = cos.view(1, T, 1, -1), sin.view(1, T, 1, -1)
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [R, heads, T, d]
    if kv_cache[li] is None:
        kv_cache[li] = (k, v)
    else:
        kv_cache[li] = (torch.cat([kv_cache[li][0], k], 2), torch.cat([kv_cache[li][1], v], 2))
    K, V = kv_cache[li]
    rep = cfg.q_heads // cfg.kv_heads
    K, V = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)
    L = K.shape[2]
    scores = (q.to(torch.float32) @ K.transpose(-1, -2).to(torch.float32)) * cfg.head_dim ** -0.5
    causal = torch.ones(T, L, dtype=torch.bool, device=x.device).tril(L - T)
    scores = scores.masked_fill(~causal, float("-inf"))
    attn = (torch.softmax(scores, dim=-1).to(x.dtype) @ V).transpose(1, 2).reshape(R, T, -1)
    x = x + attn @ lw.wo.T
    a = rms_norm(x, lw.post_norm, cfg.rms_eps)
    return x + (torch.nn.functional.silu(a @ lw.gate.T) * (a @ lw.up.T)) @ lw.down.T


def depth_loop(w: CodePredictorWeights, h: torch.Tensor, g0: torch.Tensor, *,
               sampler: Sampler | None = None, codes: torch.Tensor | None = None) -> LoopOutput:
    """One frame for R rows. ``h`` [R, talker_hidden] (the Talker's normed hidden), ``g0`` [R].

    With ``codes`` [R, 15] the loop is teacher-forced (the given codes are fed and returned);
    otherwise ``sampler`` draws each group (greedy when no sampler is given).
    """
    cfg = w.config
    dt = w.final_norm.dtype
    R = h.shape[0]
    dev = h.device
    if codes is not None and tuple(codes.shape) != (R, cfg.heads_drawn):
        raise ValueError(f"codes must be [R, {cfg.heads_drawn}], got {tuple(codes.shape)}")
    kv_cache: list = [None] * cfg.layers
    e0 = w.talker_embed[g0]  # [R, talker_hidden]
    x = torch.stack([h.to(dt), e0], dim=1) @ w.proj_w.T + w.proj_b  # pass 0: positions 0, 1
    cos_all, sin_all = rope_tables(cfg, torch.arange(cfg.positions, device=dev), dt, dev)
    out_codes, logits_all, embeds_used = [], [], [e0]
    for s in range(cfg.heads_drawn):
        lo, hi = (0, 2) if s == 0 else (s + 1, s + 2)
        cos, sin = cos_all[lo:hi], sin_all[lo:hi]
        for li, lw in enumerate(w.layers):
            x = _layer(x, lw, cfg, cos, sin, kv_cache, li)
        logits = (rms_norm(x[:, -1], w.final_norm, cfg.rms_eps) @ w.heads[s].T).to(torch.float32)
        logits_all.append(logits)
        if codes is not None:
            g = codes[:, s].to(torch.int64)
        elif sampler is not None:
            g = sampler.sample(logits)
        else:
            g = torch.argmax(logits, dim=-1)
        out_codes.append(g)
        e = w.embeds[s][g]
        embeds_used.append(e)
        if s + 1 < cfg.heads_drawn:
            x = (e @ w.proj_w.T + w.proj_b).view(R, 1, -1)
    talker_sum = torch.stack(embeds_used, dim=1).sum(1)  # one rounding, as HF's sum(1)
    kv = [(k, v) for k, v in kv_cache]
    return LoopOutput(torch.stack(out_codes, 1), talker_sum, kv, torch.stack(logits_all, 1))


class CapturedLoop:
    """The reference loop captured as one CUDA graph for a fixed row bucket.

    Static input buffers (h, g0) are copied in, the graph replays the whole frame (sampling
    included: the counter-based sampler needs no host synchronisation) and the outputs are the
    graph's static tensors. One instance per (weights, rows, sampler).
    """

    def __init__(self, w: CodePredictorWeights, rows: int, sampler: Sampler | None = None):
        if w.final_norm.device.type != "cuda":
            raise ValueError("CapturedLoop needs weights on a CUDA device")
        self.w, self.rows, self.sampler = w, rows, sampler
        dev = w.final_norm.device
        self.h = torch.zeros(rows, w.config.talker_hidden, device=dev, dtype=w.final_norm.dtype)
        self.g0 = torch.zeros(rows, dtype=torch.int64, device=dev)
        offset0 = sampler.offset.clone() if sampler is not None else None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            depth_loop(w, self.h, self.g0, sampler=sampler)  # warm-up outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = depth_loop(w, self.h, self.g0, sampler=sampler)
        if sampler is not None:  # capture and warm-up each advanced the offsets
            sampler.offset.copy_(offset0)

    def __call__(self, h: torch.Tensor, g0: torch.Tensor) -> LoopOutput:
        if h.shape[0] != self.rows:
            raise ValueError(f"this graph is for {self.rows} rows, got {h.shape[0]}")
        self.h.copy_(h)
        self.g0.copy_(g0)
        self.graph.replay()
        return self.out
