"""A synthetic H3: the DiT-style workload the NVFP4 projections serve (issue #25).

What it keeps from H3: ``blocks`` transformer blocks of width ``hidden``; a fused QKV projection
of width 4·hidden (q | k | v | a per-token attention gate), attention output hidden -> hidden,
FC1 hidden -> mlp, FC2 mlp -> hidden; a gate multiply and a residual add after attention and
after the MLP (adaLN-style per-channel gates); video + audio tokens per step; a 12-step sampler.
Every linear is an :class:`~models.nvfp4_linear.Nvfp4Linear`; attention is torch SDPA in bf16.

Weights are drawn from the seed per (block, role), on the CPU generator (the same bits on every
machine), std 1/sqrt(K) with log-normal per-row gains and a few 8x rows, so activations get the
heavy-tailed channels real DiTs show (fc2's input most of all). Memory: the full config's weights
are ~0.6 GB a block in bf16, so a block's bf16 weights exist only while that block's linears are
quantized; with ``cache=True`` the packed NVFP4 weights (~0.17 GB a block) are kept, else every
call regenerates them. All 50 blocks are never held in bf16 at once. With ``weight_cache`` (a
models.weight_cache.WeightCache) the packed weights also go to disk, and a later process loads
them instead of drawing and quantizing them again (the same bytes).

Models made by :meth:`H3Model.derived` pack nothing themselves: they take the packed weights of
the model they derive from, moved to their device (a device index, ``cuda:1``, is a device of
its own) and put behind their backend, so a model, its legal adversary and its backend under
test pack every weight once between them (the ladder's trajectory pass runs them on up to three
GPUs at once: :meth:`linears` may be called from several threads).
"""
from __future__ import annotations

import hashlib
import math
import threading
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.nvfp4_linear import GPU_BACKENDS, ROLES, Nvfp4Linear, resolve_backend


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# each H3Config field: its least value (every field an int; bools are refused)
_CONFIG_MIN = {"blocks": 1, "hidden": 32, "mlp": 32, "head_dim": 1, "video_tokens": 0,
               "audio_tokens": 0, "steps": 1}
WIDTH_MULTIPLE = 32  # hidden and mlp are an Nvfp4Linear's K: a multiple of 32


@dataclass(frozen=True)
class H3Config:
    """The workload's sizes. Raises (at construction): TypeError for a field that is not an
    int (a bool included); ValueError for a field below its least value (blocks, head_dim,
    steps >= 1; token counts >= 0 with at least one token in all; hidden, mlp >= 32), hidden
    or mlp not a multiple of 32, or hidden not a multiple of head_dim."""
    blocks: int = 50
    hidden: int = 5376
    mlp: int = 14336
    head_dim: int = 128
    video_tokens: int = 33_600
    audio_tokens: int = 4_210
    steps: int = 12

    def __post_init__(self):
        for name, least in _CONFIG_MIN.items():
            v = getattr(self, name)
            if not _is_int(v):
                raise TypeError(f"H3Config.{name} = {v!r}; expected an int >= {least}")
            if v < least:
                raise ValueError(f"H3Config.{name} = {v}; expected an int >= {least}")
        if self.tokens < 1:
            raise ValueError("H3Config has no tokens: video_tokens + audio_tokens must be >= 1")
        for name in ("hidden", "mlp"):
            if getattr(self, name) % WIDTH_MULTIPLE:
                raise ValueError(f"H3Config.{name} = {getattr(self, name)}; expected a multiple "
                                 f"of {WIDTH_MULTIPLE} (the NVFP4 linears' K)")
        if self.hidden % self.head_dim:
            raise ValueError(f"H3Config.hidden = {self.hidden} is not a multiple of head_dim = "
                             f"{self.head_dim} (hidden = heads x head_dim)")

    @property
    def tokens(self) -> int:
        return self.video_tokens + self.audio_tokens

    @property
    def heads(self) -> int:
        return self.hidden // self.head_dim

    def shapes(self) -> dict:
        """role -> (N, K) of its weight."""
        h = self.hidden
        return {"qkv": (4 * h, h), "out": (h, h), "fc1": (self.mlp, h), "fc2": (h, self.mlp)}


FULL = H3Config()
# same structure, CPU-sized: hidden 384 (3 heads of 128), mlp 1024, 3 blocks, 256 tokens
QUICK = H3Config(blocks=3, hidden=384, mlp=1024, video_tokens=192, audio_tokens=64)


def _generator(seed: int, *name) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr((seed, *name)).encode()))


def _check_block(cfg: H3Config, block) -> None:
    if not _is_int(block):
        raise TypeError(f"block must be an int in 0..{cfg.blocks - 1}, got {block!r}")
    if not 0 <= block < cfg.blocks:
        raise ValueError(f"block = {block}; this config's blocks are 0..{cfg.blocks - 1}")


def _check_step(name: str, step, first: int, last: int) -> None:
    if not _is_int(step):
        raise TypeError(f"{name} must be an int in {first}..{last}, got {step!r}")
    if not first <= step <= last:
        raise ValueError(f"{name} = {step}; expected {first}..{last} (the schedule's steps)")


def _device(device) -> torch.device:
    """``device`` ('cpu', 'cuda', 'cuda:N' or a torch.device) checked: ValueError otherwise,
    or for a CUDA device that is not visible."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        d = None
    if d is None or d.type not in ("cpu", "cuda") or (d.type == "cpu" and d.index):
        raise ValueError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {device!r}")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but no CUDA GPU is visible")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA GPUs "
                             "are visible")
    return torch.device("cpu") if d.type == "cpu" else d


def _check_callback(name: str, fn) -> None:
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a callable or None, got {type(fn).__name__}")


def weight(cfg: H3Config, seed: int, block: int, role: str) -> torch.Tensor:
    """bf16 [N, K] weight of ``role`` in ``block``, reproducible from the seed (CPU)."""
    _check_block(cfg, block)
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    N, K = cfg.shapes()[role]
    gen = _generator(seed, "weight", block, role)
    w = torch.randn(N, K, generator=gen) / math.sqrt(K)
    gain = torch.exp(0.5 * torch.randn(N, 1, generator=gen))
    gain[torch.randperm(N, generator=gen)[: max(1, N // 128)]] *= 8.0  # outlier rows
    return (w * gain).to(torch.bfloat16)


def block_vectors(cfg: H3Config, seed: int, block: int) -> dict:
    """Per-channel bf16 vectors of a block: norm gains (heavy-tailed) and the two gates."""
    _check_block(cfg, block)
    gen = _generator(seed, "vectors", block)
    h = cfg.hidden
    norm = torch.exp(0.7 * torch.randn(2, h, generator=gen))
    gates = 0.2 * torch.randn(2, h, generator=gen)
    return {"norm_attn": norm[0].to(torch.bfloat16), "norm_mlp": norm[1].to(torch.bfloat16),
            "gate_attn": gates[0].to(torch.bfloat16), "gate_mlp": gates[1].to(torch.bfloat16)}


def initial_latent(cfg: H3Config, seed: int) -> torch.Tensor:
    """bf16 [tokens, hidden] noise with heavy-tailed channels (log-normal gains, a few 30x)."""
    gen = _generator(seed, "latent")
    gain = torch.exp(torch.randn(cfg.hidden, generator=gen))
    gain[torch.randperm(cfg.hidden, generator=gen)[: max(1, cfg.hidden // 256)]] *= 30.0
    return (torch.randn(cfg.tokens, cfg.hidden, generator=gen) * gain).to(torch.bfloat16)


def _rmsnorm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (y * gain.float()).to(torch.bfloat16)


class H3Model:
    """The workload on one backend. ``wrap(block, role, linear)`` may replace a linear by any
    callable with its signature (the ladder's recorders and perturbed fakes use it).

    Every method checks its arguments before any work: TypeError for a wrong type (a bool is
    not an int) or a latent not bf16; ValueError for a block index outside 0..blocks-1, a step
    outside the schedule, a latent not [tokens, hidden] or not on the model's device.
    """

    def __init__(self, cfg: H3Config = QUICK, seed: int = 0, backend: str = "reference",
                 device="cpu", cache: bool = True, wrap=None, weight_cache=None):
        if not isinstance(cfg, H3Config):
            raise TypeError(f"cfg must be an H3Config, got {type(cfg).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        device = _device(device)
        if not isinstance(cache, bool):
            raise TypeError(f"cache must be True or False, got {cache!r}")
        _check_callback("wrap", wrap)
        self.cfg, self.seed, self.backend = cfg, seed, resolve_backend(backend, None)
        self.device = torch.device("cuda") if self.backend in GPU_BACKENDS and \
            device.type == "cpu" else device
        self.cache, self.wrap, self.weight_cache = cache, wrap, weight_cache
        self._linears: dict = {}
        self._vectors: dict = {}
        self._lock = threading.RLock()  # guards _linears (shared by derived models)
        self._source: H3Model | None = None  # where a derived model takes its weights

    def derived(self, backend: str | None = None, wrap=None, device=None) -> H3Model:
        """A model sharing this one's packed weights, on another backend, wrap and/or device
        (by default this one's). Weights are taken from this model as each block is first
        used (this model packs them if it has not), moved to ``device`` and put behind
        ``backend``; a model on the other device type (CPU vs CUDA, p0 from a CPU model)
        packs its own."""
        m = H3Model(self.cfg, self.seed, backend or self.backend,
                    self.device if device is None else device, self.cache, wrap,
                    self.weight_cache)
        if m.device.type != self.device.type:
            return m
        if m.device == self.device:
            m._vectors = self._vectors
        if m.backend == self.backend and m.device == self.device:
            # one shared cache: what either quantizes, both keep
            m._linears, m._lock = self._linears, self._lock
        else:
            m._source = self
        return m

    def _packed(self, block: int) -> dict:
        """role -> the unwrapped Nvfp4Linear of ``block``, packed (or taken from the source
        model, or loaded from the weight cache) once however many threads ask."""
        lin = self._linears.get(block)
        if lin is not None:
            return lin
        with self._lock:
            lin = self._linears.get(block)
            if lin is None:
                lin = self._pack(block)
                if self.cache:
                    self._linears[block] = lin
        return lin

    def _pack(self, block: int) -> dict:
        if self._source is not None:
            return {r: l.to(self.device).with_backend(self.backend)
                    for r, l in self._source._packed(block).items()}

        def make(r):
            return Nvfp4Linear(weight(self.cfg, self.seed, block, r).to(self.device),
                               backend=self.backend, role=r)

        if self.weight_cache is None:
            return {r: make(r) for r in ROLES}
        return {r: self.weight_cache.linear(self.cfg, self.seed, block, r, self.device,
                                            self.backend, lambda r=r: make(r)) for r in ROLES}

    def _check_latent(self, name: str, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.bfloat16:
            raise TypeError(f"{name} has dtype {x.dtype}; expected torch.bfloat16")
        want = (self.cfg.tokens, self.cfg.hidden)
        if tuple(x.shape) != want:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; expected [tokens, hidden] = "
                             f"{list(want)}")
        if x.device.type != self.device.type or (
                self.device.index is not None and x.device.index != self.device.index):
            raise ValueError(f"{name} is on {x.device}; the model is on {self.device}")

    def linears(self, block: int) -> dict:
        """role -> Nvfp4Linear of ``block``; its bf16 weights live only while quantizing."""
        _check_block(self.cfg, block)
        lin = self._packed(block)
        if self.wrap is None:
            return lin
        return {r: self.wrap(block, r, lin[r]) for r in ROLES}

    def vectors(self, block: int) -> dict:
        _check_block(self.cfg, block)
        if block not in self._vectors:
            self._vectors[block] = {k: v.to(self.device) for k, v in
                                    block_vectors(self.cfg, self.seed, block).items()}
        return self._vectors[block]

    def block(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """One transformer block on bf16 [tokens, hidden]."""
        _check_block(self.cfg, i)
        self._check_latent("x", x)
        lin, vec = self.linears(i), self.vectors(i)
        T, h = x.shape
        q, k, v, gate = lin["qkv"](_rmsnorm(x, vec["norm_attn"])).split(h, dim=1)
        # [1, heads, T, head_dim]: 4-D, so CUDA takes a fused (flash) kernel; the math
        # fallback would materialise heads x T x T scores (224 GiB at the full config)
        heads = [t.reshape(T, self.cfg.heads, self.cfg.head_dim).transpose(0, 1)[None]
                 for t in (q, k, v)]
        a = F.scaled_dot_product_attention(*heads)[0].transpose(0, 1).reshape(T, h)
        a = (a.float() * torch.sigmoid(gate.float())).to(torch.bfloat16)
        # the gated residual adds ride in the projections' epilogue (P4 on p0; the reference
        # applies numerics.epilogue.gate_residual after its exact GEMM: the same bits)
        x = lin["out"](a, gate=vec["gate_attn"], residual=x)
        f = F.gelu(lin["fc1"](_rmsnorm(x, vec["norm_mlp"])).float(), approximate="tanh")
        return lin["fc2"](f.to(torch.bfloat16), gate=vec["gate_mlp"], residual=x)

    def denoiser_step(self, latent: torch.Tensor, step: int, on_block=None) -> torch.Tensor:
        """The velocity v for ``latent`` at ``step``: every block, then a plain RMS norm.
        ``on_block(i, x_in, x_out)`` sees every block's input and output."""
        _check_callback("on_block", on_block)
        x = self.embed(latent, step)
        for i in range(self.cfg.blocks):
            y = self.block(i, x)
            if on_block is not None:
                on_block(i, x, y)
            x = y
        return self.head(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The velocity from the last block's output: a plain RMS norm (public so that a
        caller stepping block by block, the ladder's resumable pass, ends a step the same)."""
        return _rmsnorm(x, torch.ones(x.shape[1], device=x.device))

    def embed(self, latent: torch.Tensor, step: int) -> torch.Tensor:
        """Block 0's input: the latent plus a sinusoidal embedding of sigma, in bf16."""
        _check_step("step", step, 0, self.cfg.steps - 1)
        self._check_latent("latent", latent)
        return (latent.float() + self._time_embedding(step)).to(torch.bfloat16)

    def _time_embedding(self, step: int) -> torch.Tensor:
        h = self.cfg.hidden
        freqs = torch.exp(-math.log(1e4) * torch.arange(h // 2, dtype=torch.float32) / (h // 2))
        t = self.sigma(step) * 1000.0 * freqs
        return torch.cat([t.sin(), t.cos()]).to(self.device)

    def sigma(self, step: int) -> float:
        """Linear flow-matching schedule: sigma 1 -> 0 over ``cfg.steps`` steps."""
        _check_step("step", step, 0, self.cfg.steps)
        return 1.0 - step / self.cfg.steps

    def sampler_update(self, latent, v, step: int) -> torch.Tensor:
        """Euler step latent + (sigma_{t+1} - sigma_t)·v, in fp32, rounded once to bf16."""
        _check_step("step", step, 0, self.cfg.steps - 1)
        self._check_latent("latent", latent)
        self._check_latent("v", v)
        d = self.sigma(step + 1) - self.sigma(step)
        return (latent.float() + d * v.float()).to(torch.bfloat16)

    def trajectory(self, steps: int | None = None, latent=None, on_step=None) -> torch.Tensor:
        """The final latent after ``steps`` sampler steps (default cfg.steps) from the seed's
        noise (or ``latent``, bf16 [tokens, hidden]); ``on_step(step, latent)`` sees every
        step's result."""
        steps = self.cfg.steps if steps is None else steps
        _check_step("steps", steps, 1, self.cfg.steps)
        _check_callback("on_step", on_step)
        if latent is not None:
            self._check_latent("latent", latent)
        x = initial_latent(self.cfg, self.seed).to(self.device) if latent is None else latent
        for step in range(steps):
            x = self.sampler_update(x, self.denoiser_step(x, step), step)
            if on_step is not None:
                on_step(step, x)
        return x


def checksum(latent: torch.Tensor) -> dict:
    """sha256 of the latent's bf16 bytes (row-major) and a float summary of its values."""
    t = latent.detach().to("cpu", torch.bfloat16).contiguous()
    digest = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
    f = t.double()
    return {"sha256": digest, "shape": list(t.shape), "mean": float(f.mean()),
            "rms": float(f.pow(2).mean().sqrt()), "absmax": float(f.abs().max()),
            "finite": bool(torch.isfinite(f).all())}
