"""The sampler as a resource: per-row settings, counter-based draws, and the fused-draw contract.

Semantics per row (as transformers' ``_sample`` with the CodePredictor's warpers, §4 of the
model notes): optional repetition penalty over the row's history, ``s = fp32(logits) / T``,
top-k keeping ties at the k-th value, top-p (sort, cumulative softmax, drop the tail, keep one),
min-p, then one categorical draw. T == 0 is greedy (argmax).

The draw is Gumbel-max over the survivors with uniforms from Philox4x32-10 keyed by the row's
seed and counted by its offset (models.philox), so a row's code depends on its own seed and offset
only, never on the batch around it. Each ``sample()`` moves every row's offset by one.

A kernel that draws in place asks :meth:`Sampler.fused_draw_args` for the per-row tensors
(temperature, top-k, top-p, seed, offset) and, after its launch, calls
:meth:`Sampler.advance_offsets` with the number of draws it made. ``fused_draw_args`` returns None
whenever a step needs more than one plain draw per row: an eager step, a repetition penalty,
min-p, logprobs, a kept last token, or a CPU sampler.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from models.philox import uniform


@dataclass
class SamplerSettings:
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


class Sampler:
    def __init__(self, rows: int, settings: SamplerSettings | list[SamplerSettings] | None = None,
                 *, seeds=None, device="cpu", logprobs: bool = False,
                 keep_last_token: bool = False, eager: bool = False):
        s = settings if isinstance(settings, list) else [settings or SamplerSettings()] * rows
        if len(s) != rows:
            raise ValueError(f"{len(s)} settings for {rows} rows")
        for x in s:
            if x.temperature < 0 or x.top_k < 0 or not 0 < x.top_p <= 1 or not 0 <= x.min_p < 1 \
                    or x.repetition_penalty <= 0:
                raise ValueError(f"invalid sampler settings {x}")
        dev = torch.device(device)
        self.device = dev
        self.temperature = torch.tensor([x.temperature for x in s], dtype=torch.float32,
                                        device=dev)
        self.top_k = torch.tensor([x.top_k for x in s], dtype=torch.int64, device=dev)
        self.top_p = torch.tensor([x.top_p for x in s], dtype=torch.float32, device=dev)
        self.min_p = torch.tensor([x.min_p for x in s], dtype=torch.float32, device=dev)
        self.penalty = torch.tensor([x.repetition_penalty for x in s], dtype=torch.float32,
                                    device=dev)
        seeds = torch.arange(rows) if seeds is None else torch.as_tensor(seeds)
        self.seed = seeds.to(torch.int64).to(dev)
        self.offset = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.logprobs_enabled = logprobs
        self.logprob_buf = torch.zeros(rows, device=dev) if logprobs else None
        self.keep_last_token = keep_last_token
        self.eager = eager
        # which filters any row uses, fixed at construction so sample() never syncs the host
        # (a captured CUDA graph can call it)
        self.uses = {"top_p": any(x.top_p < 1 for x in s), "min_p": any(x.min_p > 0 for x in s),
                     "penalty": any(x.repetition_penalty != 1 for x in s)}

    def rows_view(self, start: int, stop: int) -> "Sampler":
        """A sampler over rows [start, stop) sharing this one's per-row tensors (views): its
        draws and ``advance_offsets`` act on those rows of this sampler."""
        if not 0 <= start < stop <= self.offset.shape[0]:
            raise ValueError(f"rows [{start}, {stop}) outside 0..{self.offset.shape[0]}")
        view = object.__new__(Sampler)
        view.__dict__.update(self.__dict__)
        for name in ("temperature", "top_k", "top_p", "min_p", "penalty", "seed", "offset",
                     "logprob_buf"):
            t = getattr(self, name)
            setattr(view, name, None if t is None else t[start:stop])
        return view

    # --- the plain per-call path --------------------------------------------------------------
    def sample(self, logits: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """One draw per row from [R, V] logits; advances every row's offset by one."""
        s = filtered_scores(logits, self.temperature, self.top_k,
                            self.top_p if self.uses["top_p"] else None,
                            self.min_p if self.uses["min_p"] else None,
                            self.penalty if self.uses["penalty"] else None, history)
        tok = draw(s, self.temperature, self.seed, self.offset)
        if self.logprob_buf is not None:
            lp = torch.log_softmax(s, dim=-1).gather(1, tok.view(-1, 1)).view(-1)
            self.logprob_buf.copy_(torch.where(self.temperature > 0, lp, torch.zeros_like(lp)))
        self.offset += 1
        return tok

    # --- the fused-draw contract ------------------------------------------------------------
    def fused_draw_args(self) -> dict | None:
        """Per-row tensors for an in-kernel draw, or None when one plain draw would not do."""
        if (self.eager or self.device.type == "cpu" or self.logprob_buf is not None
                or self.logprobs_enabled or self.keep_last_token
                or self.uses["penalty"] or self.uses["min_p"]):
            return None
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "seed": self.seed, "offset": self.offset}

    def advance_offsets(self, n: int) -> None:
        """After a kernel made ``n`` draws per row in place, move offsets as n sample() calls."""
        if n < 0:
            raise ValueError("n must be >= 0")
        self.offset += n


def filtered_scores(logits, temperature, top_k, top_p=None, min_p=None, penalty=None,
                    history=None, kmax: int | None = None) -> torch.Tensor:
    """fp32 scores after penalty, temperature, top-k (ties kept), top-p and min-p; -inf = out.
    A filter passed as None is off (no host synchronisation either way). ``kmax`` (>= every
    row's k) takes the k-th value from ``topk(kmax)`` instead of a full sort: the same value."""
    s = logits.to(torch.float32).clone()
    R, V = s.shape
    if penalty is not None and history is not None:
        seen = torch.zeros_like(s, dtype=torch.bool).scatter_(1, history.to(torch.int64), True)
        p = penalty.view(-1, 1)
        s = torch.where(seen, torch.where(s > 0, s / p, s * p), s)
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).view(-1, 1)
    s = s / t
    k = torch.clamp(top_k, 0, V)
    k = torch.where(k == 0, torch.full_like(k, V), k)
    if kmax is None:
        kth = torch.sort(s, dim=-1, descending=True).values.gather(1, (k - 1).view(-1, 1))
    else:
        kth = torch.topk(s, kmax, dim=-1).values.gather(1, (torch.clamp(k, max=kmax) - 1)
                                                        .view(-1, 1))
    s = torch.where(s < kth, torch.full_like(s, float("-inf")), s)  # ties at the k-th survive
    if top_p is not None:
        srt, idx = torch.sort(s, dim=-1)  # ascending, as transformers' TopPLogitsWarper
        cum = torch.softmax(srt, dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - top_p.view(-1, 1))
        remove[:, -1] = False  # keep at least one
        remove = torch.where(top_p.view(-1, 1) < 1, remove, torch.zeros_like(remove))
        s = s.scatter(1, idx, torch.where(remove, torch.full_like(srt, float("-inf")), srt))
    if min_p is not None:
        pr = torch.softmax(s, dim=-1)
        s = torch.where(pr < min_p.view(-1, 1) * pr.max(dim=-1, keepdim=True).values,
                        torch.full_like(s, float("-inf")), s)
    return s


def draw(scores: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor,
         offset: torch.Tensor) -> torch.Tensor:
    """Gumbel-max over finite scores with Philox uniforms at (seed, offset); greedy where T == 0."""
    u = uniform(seed, offset, scores.shape[1]).to(scores.device)
    g = -torch.log(-torch.log(u))
    noisy = scores.to(torch.float64) + g
    sampled = torch.argmax(noisy, dim=-1)
    greedy = torch.argmax(scores, dim=-1)
    return torch.where(temperature > 0, sampled, greedy)
