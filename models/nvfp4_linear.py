"""``Nvfp4Linear`` (P3): y = x · Wᵀ with both operands in NVFP4, as H3 computes every projection.

The weight is quantized once (numerics.nvfp4.quantize, its own global amax -> g_w); the input is
quantized on every call (global amax -> g_x -> packed activation, the exact two-phase recipe of
the streaming design), then D = RN_bf16(g_x·g_w · Σ_k a_k w_k).

Backends (all consume the same packed weight, so they differ only in the GEMM):
* ``reference``: exact math on the tensors' device (CPU or CUDA): the oracle's integer sums,
  alpha, one correct bf16 rounding (numerics.gemm_oracle); :meth:`Nvfp4Linear.oracle` also
  returns the proven per-element bound any fp32-accumulating kernel must meet.
* ``p0``: kernels.nvfp4 amax + quantize_expand_nvfp4 (the packed activation and its exact f16
  expansion) + gemm_nvfp4 on the f16 builds (``a16``) on an sm_90 GPU.
* ``p2``: P2's bounded ring (kernels/nvfp4/ring.py): the same amax and g, then the rows in
  chunks of ``ring_capacity`` rows, each quantized and expanded into the ring and multiplied
  there with the whole call's GEMM config (p0's, from the same helper), so its output is
  bit-identical to p0's; except where p0's whole call runs stream-K and the ring needs several
  chunks (stream-K's bits depend on the whole call's tile count): there p2 runs the tile loop.
* ``p1``: P1 (kernels/nvfp4/gemm_p1.py): the same amax and g, then one GEMM that quantizes
  its activation tiles itself (no packed activation, scale or f16 expansion in memory); its
  bits are p0's wherever p0 runs the swap-AB f16 build without stream-K, else those of the
  swap-AB build on the packed activation (gemm_p1.choose_config).
With ``gate`` and ``residual`` a call returns H3's gated residual add of its output,
numerics.epilogue.gate_residual(y, gate, residual): ``reference`` computes it after the exact
GEMM, ``p0``, ``p1`` and ``p2`` fuse it into the GEMM's store (P4, epilogues/gate_residual.py),
bit-identical.
FC2 is pinned to p0 whatever streamed backend is asked for: the seed keeps FC2 off the streamed
producers (its K = 14336 reduction contract), so only QKV, out and FC1 would stream.
A backend this machine cannot run is refused at construction, never replaced by another.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from numerics import gemm_oracle as G
from numerics import nvfp4
from numerics.epilogue import gate_residual
from schedules.p2_ring import DEFAULT_CAPACITY, check_capacity
from workbench import WorkbenchError

BACKENDS = ("reference", "p0", "p1", "p2")
ROLES = ("qkv", "out", "fc1", "fc2")  # H3's projections; a linear's role is one of them or None
NOT_BUILT: dict = {}  # backend -> why it is refused (every backend is built)
STREAMED = ("p1", "p2")  # backends that change the A producer: FC2 never takes them
GPU_BACKENDS = ("p0", "p1", "p2")  # backends that run the CuTe DSL kernels (weights on CUDA)
PINNED_TO_P0 = ("fc2",)  # roles that never stream (seed: "FC2 remains explicitly on ... P0")
ROW_TILE = 128  # a row slice starts on a 128-row scale tile, as gemm_nvfp4's ``rows``
# the oracle's int64 weight (8 bytes an element) is kept only for weights up to this size: a
# full H3 block's would be 2.4 GB, recomputed per call instead (cheap beside its matmuls)
W_INT_CACHE_MAX = 1 << 22
CHUNK_ELEMENTS = 1 << 26  # the oracle's rows a chunk: this many over max(N, K)


class Audit(NamedTuple):
    """What :meth:`Nvfp4Linear.audit` gives a check: ``d`` the correctly rounded output (bf16
    [M, N]); ``at`` the flat indices (ascending, row-major) where the output checked is not d
    bit for bit or d is not finite, and there ``real`` the exact result alpha·S and ``bound``
    the oracle's proven bound (float64, the values :meth:`Nvfp4Linear.oracle` has there)."""
    d: torch.Tensor
    at: torch.Tensor
    real: torch.Tensor
    bound: torch.Tensor


class BackendUnavailable(WorkbenchError):
    """The requested backend cannot run on this machine (or is not built yet)."""


def p0_unavailable_reason() -> str | None:
    """Why the p0 backend cannot run here (no CUDA, not sm_90, no CuTe DSL), or None."""
    if not torch.cuda.is_available():
        return "the p0 backend needs a CUDA GPU (none visible)"
    cc = torch.cuda.get_device_capability(0)
    if cc != (9, 0):
        return f"the p0 backend needs an sm_90 (Hopper) GPU; GPU 0 is sm_{cc[0]}{cc[1]}"
    try:
        import cutlass  # noqa: F401  # the probe itself: is CuTe DSL importable here?
    except ImportError as e:
        return f"the p0 backend needs CuTe DSL (nvidia-cutlass-dsl): {e}"
    return None


def resolve_backend(backend: str, role: str | None) -> str:
    """The backend a linear of ``role`` really runs (FC2 pinned to p0); raises for an unknown
    role, an unknown or unbuilt backend, or one this machine cannot run."""
    if role is not None and not isinstance(role, str):
        raise TypeError(f"role must be None or one of {ROLES}, got {role!r}")
    if role is not None and role not in ROLES:
        raise ValueError(f"role must be None or one of {ROLES}, got {role!r}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend in STREAMED and role in PINNED_TO_P0:
        backend = "p0"
    if backend in NOT_BUILT:
        raise BackendUnavailable(f"backend {backend!r} refused: {NOT_BUILT[backend]}")
    if backend in GPU_BACKENDS:
        reason = p0_unavailable_reason()
        if reason:  # p2 runs p0's kernels: the same needs, said in p2's name
            raise BackendUnavailable(reason.replace("the p0 backend", f"the {backend} backend"))
    return backend


def _check_rows(rows, M: int) -> tuple[int, int]:
    if rows is None:
        return 0, M
    if (not isinstance(rows, (tuple, list)) or len(rows) != 2
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in rows)):
        raise TypeError(f"rows must be a pair of ints (r0, r1), got {rows!r}")
    r0, r1 = rows
    if not 0 <= r0 < r1 <= M:
        raise ValueError(f"rows = ({r0}, {r1}) must satisfy 0 <= r0 < r1 <= M = {M}")
    if r0 % ROW_TILE:
        raise ValueError(f"rows start r0 = {r0} must be a multiple of {ROW_TILE}")
    return r0, r1


class Nvfp4Linear:
    """A bias-free NVFP4 linear layer: weight bf16 [N, K] (N a multiple of 16, K of 32)."""

    def __init__(self, weight: torch.Tensor, *, backend: str = "reference",
                 role: str | None = None, ring_capacity: int = DEFAULT_CAPACITY):
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
        if weight.dtype != torch.bfloat16:
            raise TypeError(f"weight has dtype {weight.dtype}; expected torch.bfloat16")
        if weight.dim() != 2 or weight.shape[0] % 16 or weight.shape[1] % 32 or not weight.numel():
            raise ValueError(f"weight has shape {tuple(weight.shape)}; expected 2-D [N, K] with "
                             "N a multiple of 16 and K a multiple of 32")
        if weight.device.type not in ("cpu", "cuda"):
            raise ValueError(f"weight is on {weight.device}; expected a CPU or CUDA tensor")
        if not bool(torch.isfinite(weight).all()):
            raise ValueError("weight holds NaN or inf; its tensor scale would not be finite")
        check_capacity(ring_capacity)  # p2's ring rows; kept by every backend (with_backend)
        self.backend = resolve_backend(backend, role)
        self.role, self.ring_capacity = role, ring_capacity
        self.N, self.K = weight.shape
        device = "cuda" if self.backend in GPU_BACKENDS else weight.device
        w = weight.to(device)
        self.g_w = float(nvfp4.global_scale(w))
        self.w_q, self.w_s = nvfp4.quantize(w, self.g_w)
        self._w_int = None  # the oracle's integer weight, made on first reference use
        self._w_pre = None  # the register-order prepack (p0's swap-AB design), made on first use
        self._g_w_dev = None  # g_w as a device fp32 [1] (p0's GEMM reads it), made on first use
        self._plans: dict = {}  # p0's checked call signatures -> _P0Plan (see _p0_key)
        self._last = (None, None)  # the last (signature, plan): compared before any hashing

    @property
    def device(self) -> torch.device:
        return self.w_q.device

    def release_scratch(self) -> None:
        """Drop this linear's checked call plans and every shared p0 activation scratch set, so
        that its next call allocates afresh: what a memory measurement of one cold call needs
        (a set another linear's plan still holds stays alive with that plan)."""
        self._plans, self._last = {}, (None, None)
        _ACT_SCRATCH.clear()

    def packed(self) -> dict:
        """What the constructor made from the weight, all a linear needs (models.weight_cache
        stores it): {"w_q", "w_s", "g_w"}."""
        return {"w_q": self.w_q, "w_s": self.w_s, "g_w": self.g_w}

    @classmethod
    def from_packed(cls, w_q: torch.Tensor, w_s: torch.Tensor, g_w: float, *,
                    backend: str = "reference", role: str | None = None) -> Nvfp4Linear:
        """The linear whose :meth:`packed` is (w_q, w_s, g_w): the constructor without the
        quantization, on the tensors' device (p0's: CUDA). ValueError for a pair that is
        not an NVFP4 weight (uint8 [N, K/2] codes, float8_e4m3fn swizzled scales)."""
        N, K = (w_q.shape[0], 2 * w_q.shape[1]) if w_q.dim() == 2 else (0, 0)
        if (w_q.dtype != torch.uint8 or not N or N % 16 or not K or K % 32
                or w_s.dtype != torch.float8_e4m3fn
                or tuple(w_s.shape) != nvfp4.scale_shape(N, K)):
            raise ValueError(f"not a packed NVFP4 weight: codes {w_q.dtype} "
                             f"{tuple(w_q.shape)}, scales {w_s.dtype} {tuple(w_s.shape)}")
        new = object.__new__(cls)
        new.backend = resolve_backend(backend, role)
        new.role, new.N, new.K, new.g_w = role, N, K, float(g_w)
        new.ring_capacity = DEFAULT_CAPACITY
        if new.backend in GPU_BACKENDS and w_q.device.type != "cuda":
            w_q, w_s = w_q.cuda(), w_s.cuda()
        new.w_q, new.w_s = w_q, w_s
        new._w_int = new._w_pre = new._g_w_dev = None
        new._plans, new._last = {}, (None, None)
        return new

    def to(self, device) -> Nvfp4Linear:
        """The same packed weight on ``device`` (self when it is there already); what is made
        lazily from it (the oracle's integers, the prepack) is made again there."""
        device = torch.device(device)
        if self.device == device or (device.index is None and self.device.type == device.type):
            return self
        if self.backend in GPU_BACKENDS and device.type != "cuda":
            raise ValueError(f"a {self.backend} linear lives on a CUDA device, not {device}")
        new = object.__new__(Nvfp4Linear)
        new.__dict__.update(self.__dict__)
        new.w_q, new.w_s = self.w_q.to(device), self.w_s.to(device)
        new._w_int = new._w_pre = new._g_w_dev = None
        new._plans, new._last = {}, (None, None)  # p0's scratch lives on the old device
        return new

    def with_backend(self, backend: str) -> Nvfp4Linear:
        """The same packed weight behind another backend (moved to its device if needed)."""
        new = object.__new__(Nvfp4Linear)
        new.__dict__.update(self.__dict__)
        new.backend = resolve_backend(backend, self.role)
        if new.backend in GPU_BACKENDS and self.device.type != "cuda":
            new.w_q, new.w_s, new._w_int = self.w_q.cuda(), self.w_s.cuda(), None
            new._w_pre = new._g_w_dev = None
        new._plans, new._last = {}, (None, None)  # its scratch buffers are its own
        return new

    def _check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.bfloat16:
            raise TypeError(f"x has dtype {x.dtype}; expected torch.bfloat16")
        if x.dim() != 2 or x.shape[1] != self.K or x.shape[0] == 0:
            raise ValueError(f"x has shape {tuple(x.shape)}; expected [M >= 1, {self.K}]")
        if x.device != self.device:
            raise ValueError(f"x is on {x.device}; this linear's weight is on {self.device}")

    def quantize_input(self, x: torch.Tensor):
        """(packed, scales, g_x) of x with its global amax (reference quantizer, 16-padded).
        ValueError when x holds NaN or ±inf: its tensor scale (amax / 2688) is not finite."""
        g = nvfp4.global_scale(x)
        if not bool(torch.isfinite(g)):
            raise ValueError(f"x holds NaN or inf (its tensor scale amax/2688 is {float(g)}); "
                             "Nvfp4Linear takes finite inputs only")
        q, s = nvfp4.quantize(x, g, pad_16x=True)
        return q, s, float(g)

    def _check_epilogue(self, gate, residual, m: int) -> None:
        if (gate is None) != (residual is None):
            raise ValueError("gate and residual go together (the gated residual add): pass "
                             "both or neither")
        if gate is None:
            return
        for name, t, shape in (("gate", gate, (self.N,)), ("residual", residual, (m, self.N))):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
                raise TypeError(f"{name} must be a bf16 torch.Tensor, got "
                                f"{getattr(t, 'dtype', type(t).__name__)}")
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}; need {list(shape)}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}; this linear's weight is on "
                                 f"{self.device}")

    def _check_out(self, out, m: int) -> None:
        if out is None:
            return
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16:
            raise TypeError(f"out must be a bf16 torch.Tensor, got "
                            f"{getattr(out, 'dtype', type(out).__name__)}")
        if tuple(out.shape) != (m, self.N):
            raise ValueError(f"out has shape {tuple(out.shape)}; need {[m, self.N]}")
        if out.device != self.device:
            raise ValueError(f"out is on {out.device}; this linear's weight is on {self.device}")
        if not out.is_contiguous():
            raise ValueError("out must be contiguous (the GEMM stores rows of N elements)")

    def __call__(self, x: torch.Tensor, rows=None, *, gate=None, residual=None,
                 out=None) -> torch.Tensor:
        """bf16 [r1 - r0, N]: rows [r0, r1) of x·Wᵀ, x quantized as a whole (its global amax);
        with ``gate`` [N] and ``residual`` [r1 - r0, N], residual + gate · that (H3's order).
        ``out`` (bf16 [r1 - r0, N], contiguous, on the weight's device) receives it and is
        returned: p0 and p2 store into it directly (a caller can poison it first and see that
        every element was written: experiments/p2_parity.py), reference copies into it.
        x must be finite: ``reference`` refuses NaN or ±inf (ValueError, before the GEMM);
        ``p0`` and ``p2`` never read x on the host (no synchronisation), so they do not check.

        ``p0`` per call: three launches (amax, which also writes the tensor scale g on the
        device; quantize; GEMM) and one allocation (the output). A call without ``out`` whose
        signature (x's shape, dtype, device and contiguity, rows, gate and residual likewise,
        the stream) was checked before skips the checks but x's alignment and reuses its scratch
        (amax workspace, packed activation, split-K workspace): calls on one stream run in
        order, so a later call never overwrites what an earlier one still reads."""
        capturing = self.backend == "p0" and torch.cuda.is_current_stream_capturing()
        key = None  # a plan key only for an uncaptured p0 call without ``out``
        if self.backend == "p0" and not capturing and out is None:  # else the checked path
            try:
                key = _p0_key(x, rows, gate, residual)
                p = self._last[1] if key == self._last[0] else self._plans.get(key)
            except (AttributeError, TypeError):  # not a tensor, a list rows: the checks name it
                key = p = None
            if p is not None and not (x.data_ptr() % 16 or (gate is not None and (
                    gate.data_ptr() | residual.data_ptr()) % 4)):
                return p.launch(x, self.w_q, self.w_s, self._g_w_dev, self._w_pre, gate,
                                residual)
        self._check_input(x)
        r0, r1 = _check_rows(rows, x.shape[0])
        self._check_epilogue(gate, residual, r1 - r0)
        self._check_out(out, r1 - r0)
        if self.backend == "p0":
            return self._p0(x, r0, r1, gate, residual, None if capturing else key, out)
        if self.backend == "p2":
            return self._p2(x, r0, r1, gate, residual, out)
        if self.backend == "p1":
            return self._p1(x, r0, r1, gate, residual, out)
        y = self._exact(x, r0, r1)[0].to(torch.bfloat16)
        y = y if gate is None else gate_residual(y, gate, residual)
        return y if out is None else out.copy_(y)

    def oracle(self, x: torch.Tensor, rows=None):
        """(D bf16, alpha·S float64, bound float64) for rows [r0, r1): the correctly rounded
        output, the exact real result and the oracle's proven fp32-accumulation bound."""
        self._check_input(x)
        r0, r1 = _check_rows(rows, x.shape[0])
        d, real, bound = self._exact(x, r0, r1, with_bound=True)
        return d.to(torch.bfloat16), real, bound

    def audit(self, x: torch.Tensor, y: torch.Tensor, rows=None) -> Audit:
        """The oracle a backend's output ``y`` (bf16 [r1 - r0, N], rows [r0, r1) of x·Wᵀ) is
        checked by, with the bound (its Σ|ab| GEMM) only where y is not the correctly rounded
        result: :class:`Audit`. Where y equals a finite D bit for bit the check passes whatever
        the bound (numerics.gemm_oracle.may_leave_bound), so checking the rest by the bound
        gives every verdict and figure of a check against :meth:`oracle`: one float64 GEMM a
        call where :meth:`oracle` takes two."""
        self._check_input(x)
        r0, r1 = _check_rows(rows, x.shape[0])
        if (not isinstance(y, torch.Tensor) or y.dtype != torch.bfloat16
                or tuple(y.shape) != (r1 - r0, self.N)):
            raise ValueError(f"y must be a bf16 tensor of shape {[r1 - r0, self.N]}, got "
                             f"{getattr(y, 'dtype', type(y).__name__)} "
                             f"{tuple(getattr(y, 'shape', ()))}")
        q, s, w_int, alpha = self._operands(x)
        d = torch.empty(r1 - r0, self.N, dtype=torch.bfloat16, device=x.device)
        at, real, bound = [], [], []
        for c0, c1, a_int in self._row_chunks(q, s, r0, r1):
            I = G.exact_sums(a_int, w_int)
            dc = d[c0 - r0:c1 - r0] = G.round_bf16_exact(I, alpha).to(torch.bfloat16)
            loc = G.may_leave_bound(y[c0 - r0:c1 - r0].to(x.device), dc).flatten()
            loc = loc.nonzero().flatten()
            if loc.numel():
                m, n = loc // self.N, loc % self.N
                I_at = I[m, n]
                at.append(loc + (c0 - r0) * self.N)
                real.append(alpha * I_at.to(torch.float64) * 2.0**-20)  # oracle()'s real
                bound.append(G.fp32_error_bound(I_at, G.abs_sums_at(a_int, w_int, m, n),
                                                alpha, self.K))
        if not at:
            none = torch.zeros(0, dtype=torch.float64, device=x.device)
            return Audit(d, torch.zeros(0, dtype=torch.int64, device=x.device), none, none)
        return Audit(d, torch.cat(at), torch.cat(real), torch.cat(bound))

    def _operands(self, x):
        """(q, s, w_int, alpha): x quantized, the weight's integers, the GEMM's fp32 alpha."""
        q, s, g = self.quantize_input(x)
        w_int = self._w_int
        if w_int is None:
            w_int = G.operand_integers(self.w_q, self.w_s, self.N, self.K)
            if self.N * self.K <= W_INT_CACHE_MAX:
                self._w_int = w_int
        alpha = float(torch.tensor(g, dtype=torch.float32) * torch.tensor(self.g_w,
                                                                           dtype=torch.float32))
        return q, s, w_int, alpha

    def _row_chunks(self, q, s, r0, r1):
        """(c0, c1, the integers of x's rows [c0, c1)) over [r0, r1), in chunks that keep the
        oracle's int64/float64 temporaries near CHUNK_ELEMENTS (a full H3 QKV at once would
        need ~100 GB)."""
        step = max(ROW_TILE, CHUNK_ELEMENTS // max(self.N, self.K))
        for c0 in range(r0, r1, step):
            c1 = min(c0 + step, r1)
            ids = torch.arange(c0, c1, device=q.device)
            yield c0, c1, G.operand_integers(q, s, q.shape[0], self.K, row_ids=ids)

    def _exact(self, x, r0, r1, with_bound: bool = False):
        """The oracle over rows [r0, r1), chunk by chunk (_row_chunks)."""
        q, s, w_int, alpha = self._operands(x)
        d = torch.empty(r1 - r0, self.N, dtype=torch.float32, device=x.device)
        real = bound = None
        if with_bound:
            real, bound = (torch.empty(r1 - r0, self.N, dtype=torch.float64, device=x.device)
                           for _ in range(2))
        for c0, c1, a_int in self._row_chunks(q, s, r0, r1):
            I = G.exact_sums(a_int, w_int)
            d[c0 - r0:c1 - r0] = G.round_bf16_exact(I, alpha)
            if with_bound:
                real[c0 - r0:c1 - r0] = alpha * I.to(torch.float64) * 2.0**-20
                bound[c0 - r0:c1 - r0] = G.fp32_error_bound(I, G.abs_sums(a_int, w_int),
                                                            alpha, self.K)
        return d, real, bound

    def _device_weight(self, device) -> None:
        """The register-order prepack (every f16 build and P1 read it) and g_w as a device fp32
        [1], each made once and kept: made inside a CUDA-graph capture they would hold data
        only after a replay (and the scale's host copy cannot be captured at all), so a first
        call under capture is refused."""
        if self._w_pre is not None and self._g_w_dev is not None:
            return
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"Nvfp4Linear ({self.backend}) prepares its weight's device scale "
                               "and its prepack on its first call: call it once outside "
                               "CUDA-graph capture before capturing it")
        from kernels.nvfp4.prepack import prepack

        if self._w_pre is None:
            self._w_pre = prepack(self.w_q, self.w_s)
        if self._g_w_dev is None:
            self._g_w_dev = torch.tensor([self.g_w], dtype=torch.float32, device=device)

    def _p0_config(self, m: int, stream_k: bool = True):
        """(config, prepack) of p0's GEMM over m rows: default_config's f16 build, and the
        prepack, made once. p2 passes the whole
        call's to every chunk (a chunk's own default could differ: its K split, its design),
        and its ring then holds each chunk's f16 rows; with ``stream_k=False`` (a ring of
        several chunks) never stream-K."""
        # here, not at the top: the kernels import CuTe DSL, which the oracle backend runs
        # without (p0_unavailable_reason says when it is missing)
        from kernels.nvfp4.gemm import default_config
        from kernels.nvfp4.prepack import prepack

        config = default_config(m, self.N, self.K, stream_k=stream_k)
        if self._w_pre is None:
            self._w_pre = prepack(self.w_q, self.w_s)
        return config, self._w_pre

    def _p0(self, x, r0, r1, gate=None, residual=None, key=None, out=None):
        """The checked path: every kernel entry's own checks, then (for a ``key``) the plan
        that later calls of the same signature launch directly."""
        # here, not at the top: the kernels import CuTe DSL, which the oracle backend runs
        # without (p0_unavailable_reason says when it is missing)
        from kernels.nvfp4 import amax as A
        from kernels.nvfp4 import gemm as G
        from kernels.nvfp4 import quantize as Q

        # a copy made here is not the caller's tensor: only calls that needed none are planned
        plannable = key is not None and x.is_contiguous() and (
            residual is None or residual.is_contiguous())
        x = x.contiguous()
        M = x.shape[0]
        ws = A.AmaxWorkspace(x.dtype, x.device)  # g = global_scale_from_amax(amax), on device
        # packed activation, scales and the f16 expansion the GEMM's f16 builds read by TMA:
        # a planned call's are shared by every p0 linear on its stream (key[-1])
        q, s, f16 = (activation_scratch(M, self.K, x.device, key[-1]) if plannable else
                     _new_activation_scratch(M, self.K, x.device))
        A.amax(x, out=ws)
        Q.quantize_expand_nvfp4(x, ws.g, out=(q, s, f16))
        if residual is not None:
            residual = residual.contiguous()
        self._device_weight(x.device)
        pre = self._w_pre
        rows = (r0, r1)
        y = G.gemm_nvfp4(q, s, ws.g, self.w_q, self.w_s, self._g_w_dev, rows=rows, gate=gate,
                         residual=residual, prepacked=pre, out=out, a16=f16)
        if plannable and out is None:  # a plan allocates its own outputs
            gp = G._PLANS.get(G.signature(q, s, ws.g, self.w_q, self.w_s, self._g_w_dev, None,
                                          rows, None, gate, residual, pre, f16))
            if gp is not None:
                if len(self._plans) >= P0_PLANS_MAX:
                    self._plans.clear()
                self._plans[key] = p = _P0Plan(x, ws, q, s, f16, gp)
                self._last = (key, p)
        return y


    def _p1(self, x, r0, r1, gate=None, residual=None, out=None):
        """P1 (kernels/nvfp4/gemm_p1.py): amax of the whole x, whose kernel writes the tensor
        scale g on the device, then one GEMM over rows [r0, r1) that quantizes its activation
        tiles itself with that g: no packed activation, scale or f16 expansion exists. Bits:
        p0's wherever p0 runs its swap-AB f16 build without stream-K (gemm_p1.choose_config),
        else that swap-AB build's on the packed activation."""
        from kernels.nvfp4 import amax as A
        from kernels.nvfp4.gemm_p1 import choose_config, gemm_nvfp4_p1

        x = x.contiguous()
        if residual is not None:
            residual = residual.contiguous()
        self._device_weight(x.device)
        config, _ = choose_config(r1 - r0, self.N, self.K)
        ws = A.AmaxWorkspace(x.dtype, x.device)
        A.amax(x, out=ws)  # the WHOLE x's, as p0
        return gemm_nvfp4_p1(x[r0:r1], ws.g, self._w_pre, self._g_w_dev, out=out, config=config,
                             gate=gate, residual=residual)

    def _p2(self, x, r0, r1, gate=None, residual=None, out=None):
        from kernels.nvfp4.amax import amax
        from kernels.nvfp4.ring import plan_ring

        x = x.contiguous()
        if residual is not None:
            residual = residual.contiguous()
        from schedules.p2_ring import chunk_plan

        # the whole call's: every chunk runs it; not stream-K across several chunks (its bits
        # depend on the whole call's tile count), so there p2's bits are the tile loop's while
        # p0's whole call runs stream-K (the only shapes where p2 and p0 differ)
        several = len(chunk_plan(r0, r1, self.ring_capacity)) > 1
        config, pre = self._p0_config(r1 - r0, stream_k=not several)
        plan = plan_ring(x, self.w_q, self.w_s, self.g_w, rows=(r0, r1),
                         capacity=self.ring_capacity, config=config, prepacked=pre, gate=gate,
                         residual=residual, out=out)  # every check before the first launch
        g = nvfp4.global_scale_from_amax(amax(x)).reshape(1)  # the WHOLE x, as p0
        return plan.run(g)


P0_PLANS_MAX = 16  # signatures (each with its scratch) a p0 linear keeps
ACT_SCRATCH_MAX = 8  # (device, stream, M, K) activation scratch sets kept for all p0 linears
_ACT_SCRATCH: dict = {}


def _new_activation_scratch(M: int, K: int, device):
    """(packed uint8 [Mp, K/2], scales uint8 [scale_shape(Mp, K)], f16 [M, K]) for M rows,
    Mp = M rounded up to 16; codes and scales zeroed once (the kernel writes rows < M only, so
    the 16-padding stays zero)."""
    Mp = -(-M // nvfp4.BLOCK) * nvfp4.BLOCK
    return (torch.zeros(Mp, K // 2, dtype=torch.uint8, device=device),
            torch.zeros(nvfp4.scale_shape(Mp, K), dtype=torch.uint8, device=device),
            torch.empty(M, K, dtype=torch.float16, device=device))


def activation_scratch(M: int, K: int, device, stream):
    """The activation scratch every planned p0 call of M rows and K columns on ``stream``
    shares, whichever linear makes it: calls on one stream run in order, so a call's quantize
    writes it only after the previous call's GEMM has read it. One set per (device, stream, M,
    K) instead of one per linear and signature: at H3's full size (M = 37810) the f16
    expansion alone is 406 MB a K = 5376 linear, 200 linears in all."""
    key = (str(device), stream, M, K)
    buf = _ACT_SCRATCH.get(key)
    if buf is None:
        if len(_ACT_SCRATCH) >= ACT_SCRATCH_MAX:
            _ACT_SCRATCH.clear()  # plans that hold an older set keep it alive: still correct
        buf = _ACT_SCRATCH[key] = _new_activation_scratch(M, K, device)
    return buf


def _tensor_key(t):
    return (type(t), t.shape, t.dtype, t.device, t.is_contiguous())


def _p0_key(x, rows, gate, residual):
    """A p0 call's signature: what the checks read but addresses, and the stream (scratch is
    per stream). AttributeError / TypeError for arguments without one (they take the checks)."""
    if rows is not None:
        if type(rows) is not tuple or len(rows) != 2:
            raise TypeError
        rows = (rows[0], rows[1], type(rows[0]), type(rows[1]))
    if x.device.type != "cuda":
        raise TypeError  # no stream: the checks refuse it
    from device.ffi import stream_handle

    return (_tensor_key(x), rows, None if gate is None else _tensor_key(gate),
            None if residual is None else _tensor_key(residual), stream_handle(x.get_device()))


class _P0Plan:
    """One checked p0 signature's launches and scratch: amax into ``ws`` (which writes g),
    quantize and expand into (q, s, f16), the GEMM's plan (its split-K workspace made once and
    kept)."""

    def __init__(self, x, ws, q, s, f16, gemm_plan):
        from kernels.nvfp4 import amax as A
        from kernels.nvfp4 import gemm as G
        from kernels.nvfp4 import quantize as Q

        self.amax_config = A._DEFAULT
        self.amax_scalars = A.plan(x, ws, self.amax_config)
        q_config, _, self.q_scalars = Q.plan(x, ws.g, (q, s), 0, False, None)[:3]
        self.q_config = Q.expand_config(q_config.is_bf16)
        self.q_key = self.q_config.key
        self.amax_entry, self.q_entry, self.gemm_launch = A.ENTRY, Q.ENTRY_F16, G.launch
        self.ws, self.q, self.s, self.f16 = ws, q, s, f16
        # the entries' address slots (kernels.nvfp4.amax / quantize ENTRY*): made once, the
        # plan keeps the tensors alive
        self.amax_args = (ws.buf.data_ptr(),)
        self.q_args = (q.data_ptr(), s.data_ptr(), ws.g.data_ptr(), f16.data_ptr())
        self.a_q, self.a_s, self.a16 = q, s, f16  # the GEMM's A: the rows slice made once
        if gemm_plan.r0 or gemm_plan.r1 != gemm_plan.M or (
                gemm_plan.a16_rows not in (None, gemm_plan.r1 - gemm_plan.r0)):
            r0, r1 = gemm_plan.r0, gemm_plan.r1
            self.a_q, self.a_s, self.a16 = q[r0:r1], s[r0:], f16[r0:r1]
            m = r1 - r0
            gemm_plan = gemm_plan._replace(r0=0, r1=m, M=m, a16_rows=(
                None if gemm_plan.a16_rows is None else m))
        self.gemm = gemm_plan
        self.work = self.counters = None
        if gemm_plan.words:
            self.work = torch.empty(gemm_plan.words, dtype=torch.float32, device=x.device)
            self.counters = torch.zeros(gemm_plan.tiles, dtype=torch.int32, device=x.device)

    def launch(self, x, w_q, w_s, g_w, pre, gate, residual):
        ws = self.ws
        self.amax_entry(self.amax_config, self.amax_config.key, (x, *self.amax_args),
                        self.amax_scalars)
        self.q_entry(self.q_config, self.q_key, (x, *self.q_args), self.q_scalars)
        return self.gemm_launch(self.gemm, self.a_q, self.a_s, ws.g, w_q, w_s, g_w, None, gate,
                                residual, pre, self.work, self.counters, a16=self.a16)
