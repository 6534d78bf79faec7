"""P2's bounded packed-tile ring: a projection as row chunks, each quantized once into a ring of
C rows (packed E2M1 codes + swizzled E4M3 scales) by the quantize kernel's ``_into`` form and
consumed there by P0's GEMM for every output column; the slot is then recycled for the next
chunk.

Bit-identical to the whole P0 call (notes/p2.md, "what bit-identity requires"): one tensor
scale g from the whole activation's amax, read by every chunk; the whole call's static GEMM
config (``default_config`` of the whole row count, never the chunk's) passed to every chunk;
chunks start on 128-row scale tiles; rows are independent, so a partial last chunk's stale
ring rows reach no stored output; the ring's scale padding columns are zero.

Slot reuse is stream-ordered, never serialised by the caller: :func:`ring_gemm` allocates its
ring and output from torch's caching allocator on the current stream (a freed block goes back
only to later allocations on the same stream), and chunk i + 1's quantize is enqueued behind
chunk i's GEMM on that stream. Two requests on two streams each own a ring and overlap freely.
A caller-owned :class:`PackedRing` remembers its stream and is refused on any other.

Every input is checked before the first launch (:func:`plan_ring`), the shape and argument
checks before the device ones, so the rules are testable without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.nvfp4.gemm import default_config, gemm_nvfp4, launch_config
from kernels.nvfp4.gemm import validate as validate_gemm
from device.ffi import require_hopper
from device.runtime import check_cuda_tensor
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import quantize_expand_nvfp4
from numerics.nvfp4 import BLOCK, SCALE_TILE_COLS, scale_shape
from schedules.p2_ring import DEFAULT_CAPACITY, check_capacity, chunk_plan, ring_bytes

X_DTYPES = (torch.bfloat16, torch.float16)


class PackedRing:
    """``capacity`` rows of packed activation (uint8 [C, K/2]) and their swizzled scales
    (float8_e4m3fn [C, roundup(K/16, 4)]) on the current CUDA device, made on the current
    stream and usable only there. The scale padding columns are zeroed once (the quantize
    kernel never writes them). With ``f16`` (the default) the ring also holds the rows' exact
    f16 expansion (float16 [C, K]), which the GEMM's f16 builds read (every config
    gemm_nvfp4 runs); ``f16=False``: packed rows only, which no config reads (plan_ring
    refuses such a ring)."""

    def __init__(self, capacity: int, K: int, device=None, f16: bool = True):
        check_capacity(capacity)
        self.capacity, self.K = capacity, K
        self.nbytes = ring_bytes(capacity, K, f16)  # checks K
        device = torch.device("cuda" if device is None else device)
        self.q = torch.empty(capacity, K // 2, dtype=torch.uint8, device=device)
        padded = (K // BLOCK) % SCALE_TILE_COLS != 0
        self.s = (torch.zeros if padded else torch.empty)(
            scale_shape(capacity, K), dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
        self.f16 = (torch.empty(capacity, K, dtype=torch.float16, device=device) if f16
                    else None)
        self.stream = current_stream(self.q.device)

    @property
    def device(self) -> torch.device:
        return self.q.device


def current_stream(device):
    """torch's current stream on ``device``: what a ring is bound to (one seam for the tests)."""
    return torch.cuda.current_stream(device)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class RingPlan:
    """A checked ring call: the chunks and the whole call's config. :meth:`run` launches."""
    x: torch.Tensor
    w: tuple  # (w_q, w_s, g_w)
    r0: int
    r1: int
    capacity: int
    chunks: list
    config: BlockscaledGemmSm90  # the whole call's, gate rule applied: every chunk runs it
    prepacked: object
    gate: object
    residual: object
    out: object
    ring: PackedRing  # the caller's, or made by plan_ring on the current stream

    def run(self, g) -> torch.Tensor:
        """Quantize and multiply chunk by chunk on the current stream; bf16 [r1 - r0, N]."""
        x, (w_q, w_s, g_w), m = self.x, self.w, self.r1 - self.r0
        N = w_q.shape[0]
        _check_g(g, x.device)
        ring = self.ring
        if current_stream(ring.device) != ring.stream:
            raise ValueError("the ring was made on another stream: its slots are recycled by "
                             "stream order, so it serves only the stream it was made on")
        out = self.out
        if out is None:
            out = torch.empty(m, N, dtype=torch.bfloat16, device=x.device)
        prepacked = self.prepacked or prepack(w_q, w_s)  # the convenience: once a call
        for ch in self.chunks:
            a, b = ch.start - self.r0, ch.stop - self.r0
            # the slot is free: the previous chunk's GEMM is ahead of this on the stream
            quantize_expand_nvfp4(x[ch.start:ch.stop], g,
                                  out=(ring.q, ring.s, ring.f16[:ch.rows]))
            gemm_nvfp4(ring.q, ring.s, g, w_q, w_s, g_w, rows=(0, ch.rows), out=out[a:b],
                       config=self.config, prepacked=prepacked, gate=self.gate,
                       residual=None if self.residual is None else self.residual[a:b],
                       a16=ring.f16)
        return out


def _check_g(g, device) -> None:
    if not isinstance(g, torch.Tensor) or g.dtype != torch.float32 or g.numel() != 1:
        raise TypeError("g must be the device tensor scale: a one-element float32 tensor (the "
                        "whole activation's, from its amax)")
    if g.device != device:
        raise ValueError(f"g is on {g.device}; x is on {device}")


def _check_rows(rows, M: int) -> tuple[int, int]:
    if rows is None:
        return 0, M
    if (not isinstance(rows, (tuple, list)) or len(rows) != 2
            or not all(_is_int(r) for r in rows)):
        raise TypeError(f"rows must be a pair of ints (r0, r1), got {rows!r}")
    r0, r1 = rows
    if not 0 <= r0 < r1 <= M:
        raise ValueError(f"rows = ({r0}, {r1}) must satisfy 0 <= r0 < r1 <= M = {M}")
    return r0, r1


def _check_shape(name: str, t, shape) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; need {list(shape)}")


def plan_ring(x, w_q, w_s, g_w, *, rows=None, capacity=None, config=None, prepacked=None,
              gate=None, residual=None, out=None, ring=None) -> RingPlan:
    """Every check of a ring call, before any launch; returns the :class:`RingPlan`, holding the
    ring (``ring``, or one allocated here on the current stream: no kernel runs).

    x: bf16/fp16 [M, K], contiguous; rows [r0, r1) of the projection (r0 a multiple of 128);
    capacity: ring rows (a multiple of 128; default the ring's, else DEFAULT_CAPACITY);
    config: the WHOLE call's static config, an f16 build (default: ``default_config(r1 - r0,
    N, K)``, what gemm_nvfp4 picks for the whole rows, without stream-K unless the rows are one
    chunk), never a chunk's; the ring holds each chunk's f16 expansion beside its packed codes,
    and a stream-K config is refused for more than one chunk (its bits depend on the whole
    call's tile count); prepacked: the weight's register-order prepack (None: made once a
    call); out / residual: [r1 - r0, N]; ring: a caller-owned PackedRing of this stream, with
    f16 rows."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in X_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; expected bfloat16 or float16")
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] % BLOCK or x.shape[1] == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}; need [M >= 1, K] with K a positive "
                         f"multiple of {BLOCK}")
    M, K = x.shape
    if not isinstance(w_q, torch.Tensor) or w_q.dim() != 2 or 2 * w_q.shape[1] != K:
        raise ValueError(f"w_q must be packed codes [N, K/2] = [N, {K // 2}]; got "
                         f"{getattr(w_q, 'shape', type(w_q).__name__)}")
    N = w_q.shape[0]
    r0, r1 = _check_rows(rows, M)
    if ring is not None:
        if not isinstance(ring, PackedRing):
            raise TypeError(f"ring must be a PackedRing, got {type(ring).__name__}")
        if capacity is not None and capacity != ring.capacity:
            raise ValueError(f"capacity = {capacity} but the ring holds {ring.capacity} rows")
        if ring.K != K:
            raise ValueError(f"the ring holds rows of K = {ring.K}; x has K = {K}")
        capacity = ring.capacity
    capacity = DEFAULT_CAPACITY if capacity is None else capacity
    chunks = chunk_plan(r0, r1, capacity)  # checks capacity and r0 on a scale tile
    if config is not None and not isinstance(config, BlockscaledGemmSm90):
        raise TypeError(f"config must be a BlockscaledGemmSm90, got {type(config).__name__}")
    f16 = config is None or config.reads_f16_activation  # else launch_config refuses it
    if config is not None and config.stream_k and len(chunks) > 1:
        raise ValueError(f"config is stream-K, whose bits depend on the whole call's tile "
                         f"count, and rows [{r0}, {r1}) take {len(chunks)} chunks of "
                         f"{capacity}: use a ring of at least {r1 - r0} rows or a tile-loop "
                         "config")
    if ring is not None and (ring.f16 is not None) != f16:
        raise ValueError("the ring holds f16 rows exactly when the config reads them "
                         f"(config reads f16: {f16}; ring has them: {ring.f16 is not None})")
    if (gate is None) != (residual is None):
        raise ValueError("gate and residual go together (the gated residual add): pass both "
                         "or neither")
    _check_shape("out", out, (r1 - r0, N))
    _check_shape("residual", residual, (r1 - r0, N))
    _check_shape("gate", gate, (N,))
    if chunks[0].rows * K >= 2**31:  # the quantize kernel's int32 indexing, per chunk
        raise ValueError(f"a chunk of {chunks[0].rows} rows x K = {K} has 2^31 or more "
                         "elements; use a smaller capacity")
    # the device checks: CUDA, Hopper, dtypes, alignment, devices (the stream: at run)
    require_hopper()
    check_cuda_tensor("x", x, dtypes=X_DTYPES)
    if ring is None:  # allocated here (no launch): the GEMM's checks then see its real shapes
        ring = PackedRing(capacity, K, x.device, f16=f16)
    elif ring.device != x.device:
        raise ValueError(f"the ring is on {ring.device}; x is on {x.device}")
    first = chunks[0]  # the largest chunk: what holds for it holds for the rest
    # g is checked at run (_check_g) and g_w by each chunk's gemm_nvfp4: no tensor made here,
    # so a plan can be made inside a graph capture
    validate_gemm(ring.q, ring.s, None, w_q, w_s, g_w,
                  None if out is None else out[:first.rows], (0, first.rows), gate,
                  None if residual is None else residual[:first.rows], scales=False)
    whole = config or default_config(r1 - r0, N, K, stream_k=len(chunks) == 1)
    config = launch_config(whole, first.rows, N, K, x.device, gate, prepacked)
    return RingPlan(x, (w_q, w_s, g_w), r0, r1, capacity, chunks, config, prepacked, gate,
                    residual, out, ring)


def ring_gemm(x, g, w_q, w_s, g_w, **kw) -> torch.Tensor:
    """rows [r0, r1) of x·Wᵀ through the ring: :func:`plan_ring`'s checks (keywords as there),
    then chunk by chunk on the current stream. ``g``: the whole activation's tensor scale (a
    one-element fp32 device tensor). Every chunk's rows are bit-identical to
    ``gemm_nvfp4(quantize_nvfp4(x, g), rows=(r0, r1), config=<the same config>)``."""
    return plan_ring(x, w_q, w_s, g_w, **kw).run(g)


__all__ = ["PackedRing", "RingPlan", "plan_ring", "ring_gemm"]
