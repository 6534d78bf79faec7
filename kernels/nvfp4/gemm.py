"""``gemm_nvfp4``: the P0 block-scaled NVFP4 GEMM from torch, every input checked before launch.

Operands are Comfy Kitchen's prepacked NVFP4 (``numerics.nvfp4.quantize`` / the quantize kernel):
packed codes uint8 [rows, K/2] (element 2i in the high nibble), E4M3 scales in the cuBLAS 128x4
swizzle [roundup(rows, 128), roundup(K/16, 4)], and an fp32 tensor scale per operand.
With ``gate`` and ``residual`` the store is P4's exact gated residual add
(epilogues/gate_residual.py): D = RN_bf16(residual + gate · RN_bf16(alpha · Σ)).
Every call runs an f16 build (notes/p0-gemm.md, sessions 22 and 27): the activation's exact f16
expansion e2m1 · s read by TMA (``a16``, which kernels.nvfp4.quantize.quantize_expand_nvfp4
writes beside the packed codes) beside the weight's register-order prepack (``prepacked``,
kernels.nvfp4.prepack). Without them a call makes them itself, as conveniences that cost time:
the expansion by kernels.nvfp4.quantize.expand_nvfp4 into a scratch kept per (device, stream,
rows, K), the prepack per call. A caller that wants speed passes both (models.nvfp4_linear.
Nvfp4Linear does).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from configs.arch import K_BLOCK
from device import ffi
from device.ffi import plain_cuda, require_hopper
from device.runtime import check_cuda_tensor, cluster_ctas, sm_count
from device.waits import diagnostics_mailbox
from epilogues.gate_residual import GateResidualBf16
from kernels.nvfp4.gemm_shell import ENTRY, BlockscaledGemmSm90, entry_buffers
from kernels.nvfp4.prepack import PrepackedWeights, prepack
from kernels.nvfp4.quantize import expand_nvfp4
from numerics.nvfp4 import SCALE_TILE_ROWS, scale_shape
from schedules import plan

ROW_TILE = SCALE_TILE_ROWS  # a row slice must start on a scale tile
GATE_RESIDUAL = GateResidualBf16()
_CODES, _SCALES, _G = (torch.uint8,), (torch.float8_e4m3fn, torch.uint8), (torch.float32,)


def k_splits(M: int, N: int, K: int, sms: int) -> int:
    """The K split of the 128 x 128 builds: only below one wave of tiles, each split keeping a
    pipelined K loop (schedules/plan.py ``MAX_SPLITS``, ``MIN_K_BLOCKS_PER_SPLIT``)."""
    tiles = -(-M // plan.ROW_TILE) * -(-N // plan.SWAP_AB.tile_n)
    k_blocks = -(-K // K_BLOCK)
    return max(1, min(plan.MAX_SPLITS, sms // tiles, k_blocks // plan.MIN_K_BLOCKS_PER_SPLIT))


@functools.lru_cache(maxsize=1024)
def default_config(M: int, N: int, K: int, sms: int | None = None,
                   stream_k: bool = True) -> BlockscaledGemmSm90:
    """The f16 build schedules/plan.py picks: :meth:`BlockscaledGemmSm90.swap_ab_f16` at one
    token tile or within ``F16_SWAP_AB_MAX_WAVES`` waves of 128 x 128 tiles (K split below one
    wave, :func:`k_splits`; stream-K where the tiles just pass a whole wave,
    plan.F16_STREAM_K_WAVES), else :meth:`BlockscaledGemmSm90.wide_f16` (stream-K where its
    last wave is at most ``WIDE_F16_STREAM_K_LAST_WAVE`` full, after at most
    ``WIDE_F16_STREAM_K_MAX_FULL_WAVES`` whole waves). ``stream_k=False``: never stream-K (P2's
    ring of several chunks: stream-K's bits depend on the whole call's tile count). Cached: a
    config is an immutable value, and building one costs ~50 µs of host time (measured on the
    CPU), more than a whole launch should."""
    sms = sms or sm_count()
    tiles = -(-M // plan.ROW_TILE) * -(-N // plan.SWAP_AB.tile_n)
    if M <= plan.ROW_TILE or tiles <= plan.F16_SWAP_AB_MAX_WAVES * sms:
        splits = k_splits(M, N, K, sms)
        lo, hi = plan.F16_STREAM_K_WAVES
        stream_k = stream_k and splits == 1 and lo * sms < tiles <= hi * sms
        splits = 1 if stream_k else splits
        return BlockscaledGemmSm90.swap_ab_f16(
            stages=plan.SWAP_AB.stages, splits=splits, stream_k=stream_k,
            buffers=plan.F16_BUFFERS, cluster_splits=splits in plan.F16_CLUSTER_SPLITS)
    wide_tiles = -(-M // plan.WIDE_F16.tile_n) * -(-N // plan.SWAP_AB.tile_n)
    last_wave = wide_tiles % sms
    stream_k = (stream_k and wide_tiles // sms <= plan.WIDE_F16_STREAM_K_MAX_FULL_WAVES
                and 0 < last_wave <= plan.WIDE_F16_STREAM_K_LAST_WAVE * sms)
    return BlockscaledGemmSm90.wide_f16(stages=plan.WIDE_F16.stages, buffers=plan.F16_BUFFERS,
                                        tokens=plan.WIDE_F16.tile_n, stream_k=stream_k)


def _check_operand(name: str, q, s, device):
    # the common case in one cheap test each; check_cuda_tensor names any problem
    plain_cuda(q, _CODES, 16) or check_cuda_tensor(f"{name}_q", q, dtypes=_CODES)
    plain_cuda(s, _SCALES, 16) or check_cuda_tensor(f"{name}_s", s, dtypes=_SCALES)
    if q.dim() != 2:
        raise ValueError(f"{name}_q must be 2-D [rows, K/2]; got shape {tuple(q.shape)}")
    if q.device != device or s.device != device:
        raise ValueError(f"{name}_q and {name}_s must be on {device} with the other operands")
    rows, kh = q.shape
    if rows == 0 or kh == 0:
        raise ValueError(f"{name}_q is empty (shape {tuple(q.shape)}); the GEMM needs rows and K")
    if kh % 16:
        raise ValueError(f"{name}_q has K/2 = {kh} bytes per row; K must be a multiple of 32 "
                         "(rows are fetched by TMA in 16-byte units)")
    need = scale_shape(rows, 2 * kh)
    if tuple(s.shape) != need:
        raise ValueError(f"{name}_s has shape {tuple(s.shape)}; {name}_q [{rows}, {kh}] needs "
                         f"the swizzled scale shape {list(need)}")
    return rows, 2 * kh


def _tensor_scale(name: str, g, device):
    if isinstance(g, (int, float)) and not isinstance(g, bool):
        return torch.tensor([float(g)], dtype=torch.float32, device=device)
    plain_cuda(g, _G, 4) or check_cuda_tensor(name, g, dtypes=_G, align=4)
    if g.numel() != 1:
        raise ValueError(f"{name} must hold one fp32 value; it has {g.numel()}")
    if g.device != device:
        raise ValueError(f"{name} is on {g.device}; the operands are on {device}")
    return g


def _check_epilogue_operands(gate, residual, m: int, N: int, device):
    """P4's operands: both or neither; gate bf16 [N], residual bf16 [m, N], on ``device``."""
    if (gate is None) != (residual is None):
        raise ValueError("gate and residual go together (P4's gated residual add): pass both "
                         "or neither")
    if gate is None:
        return
    check_cuda_tensor("gate", gate, dtypes=(torch.bfloat16,), align=4)
    check_cuda_tensor("residual", residual, dtypes=(torch.bfloat16,), align=4)
    if tuple(gate.shape) != (N,):
        raise ValueError(f"gate has shape {tuple(gate.shape)}; need [{N}] (one per column)")
    if tuple(residual.shape) != (m, N):
        raise ValueError(f"residual has shape {tuple(residual.shape)}; need [{m}, {N}]")
    for name, t in (("gate", gate), ("residual", residual)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}; the operands are on {device}")


def _check_a16(a16, r1: int, K: int, device):
    """The activation's f16 expansion: float16 [rows >= r1, K], contiguous, on ``device``."""
    check_cuda_tensor("a16", a16, dtypes=(torch.float16,))
    if a16.dim() != 2 or a16.shape[1] != K or a16.shape[0] < r1 or not a16.is_contiguous():
        raise ValueError(f"a16 must be a contiguous float16 [>= {r1}, {K}] (the activation's "
                         f"f16 expansion); got {tuple(a16.shape)}, "
                         f"contiguous={a16.is_contiguous()}")
    if a16.device != device:
        raise ValueError(f"a16 is on {a16.device}; the operands are on {device}")


def _check_prepacked(prepacked, N: int, K: int, device):
    """The register-order prepack of the weight (kernels.nvfp4.prepack) the f16 builds read
    instead of b_q / b_s."""
    if not isinstance(prepacked, PrepackedWeights):
        raise TypeError("the f16 builds read the register-order prepack: pass prepacked= a "
                        f"PrepackedWeights (kernels.nvfp4.prepack.prepack) or none, got "
                        f"{type(prepacked).__name__}")
    if (prepacked.rows, prepacked.cols) != (N, K):
        raise ValueError(f"prepacked holds a [{prepacked.rows}, {prepacked.cols}] weight; b_q is "
                         f"[{N}, {K}]")
    for name, t in (("prepacked.codes", prepacked.codes), ("prepacked.scales", prepacked.scales)):
        check_cuda_tensor(name, t, dtypes=(torch.uint8,))
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}; the operands are on {device}")


def validate(a_q, a_s, g_a, b_q, b_s, g_b, out, rows, gate=None, residual=None, *,
             scales=True):
    """All checks, in order; returns (M, N, K, r0, r1, g_a, g_b). Raises before any launch.
    ``scales=False`` leaves g_a and g_b to the caller (returned as given): a caller that checks
    them at launch, where a float would become a device tensor (no host copy may run inside a
    graph capture)."""
    require_hopper()
    if not isinstance(a_q, torch.Tensor):
        raise TypeError(f"a_q must be a torch.Tensor, got {type(a_q).__name__}")
    device = a_q.device
    M, K = _check_operand("a", a_q, a_s, device)
    N, Kb = _check_operand("b", b_q, b_s, device)
    if K != Kb:
        raise ValueError(f"K mismatch: a_q holds K = {K}, b_q holds K = {Kb}")
    if N % 8:
        raise ValueError(f"N = {N} must be a multiple of 8 (16-byte output rows)")
    if rows is not None and (not isinstance(rows, (tuple, list)) or len(rows) != 2
                             or not all(isinstance(r, int) for r in rows)):
        raise TypeError(f"rows must be a pair of ints (r0, r1), got {rows!r}")
    r0, r1 = (0, M) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= r0 < r1 <= M:
        raise ValueError(f"rows = ({r0}, {r1}) must satisfy 0 <= r0 < r1 <= M = {M}")
    if r0 % ROW_TILE:
        raise ValueError(f"rows start r0 = {r0} must be a multiple of {ROW_TILE} "
                         "(scales are swizzled in 128-row tiles)")
    if (r1 - r0) * N // 2 >= 2**31 or M * K // 2 >= 2**40:
        raise ValueError("problem too large for the kernel's 32-bit output indexing")
    if scales:
        g_a = _tensor_scale("g_a", g_a, device)
        g_b = _tensor_scale("g_b", g_b, device)
    if out is not None:
        check_cuda_tensor("out", out, dtypes=(torch.bfloat16,))
        if tuple(out.shape) != (r1 - r0, N):
            raise ValueError(f"out has shape {tuple(out.shape)}; need [{r1 - r0}, {N}]")
        if out.device != device:
            raise ValueError(f"out is on {out.device}; the operands are on {device}")
    _check_epilogue_operands(gate, residual, r1 - r0, N, device)
    return M, N, K, r0, r1, g_a, g_b


def gemm_nvfp4(a_q, a_s, g_a, b_q, b_s, g_b, *, out=None, rows=None,
               config: BlockscaledGemmSm90 | None = None, gate=None, residual=None,
               prepacked=None, a16=None):
    """D = RN_bf16(g_a·g_b · Σ_k a_k b_k) for rows [r0, r1) of A (all rows by default): bf16
    [r1 - r0, N]. ``rows`` slices A without a copy (r0 a multiple of 128); ``out`` receives D.
    With ``gate`` (bf16 [N]) and ``residual`` (bf16 [r1 - r0, N]; may be ``out`` itself, for an
    in-place update) D is RN_bf16(residual + gate · that), bit-identical to
    numerics.epilogue.gate_residual of the plain output. ``config``: an f16 build
    (``reads_f16_activation``; default :func:`default_config`'s). ``prepacked``: the weight's
    register-order prepack (kernels.nvfp4.prepack), which the f16 builds read instead of
    b_q / b_s; ``a16``: the activation's exact f16 expansion, float16 [>= r1, K] (row i =
    e2m1 · s of a_q's row i, as quantize_expand_nvfp4 writes it), which they read instead of
    a_q / a_s. Either left out is made per call, a convenience that costs time: the prepack
    (kernels.nvfp4.prepack.prepack: torch ops, a few weight-sized passes) and the expansion of
    rows [r0, r1) (kernels.nvfp4.quantize.expand_nvfp4, into a scratch per (device, stream, rows,
    K): :func:`a16_scratch`); the same bits as when they are given. Compiled kernels are cached
    per static config (``BlockscaledGemmSm90.static_key``). A call whose :func:`signature`
    passed every check before skips them but the alignment checks."""
    try:
        key = signature(a_q, a_s, g_a, b_q, b_s, g_b, out, rows, config, gate, residual,
                        prepacked, a16)
        p = _PLANS.get(key)
    except (AttributeError, TypeError):  # a float g, a list rows, not tensors: the slow path
        key = p = None
    if p is not None and _aligned(a_q, a_s, g_a, b_q, b_s, g_b, out, gate, residual, prepacked,
                                  a16):
        return launch(p, a_q, a_s, g_a, b_q, b_s, g_b, out, gate, residual, prepacked, a16=a16)
    if config is not None and not isinstance(config, BlockscaledGemmSm90):
        raise TypeError(f"config must be a BlockscaledGemmSm90, got {type(config).__name__}")
    M, N, K, r0, r1, g_a, g_b = validate(a_q, a_s, g_a, b_q, b_s, g_b, out, rows, gate,
                                         residual)
    m = r1 - r0
    if a16 is not None:
        _check_a16(a16, r1, K, a_q.device)
    config = launch_config(config, m, N, K, a_q.device, gate, prepacked)
    if out is None:
        out = torch.empty(m, N, dtype=torch.bfloat16, device=a_q.device)
    if prepacked is None:  # the convenience: made per call
        prepacked = prepack(b_q, b_s)
    # the kernel's TMA reads f16 [m, K] from the a slot (the sfa slot is never read); no view
    # or slice unless rows asks for one (each costs host time)
    a_rows = _a16_rows(a16, a_q, a_s, r0, r1, M, K)
    words, tiles = config.workspace_floats(m, N, K, sm_count())  # checked in launch_config
    work = counters = None  # none: never dereferenced
    if words:  # fp32 partials and zeroed per-tile counters (the kernel re-arms them)
        work = torch.empty(words, dtype=torch.float32, device=a_q.device)
        counters = torch.zeros(tiles, dtype=torch.int32, device=a_q.device)
    # a grid of clusters is sized so that every cluster is resident at once (the K-split
    # cluster's CTAs wait only on each other, but a second round would double its time)
    scalars = (m, N, K // 32, cluster_ctas(config.cluster_n * config.cluster_k))
    ENTRY(config, config.static_key(),
          entry_buffers(a_rows, a_s, prepacked, g_a, g_b, out, _mailbox_address(), work,
                        counters, gate, residual), scalars)
    if key is not None:
        _PLANS.put(key, Plan(config, config.static_key(), scalars, M, r0,
                             r1, words, tiles, None if a16 is None else a16.shape[0]))
    return out


def _a16_rows(a16, a_q, a_s, r0: int, r1: int, M: int, K: int):
    """The f16 rows [r0, r1) the kernel reads, as bytes: ``a16``'s, or (``a16`` None) rows
    [r0, r1) of a_q / a_s expanded into this stream's scratch."""
    if a16 is not None:
        return (a16 if r0 == 0 and r1 == a16.shape[0] else a16[r0:r1]).view(torch.uint8)
    m = r1 - r0
    q = a_q if r0 == 0 and r1 == M else a_q[r0:r1]
    s = a_s if r0 == 0 and r1 == M else a_s[r0:r0 + scale_shape(m, K)[0]]  # whole 128-row tiles
    return expand_nvfp4(q, s, out=a16_scratch(m, K, a_q.device)).view(torch.uint8)


_A16_SCRATCH: dict = {}
A16_SCRATCH_MAX = 8  # (device, stream, rows, K) sets kept; then they start over


def a16_scratch(rows: int, K: int, device) -> torch.Tensor:
    """The f16 [rows, K] expansion buffer every call without ``a16`` of these rows and K on the
    current stream shares: calls on one stream run in order, so a call's expansion writes it
    only after the previous call's GEMM has read it (models.nvfp4_linear's activation scratch
    rule; at H3's full size one is 406 MB, so one a shape, not one a call)."""
    key = (str(device), torch.cuda.current_stream(device), rows, K)
    buf = _A16_SCRATCH.get(key)
    if buf is None:
        if len(_A16_SCRATCH) >= A16_SCRATCH_MAX:
            # a launch still reading an older set runs before any reuse of its memory: the
            # caching allocator hands a freed block only to later work on its own stream
            _A16_SCRATCH.clear()
        buf = _A16_SCRATCH[key] = torch.empty(rows, K, dtype=torch.float16, device=device)
    return buf


# --- the fast path: a signature that passed every check before ----------------------------------
class Plan(NamedTuple):
    """What a launch needs besides the tensors, from a call that passed every check."""

    config: BlockscaledGemmSm90
    static_key: tuple
    scalars: tuple
    M: int
    r0: int
    r1: int
    words: int  # the split-K / stream-K workspace's fp32 words (0: none)
    tiles: int
    a16_rows: int | None = None  # a16's rows (A comes from a16[r0:r1]); None: expanded per call


_PLANS = ffi.PlanCache()  # signature -> Plan


def _tensor_key(t):
    return (type(t), t.shape, t.dtype, t.device, t.is_contiguous())


def signature(a_q, a_s, g_a, b_q, b_s, g_b, out, rows, config, gate, residual, prepacked,
              a16=None):
    """The cache key of a call: everything the checks read but the buffers' addresses (every
    tensor's type, shape, dtype, device and contiguity; rows with their types; the config and
    the prepack objects themselves). Raises AttributeError or TypeError for arguments that have
    no key (a float g, a list rows, a non-tensor): those always take the checks."""
    if rows is not None:
        if type(rows) is not tuple or len(rows) != 2:
            raise TypeError
        rows = (rows[0], rows[1], type(rows[0]), type(rows[1]))
    return (_tensor_key(a_q), _tensor_key(a_s), _tensor_key(g_a), _tensor_key(b_q),
            _tensor_key(b_s), _tensor_key(g_b), None if out is None else _tensor_key(out),
            rows, config,
            None if gate is None else _tensor_key(gate),
            None if residual is None else _tensor_key(residual),
            None if prepacked is None else (prepacked, _tensor_key(prepacked.codes),
                                            _tensor_key(prepacked.scales)),
            None if a16 is None else _tensor_key(a16))


def _aligned(a_q, a_s, g_a, b_q, b_s, g_b, out, gate, residual, prepacked, a16=None) -> bool:
    """The alignment checks (16 bytes for codes, scales, a16 and out, 4 for the rest)."""
    p16 = a_q.data_ptr() | a_s.data_ptr() | b_q.data_ptr() | b_s.data_ptr()
    if a16 is not None:
        p16 |= a16.data_ptr()
    if out is not None:
        p16 |= out.data_ptr()
    if prepacked is not None:
        p16 |= prepacked.codes.data_ptr() | prepacked.scales.data_ptr()
    p4 = g_a.data_ptr() | g_b.data_ptr()
    if gate is not None:
        p4 |= gate.data_ptr() | residual.data_ptr()
    return not (p16 % 16 or p4 % 4)


def launch(p: Plan, a_q, a_s, g_a, b_q, b_s, g_b, out=None, gate=None, residual=None,
           prepacked=None, work=None, counters=None, a16=None):
    """Launch ``p`` on tensors that passed its checks (same signature, aligned): what
    gemm_nvfp4 does after validating, with nothing re-derived. ``work`` and ``counters``: a
    split-K workspace to reuse (counters zeroed once: the kernel re-arms them), else fresh.
    ``a16``: the f16 expansion the plan reads (its rows as the plan was checked with; None
    where the plan was made without it: expanded per call); ``prepacked`` None: made per
    call."""
    m = p.r1 - p.r0
    if out is None:
        out = torch.empty(m, p.scalars[1], dtype=torch.bfloat16, device=a_q.device)
    if not p.words:  # never dereferenced
        work = counters = None
    elif work is None:  # as gemm_nvfp4's split-K block allocates them
        work = torch.empty(p.words, dtype=torch.float32, device=a_q.device)
        counters = torch.zeros(p.tiles, dtype=torch.int32, device=a_q.device)
    if prepacked is None:
        prepacked = prepack(b_q, b_s)
    if p.a16_rows is not None:
        a_rows = (a16 if p.r0 == 0 and p.r1 == p.a16_rows else a16[p.r0:p.r1]).view(torch.uint8)
    else:
        a_rows = _a16_rows(None, a_q, a_s, p.r0, p.r1, p.M, p.scalars[2] * 32)
    ENTRY(p.config, p.static_key,
          entry_buffers(a_rows, a_s, prepacked, g_a, g_b, out, _mailbox_address(), work,
                        counters, gate, residual), p.scalars)
    return out


def launch_config(config, m: int, N: int, K: int, device, gate=None, prepacked=None):
    """The config a launch over m rows runs (``config``, or default_config(m, ...) when None),
    with the gated residual rule when ``gate`` is given; raises for what that config cannot
    run (not an f16 build, epilogue operands missing, prepack wrong, cluster pairing,
    workspace indexing). ``prepacked`` None passes: the call makes one. P2's ring calls it once
    for its largest chunk before any launch."""
    config = config or default_config(m, N, K)
    if not config.reads_f16_activation:
        raise ValueError("config must be an f16 build, reading the activation's f16 expansion "
                         "and the weight's prepack (BlockscaledGemmSm90.swap_ab_f16, wide_f16, "
                         "or a V3Study build)")
    if gate is not None and not isinstance(config.epilogue.output, GateResidualBf16):
        config = config.with_output(GATE_RESIDUAL)
    elif gate is None and config.epilogue.operands:
        raise ValueError(f"config's epilogue {type(config.epilogue.output).__name__} reads "
                         f"{config.epilogue.operands}: pass gate and residual")
    if prepacked is not None:
        _check_prepacked(prepacked, N, K, device)
    if config.cluster_n > 1 and -(-N // config.tile_n) % config.cluster_n:
        raise ValueError(f"config pairs CTAs on neighbouring {config.tile_n}-row weight tiles "
                         f"(activation multicast); N = {N} gives {-(-N // config.tile_n)} tiles, "
                         f"not a multiple of {config.cluster_n}")
    config.workspace_floats(m, N, K, sm_count())  # raises where the indexing would overflow
    return config


@functools.cache
def _mailbox_address() -> int:
    """The pinned-host diagnostics mailbox, as the address the kernel writes through."""
    return diagnostics_mailbox().data_ptr()
