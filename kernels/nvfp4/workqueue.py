"""P2's persistent work queue, host side (the kernel's roles: producers/ring_queue.py; the
design and its prediction: notes/p2.md): one launch of the 256-token f16 GEMM
(:meth:`BlockscaledGemmSm90.wide_f16_queue`) whose grid ends in ``producers`` quantizer CTAs
that fill a bounded ring of f16 rows chunk by chunk from the bf16 activation, while the other
CTAs run the whole call's tiles as chunks become ready. Neither the packed activation nor its
f16 expansion exists in full; the output is bit-identical to
``gemm_nvfp4(quantize_expand_nvfp4(x, g), ..., a16=, config=<the same 256-token build>)``.

Every check runs before the launch (:func:`plan_queue`): the arguments, the whole call's build
(the queue runs the 256-token build only: where the chooser picks the swap-AB build there is
one chunk's worth of work and nothing to overlap), and co-residency (every CTA of the grid
resident at once, no MPS), since GEMM CTAs spin on the quantizers and quantizers on GEMM CTAs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from device.ffi import require_hopper
from device.residency import check_co_resident
from device.runtime import check_cuda_tensor, sm_count
from kernels.nvfp4.gemm import (GATE_RESIDUAL, _check_epilogue_operands, _check_prepacked,
                                _mailbox_address, default_config)
from kernels.nvfp4.gemm_shell import ENTRY, BlockscaledGemmSm90, entry_buffers
from kernels.nvfp4.prepack import PrepackedWeights, weight_rows
from kernels.nvfp4.ring import _check_g
from producers.ring_queue import QueueLayout
from schedules import plan

X_DTYPES = (torch.bfloat16, torch.float16)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class QueuePlan:
    """A checked work-queue call: :meth:`run` allocates the ring and counters and launches."""
    x: torch.Tensor
    prepacked: PrepackedWeights
    g_w: torch.Tensor
    N: int
    layout: QueueLayout
    config: BlockscaledGemmSm90  # the queue build (wide_f16_queue)
    whole: BlockscaledGemmSm90  # the whole call's 256-token build, whose bits the queue gives
    gemm_ctas: int
    out: object
    gate: object = None  # P4's gated residual add: bf16 [N] and [M, N] (both or neither)
    residual: object = None

    @property
    def ring_bytes(self) -> int:
        return self.layout.ring_rows * self.x.shape[1] * 2

    def run(self, g, counters=None) -> torch.Tensor:
        """One launch on the current stream; bf16 [M, N]. ``counters``: an int32 buffer of
        ``layout.counter_words(M)`` words for the launch's counters (default: zeroed here), which
        the launch leaves at ``layout.expected_counts``: the tests read it, and a buffer not
        zeroed makes a wait that cannot complete (the stall test)."""
        x = self.x
        _check_g(g, x.device)  # the ring's rule for the whole activation's tensor scale
        M, K = x.shape
        out = self.out
        if out is None:
            out = torch.empty(M, self.N, dtype=torch.bfloat16, device=x.device)
        ring = torch.empty(self.layout.ring_rows, K, dtype=torch.float16, device=x.device)
        words = self.layout.counter_words(M)
        if counters is None:
            counters = torch.zeros(words, dtype=torch.int32, device=x.device)
        elif (not isinstance(counters, torch.Tensor) or counters.dtype != torch.int32
              or counters.shape != (words,) or counters.device != x.device
              or not counters.is_contiguous()):
            raise ValueError(f"counters must be a contiguous int32 [{words}] tensor on "
                             f"{x.device}")
        ENTRY(self.config, self.config.static_key(),
              entry_buffers(ring.view(torch.uint8), x.view(torch.uint8), self.prepacked, g,
                            self.g_w, out, _mailbox_address(), None, counters, self.gate,
                            self.residual), (M, self.N, K // 32, self.gemm_ctas))
        return out


def synchronize(plan: QueuePlan) -> None:
    """torch.cuda.synchronize(); a trapped queue's report names the counter it waited on."""
    from device.waits import synchronize as sync
    sync(plan.layout.counter_names(plan.x.shape[0]))


def plan_queue(x, prepacked, g_w, *, capacity=None, slots=None, producers=None, out=None,
               config=None, gate=None, residual=None) -> QueuePlan:
    """Every check of a work-queue call, before any launch. ``x``: bf16/fp16 [M, K] contiguous
    (K a multiple of 32); ``prepacked``: the weight's register-order prepack [N, K]; ``g_w``: its
    tensor scale (one-element fp32 device tensor); ``capacity`` rows a chunk (a multiple of
    256), ``slots`` ring slots (>= 2), ``producers`` quantizer CTAs (defaults:
    schedules/plan.py ``WORKQUEUE``, the quantizers by the build's weight tiles); ``config``:
    the whole call's 256-token build (default: the chooser's, without stream-K); ``out``: bf16
    [M, N]; ``gate`` and ``residual``: P4's gated residual add in the epilogue (bf16 [N] and
    [M, N]; residual may be ``out``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in X_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; expected bfloat16 or float16")
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0 or x.shape[1] % 32:
        raise ValueError(f"x has shape {tuple(x.shape)}; need [M >= 1, K] with K a positive "
                         "multiple of 32 (the shell's K unit)")
    M, K = x.shape
    N = weight_rows(prepacked, K)
    d = plan.WORKQUEUE
    layout = QueueLayout(d.capacity if capacity is None else capacity,
                         d.slots if slots is None else slots,
                         1 if producers is None else producers,  # chosen below, by the build
                         bf16=x.dtype == torch.bfloat16, loads=d.loads)
    if M * K // 2 >= 2**31 or layout.ring_rows * K // 2 >= 2**31 or M * N // 2 >= 2**31:
        raise ValueError(f"M = {M}, N = {N} or the ring's {layout.ring_rows} rows x K = {K} "
                         "exceed the kernel's 32-bit word indexing")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (M, N) or out.dtype != torch.bfloat16:
            raise ValueError(f"out is {out.dtype} {tuple(out.shape)}; need bfloat16 [{M}, {N}]")
    if config is not None and not isinstance(config, BlockscaledGemmSm90):
        raise TypeError(f"config must be a BlockscaledGemmSm90, got {type(config).__name__}")
    require_hopper()
    sms = sm_count()
    whole = config or default_config(M, N, K, sms, stream_k=False)
    if not (whole.reads_f16_activation and whole.tile_m == 256 and whole.threads == 384):
        raise ValueError(f"the work queue runs the 256-token f16 build (wide_f16); at M = {M} "
                         "the chooser picks the swap-AB build (one chunk's work): call "
                         "gemm_nvfp4 with a16= instead")
    if whole.stream_k or whole.splits != 1 or whole.variant is not None:
        raise ValueError("the queue reproduces a one-split tile-loop build: a stream-K build "
                         "cuts tiles by the whole call's tile count, a K split adds partials in "
                         "another order, a measurement variant is not production")
    if producers is None:
        layout = dataclasses.replace(layout, producers=d.producers_for(-(-N // whole.tile_n)))
    if layout.producers >= sms:
        raise ValueError(f"producers = {layout.producers} leaves no SM for the GEMM "
                         f"({sms} SMs)")
    check_cuda_tensor("x", x, dtypes=X_DTYPES)
    _check_prepacked(prepacked, N, K, x.device)
    check_cuda_tensor("g_w", g_w, dtypes=(torch.float32,), align=4)
    if g_w.numel() != 1 or g_w.device != x.device:
        raise ValueError(f"g_w must hold one fp32 value on {x.device}")
    if out is not None:
        check_cuda_tensor("out", out, dtypes=(torch.bfloat16,))
    _check_epilogue_operands(gate, residual, M, N, x.device)
    queue = BlockscaledGemmSm90.wide_f16_queue(layout, stages=whole.stages,
                                               buffers=whole.producer.buffers)
    if gate is not None:
        queue, whole = queue.with_output(GATE_RESIDUAL), whole.with_output(GATE_RESIDUAL)
    tiles = -(-M // 256) * -(-N // queue.tile_n)
    gemm_ctas = min(tiles, sms - layout.producers)
    check_co_resident(gemm_ctas + layout.producers, "the work queue's grid")
    return QueuePlan(x, prepacked, g_w, N, layout, queue, whole, gemm_ctas, out, gate, residual)


def queue_gemm(x, g, prepacked, g_w, **kw) -> torch.Tensor:
    """x·Wᵀ through the work queue: :func:`plan_queue`'s checks (keywords as there), then one
    launch. ``g``: the activation's tensor scale (its amax's, a one-element fp32 device
    tensor)."""
    return plan_queue(x, prepacked, g_w, **kw).run(g)


__all__ = ["QueuePlan", "plan_queue", "queue_gemm", "synchronize"]
