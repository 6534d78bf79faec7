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

import os
from dataclasses import dataclass, field

import torch

from configs.codepredictor import QWEN3_TTS_1P7B, CodePredictorConfig, LoopOutput
from numerics.rmsnorm import rms_apply
from models.sampler import (Sampler, argmax_candidates, check_per_row, check_scores,
                            cpu_or_cuda, refuse_undrawable)


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
    talker_embed: torch.Tensor  # E_t: the Talker's codec embedding [talker_vocab, talker_hidden]
    extra: dict = field(default_factory=dict)

    def to(self, device=None, dtype=None) -> "CodePredictorWeights":
        f = (lambda t: t.to(device=device, dtype=dtype))
        return CodePredictorWeights(
            self.config, [LayerWeights(**{k: f(v) for k, v in vars(lw).items()})
                          for lw in self.layers], f(self.final_norm), f(self.proj_w),
            f(self.proj_b), [f(e) for e in self.embeds], [f(h) for h in self.heads],
            f(self.talker_embed))


def random_weights(cfg: CodePredictorConfig = QWEN3_TTS_1P7B, seed: int = 0,
                   dtype=torch.bfloat16, device="cpu", talker_vocab: int | None = None
                   ) -> CodePredictorWeights:
    """Seeded weights at realistic scales: N(0, 0.02) matrices, norms near 1, small bias; the
    Talker's codec embedding has ``talker_vocab`` rows (None: the config's)."""
    talker_vocab = cfg.talker_vocab if talker_vocab is None else talker_vocab
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
TALKER_ROWS_ANY = -1  # checkpoint_shapes' row count of the Talker's codec embedding


def checkpoint_shapes(cfg: CodePredictorConfig = QWEN3_TTS_1P7B) -> dict[str, tuple]:
    """Each CodePredictor tensor's checkpoint name -> its shape for ``cfg``. The Talker's codec
    embedding has TALKER_ROWS_ANY rows: any count of at least ``vocab`` loads (the 1.7B
    checkpoint's is the config's ``talker_vocab``; the frame kernel takes only that)."""
    c = cfg
    layer = {"wq": (c.q_dim, c.hidden), "wk": (c.kv_dim, c.hidden), "wv": (c.kv_dim, c.hidden),
             "wo": (c.hidden, c.q_dim), "q_norm": (c.head_dim,), "k_norm": (c.head_dim,),
             "in_norm": (c.hidden,), "post_norm": (c.hidden,), "gate": (c.intermediate, c.hidden),
             "up": (c.intermediate, c.hidden), "down": (c.hidden, c.intermediate)}
    shapes = {f"{CP_PREFIX}model.layers.{li}.{k}": layer[f] for li in range(c.layers)
              for k, f in _LAYER_KEYS.items()}
    shapes[f"{CP_PREFIX}model.norm.weight"] = (c.hidden,)
    shapes[f"{CP_PREFIX}small_to_mtp_projection.weight"] = (c.hidden, c.talker_hidden)
    shapes[f"{CP_PREFIX}small_to_mtp_projection.bias"] = (c.hidden,)
    shapes[TALKER_EMBED_KEY] = (TALKER_ROWS_ANY, c.talker_hidden)
    for i in range(c.heads_drawn):
        shapes[f"{CP_PREFIX}model.codec_embedding.{i}.weight"] = (c.vocab, c.talker_hidden)
    for i in range(c.heads_drawn):
        shapes[f"{CP_PREFIX}lm_head.{i}.weight"] = (c.vocab, c.hidden)
    return shapes


def checkpoint_names(cfg: CodePredictorConfig = QWEN3_TTS_1P7B) -> list[str]:
    return list(checkpoint_shapes(cfg))


def _check_entries(path, f, cfg: CodePredictorConfig) -> None:
    """Every CodePredictor tensor present, floating, of its shape: from the header alone."""
    have = set(f.keys())
    missing = [n for n in checkpoint_names(cfg) if n not in have]
    if missing:
        raise KeyError(f"{path}: {len(missing)} CodePredictor tensors missing, e.g. "
                       f"{missing[0]}")
    for name, want in checkpoint_shapes(cfg).items():
        entry = f.get_slice(name)
        kind, shape = entry.get_dtype(), tuple(entry.get_shape())
        if not kind.startswith(("F", "BF")):  # safetensors names: F32, BF16, F8_E4M3, I32, ...
            raise TypeError(f"{path}: {name} has dtype {kind}; expected a floating dtype")
        if want[0] == TALKER_ROWS_ANY:
            ok = len(shape) == 2 and shape[0] >= cfg.vocab and shape[1] == want[1]
            want = f"[>= {cfg.vocab}, {want[1]}]"
        else:
            ok = shape == want
        if not ok:
            raise ValueError(f"{path}: {name} has shape {list(shape)}; expected {want} for "
                             "this config")


def load_checkpoint(path, cfg: CodePredictorConfig = QWEN3_TTS_1P7B, device="cpu",
                    dtype=torch.bfloat16) -> CodePredictorWeights:
    """The CodePredictor's tensors from a local safetensors file (no hub access), every one
    checked against ``cfg`` from the file's header before any is read.

    Raises (each naming the file, and the tensor where one is at fault): FileNotFoundError when
    no file is at ``path``; ValueError for a file that is not readable safetensors (truncated,
    say), a tensor of the wrong shape or a device that is not the CPU or CUDA; KeyError for a
    missing tensor; TypeError for a tensor that is not floating, ``dtype`` not a floating torch
    dtype, ``cfg`` not a CodePredictorConfig or ``path`` not a path.
    """
    # here, not at the top: safetensors is optional (the test extra), needed by the loader alone
    from safetensors import SafetensorError, safe_open

    if not isinstance(cfg, CodePredictorConfig):
        raise TypeError(f"cfg must be a CodePredictorConfig, got {type(cfg).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype {dtype!r}: expected a floating torch dtype")
    dev = cpu_or_cuda(device, "the weights")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no checkpoint file there")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            _check_entries(path, f, cfg)

            def get(name):
                return f.get_tensor(name).to(device=dev, dtype=dtype)

            layers = [LayerWeights(**{field_: get(f"{CP_PREFIX}model.layers.{li}.{k}")
                                      for k, field_ in _LAYER_KEYS.items()})
                      for li in range(cfg.layers)]
            return CodePredictorWeights(
                cfg, layers, get(f"{CP_PREFIX}model.norm.weight"),
                get(f"{CP_PREFIX}small_to_mtp_projection.weight"),
                get(f"{CP_PREFIX}small_to_mtp_projection.bias"),
                [get(f"{CP_PREFIX}model.codec_embedding.{i}.weight")
                 for i in range(cfg.heads_drawn)],
                [get(f"{CP_PREFIX}lm_head.{i}.weight") for i in range(cfg.heads_drawn)],
                get(TALKER_EMBED_KEY))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None


# --- the reference loop ---------------------------------------------------------------------
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    return rms_apply(x, w, torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def rope_tables(cfg: CodePredictorConfig, positions: torch.Tensor, dtype, device):
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32,
                                                 device=device) / cfg.head_dim))
    f = positions.to(torch.float32).view(-1, 1) * inv.view(1, -1)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


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
    otherwise ``sampler`` draws each group (greedy when no sampler is given). NaN logits follow
    models.sampler's rule: never drawn, and a row with no candidate (every logit NaN or -inf)
    is refused with a ValueError naming the group and row (not while a CUDA graph captures).

    Raises: TypeError for h not floating or g0 / codes not integer; ValueError for h not
    [R, talker_hidden], g0 not [R] or codes not [R, 15] on h's device, or a row with nothing
    to draw.
    """
    cfg = w.config
    dt = w.final_norm.dtype
    check_scores("h", h)
    if h.shape[1] != cfg.talker_hidden:
        raise ValueError(f"h must be [R, {cfg.talker_hidden}], got {tuple(h.shape)}")
    R = h.shape[0]
    dev = h.device
    check_per_row("g0", g0, R, dev, integer=True)
    if codes is not None:
        check_per_row("codes", codes, R, dev, integer=True, dims=2)
        if codes.shape[1] != cfg.heads_drawn:
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
        else:
            refuse_undrawable(logits, f"group {s + 1} logits")
            g = sampler.sample(logits) if sampler is not None else argmax_candidates(logits)
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

    The NaN rule holds in the graph (NaN logits are never drawn), but its refusal is a host
    check, run at the warm-up only: on replay a row with no candidate draws V, and gathering
    embedding row V fails as an out-of-range index (a device-side assert), not with a ValueError.
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
