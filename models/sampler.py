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

NaN rule: a NaN score is never drawn. :func:`filtered_scores` and :func:`draw` read NaN as -inf
(elementwise, no host synchronisation: captured frames keep the rule). A row left with no
candidate (every score NaN or -inf after the filters) has nothing to draw: :meth:`Sampler.sample`
and models.codepredictor.depth_loop refuse it with a ValueError naming the row (a host check,
skipped while a CUDA graph is being captured), and :func:`draw` itself returns V (no token)
there. The fused draw (kernels/depth/draw.py) cannot raise mid-graph either; it keeps the rule
in greedy mode (NaN never wins, V for a row with no candidate) but not yet in sample mode: its
radix select ranks +NaN above +inf and -NaN below -inf, so a +NaN takes a top-k slot (and a NaN
k-th value, or a -NaN one when k reaches it, leaves no survivor: V), and the "compact" noise
draws the first column of an all -inf row instead of V. A code V is then gathered as a row past
the tables' ends.

Errors: TypeError for a wrong type or dtype, ValueError for a wrong value, shape or device, all
raised before any state changes.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import torch

from models.philox import uniform


@dataclass
class SamplerSettings:
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


INT64_MIN, INT64_MAX = -2**63, 2**63 - 1  # top_k and seeds are stored as int64
# each SamplerSettings field: (its test, what it must be); the float fields are tested as the
# fp32 values the sampler stores (1e39 is inf there, 1e-50 is 0)
_SETTING_RULES = {
    "temperature": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0: greedy)"),
    "top_k": (lambda v: 0 <= v <= INT64_MAX, "an int in [0, 2**63) (0: off)"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "repetition_penalty": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
}


def _as_fp32(v: numbers.Real) -> float:
    """v rounded to fp32 (what the sampler's tensors hold); an int too large for a float is
    +-inf."""
    try:
        f = float(v)
    except OverflowError:
        f = math.inf if v > 0 else -math.inf
    return float(torch.tensor(f, dtype=torch.float32))


def _check_settings(i: int, x) -> None:
    if not isinstance(x, SamplerSettings):
        raise TypeError(f"settings[{i}] must be a SamplerSettings, got {type(x).__name__}")
    for f in fields(SamplerSettings):
        v = getattr(x, f.name)
        ok, want = _SETTING_RULES[f.name]
        kind = numbers.Integral if f.name == "top_k" else numbers.Real
        if isinstance(v, bool) or not isinstance(v, kind):
            raise TypeError(f"settings[{i}].{f.name} = {v!r}; expected {want}")
        stored = v if f.name == "top_k" else _as_fp32(v)
        if not ok(stored):
            in_fp32 = "" if f.name == "top_k" or stored == v else f" ({stored} in fp32)"
            raise ValueError(f"settings[{i}].{f.name} = {v!r}{in_fp32}; expected {want}")


def cpu_or_cuda(device, what: str) -> torch.device:
    """``device`` as a torch.device; ValueError unless it is the CPU or a CUDA device."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a torch device ({e})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {dev}: {what} live on the CPU or a CUDA device")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {dev}: no CUDA GPU is visible to this torch "
                             f"(torch.cuda.is_available() is False); {what} can live on 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {dev}: only {torch.cuda.device_count()} CUDA device(s) "
                             "visible")
    return dev


def _seed_tensor(seeds, rows: int) -> torch.Tensor:
    """seeds as a tensor: a tensor of integers, or a sequence of ints each in int64's range."""
    if seeds is None:
        return torch.arange(rows)
    if not isinstance(seeds, torch.Tensor):
        try:
            seeds = list(seeds)
        except TypeError:
            raise TypeError(f"seeds must be a sequence of {rows} ints or an integer tensor, got "
                            f"{type(seeds).__name__}") from None
        for i, v in enumerate(seeds):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"seeds[{i}] = {v!r}; expected an int")
            if not INT64_MIN <= v <= INT64_MAX:
                raise ValueError(f"seeds[{i}] = {v}; expected an int in [-2**63, 2**63) (int64)")
        if len(seeds) != rows:
            raise ValueError(f"{len(seeds)} seeds for {rows} rows; expected one per row")
        return torch.tensor([int(v) for v in seeds], dtype=torch.int64)
    t = seeds
    if not _is_integer(t):
        raise TypeError(f"seeds have dtype {t.dtype}; expected integers")
    if tuple(t.shape) != (rows,):
        raise ValueError(f"seeds have shape {tuple(t.shape)}; expected one per row: [{rows}]")
    return t


class Sampler:
    """Per-row sampling state on one device.

    Raises (construction): TypeError for rows not an int, a setting of the wrong type or seeds
    that are not integers; ValueError for rows < 1, a settings list of another length, a
    setting out of range (each error names the row and field; top_k and the seeds must fit
    int64, the float settings are checked as fp32), seeds not one per row, or a device that is
    not the CPU or a visible CUDA device.
    """

    def __init__(self, rows: int, settings: SamplerSettings | list[SamplerSettings] | None = None,
                 *, seeds=None, device="cpu", logprobs: bool = False,
                 keep_last_token: bool = False, eager: bool = False):
        if isinstance(rows, bool) or not isinstance(rows, numbers.Integral):
            raise TypeError(f"rows must be an int, got {type(rows).__name__}")
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        rows = int(rows)
        s = list(settings) if isinstance(settings, (list, tuple)) else \
            [settings or SamplerSettings()] * rows
        if len(s) != rows:
            raise ValueError(f"{len(s)} settings for {rows} rows")
        for i, x in enumerate(s):
            _check_settings(i, x)
        dev = cpu_or_cuda(device, "a sampler's tensors")
        seeds = _seed_tensor(seeds, rows)
        self.device = dev
        self.temperature = torch.tensor([x.temperature for x in s], dtype=torch.float32,
                                        device=dev)
        self.top_k = torch.tensor([x.top_k for x in s], dtype=torch.int64, device=dev)
        self.top_p = torch.tensor([x.top_p for x in s], dtype=torch.float32, device=dev)
        self.min_p = torch.tensor([x.min_p for x in s], dtype=torch.float32, device=dev)
        self.penalty = torch.tensor([x.repetition_penalty for x in s], dtype=torch.float32,
                                    device=dev)
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
        """One draw per row from [R, V] logits; advances every row's offset by one.

        ``history`` [R, n]: token ids in [0, V) the repetition penalty applies to. NaN logits
        follow the module's rule. Raises: TypeError for logits not floating or history not
        integer; ValueError for logits not [R, V] (R this sampler's rows) on its device, a bad
        history, or a row with no candidate after the filters (nothing moves then). The value
        checks (history ids, candidates) read on the host; they are skipped while a CUDA graph
        is being captured.
        """
        rows = self.offset.shape[0]
        R, V = check_scores("logits", logits)
        if R != rows:
            raise ValueError(f"logits have {R} rows; this sampler draws for {rows}")
        if logits.device != self.offset.device:
            raise ValueError(f"logits are on {logits.device}; the sampler on {self.offset.device}")
        if history is not None:
            check_per_row("history", history, rows, logits.device, integer=True, dims=2)
            if self.uses["penalty"] and _host_may_read(history) and history.numel() \
                    and not bool(((history >= 0) & (history < V)).all()):
                raise ValueError(f"history holds token ids outside [0, {V})")
        s = filtered_scores(logits, self.temperature, self.top_k,
                            self.top_p if self.uses["top_p"] else None,
                            self.min_p if self.uses["min_p"] else None,
                            self.penalty if self.uses["penalty"] else None, history)
        refuse_undrawable(s, "logits")
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
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        self.offset += n


# --- input checks (shapes, dtypes and devices only: no host synchronisation) ------------------
def _is_integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def check_scores(name: str, t) -> tuple[int, int]:
    """A floating, non-empty 2-D tensor [R, V]; returns (R, V)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: dtype {t.dtype}; expected a floating dtype")
    if t.dim() != 2 or 0 in t.shape:
        raise ValueError(f"{name} must be 2-D [rows, columns], non-empty; got shape "
                         f"{tuple(t.shape)}")
    return t.shape[0], t.shape[1]


def check_per_row(name: str, t, rows: int, device, *, integer: bool, dims: int = 1) -> None:
    """A per-row tensor: integer or floating, ``dims``-D with ``rows`` rows, on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if integer != _is_integer(t) or (not integer and not t.is_floating_point()):
        raise TypeError(f"{name} has dtype {t.dtype}; expected "
                        f"{'an integer' if integer else 'a floating'} dtype")
    if t.dim() != dims or t.shape[0] != rows:
        want = f"[{rows}]" if dims == 1 else f"[{rows}, n]"
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {want}, one per row")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}; expected {device}, with the other inputs")


def _host_may_read(t: torch.Tensor) -> bool:
    """False while a CUDA graph is being captured on t's device (a host read would break it)."""
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


# --- the NaN rule -------------------------------------------------------------------------------
def _nan_as_neg_inf(s: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(s), torch.full_like(s, float("-inf")), s)


def _has_candidate(s: torch.Tensor) -> torch.Tensor:
    """[R] bool: the row has a score above -inf (NaN is no candidate)."""
    return (s > float("-inf")).any(dim=-1)


def refuse_undrawable(scores: torch.Tensor, what: str = "scores") -> None:
    """ValueError naming the rows of ``scores`` with no candidate (every score NaN or -inf).
    Reads on the host: does nothing while a CUDA graph is being captured."""
    if not _host_may_read(scores):
        return
    empty = ~_has_candidate(scores)
    if bool(empty.any()):
        rows = empty.nonzero().view(-1).tolist()
        raise ValueError(f"{what}: row(s) {rows[:8]}{' ...' if len(rows) > 8 else ''} have no "
                         "candidate to draw (every score is NaN or -inf)")


def argmax_candidates(scores: torch.Tensor) -> torch.Tensor:
    """The greedy draw under the NaN rule: each row's first largest non-NaN score, V where
    the row has no candidate. No host synchronisation."""
    s = _nan_as_neg_inf(scores)
    return torch.where(_has_candidate(s), torch.argmax(s, dim=-1), s.shape[-1])


# --- the draw -----------------------------------------------------------------------------------
def filtered_scores(logits, temperature, top_k, top_p=None, min_p=None, penalty=None,
                    history=None, kmax: int | None = None) -> torch.Tensor:
    """fp32 scores after penalty, temperature, top-k (ties kept), top-p and min-p; -inf = out,
    NaN logits included (the NaN rule). A filter passed as None is off (no host
    synchronisation either way). ``kmax`` (>= every row's k; more than V means V) takes the
    k-th value from ``topk(kmax)`` instead of a full sort: the same value.

    Raises: TypeError for logits or a float setting (temperature, top_p, min_p, penalty) not
    floating, top_k or history not integer; ValueError for logits not 2-D [R, V], a per-row
    tensor not [R] (history [R, n]) on the logits' device, kmax < 1.
    """
    R, V = check_scores("logits", logits)
    for name, t, integer in (("temperature", temperature, False), ("top_k", top_k, True),
                             ("top_p", top_p, False), ("min_p", min_p, False),
                             ("penalty", penalty, False)):
        if t is not None or name in ("temperature", "top_k"):
            check_per_row(name, t, R, logits.device, integer=integer)
    if history is not None:
        check_per_row("history", history, R, logits.device, integer=True, dims=2)
    if kmax is not None:
        if isinstance(kmax, bool) or not isinstance(kmax, numbers.Integral) or kmax < 1:
            raise ValueError(f"kmax must be an int >= 1, got {kmax!r}")
        kmax = min(int(kmax), V)
    s = _nan_as_neg_inf(logits.to(torch.float32))
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
    """Gumbel-max over the candidates with Philox uniforms at (seed, offset); greedy where
    T == 0. NaN scores are never drawn; a row with no candidate gives V (no token): callers
    that may read on the host refuse it first (:func:`refuse_undrawable`).

    Raises: TypeError for scores or temperature not floating, seed or offset not integer;
    ValueError for scores not 2-D [R, V] or a per-row tensor not [R] on the scores' device.
    """
    R, V = check_scores("scores", scores)
    check_per_row("temperature", temperature, R, scores.device, integer=False)
    check_per_row("seed", seed, R, scores.device, integer=True)
    check_per_row("offset", offset, R, scores.device, integer=True)
    s = _nan_as_neg_inf(scores)
    u = uniform(seed, offset, V).to(s.device)
    g = -torch.log(-torch.log(u))
    sampled = torch.argmax(s.to(torch.float64) + g, dim=-1)
    tok = torch.where(temperature > 0, sampled, torch.argmax(s, dim=-1))
    return torch.where(_has_candidate(s), tok, V)
