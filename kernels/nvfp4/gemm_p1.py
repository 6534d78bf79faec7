"""``gemm_nvfp4_p1``: P1 from torch, the activation quantized inside the GEMM (notes/p1.md).

D = RN_bf16(g_x·g_w · Σ_k q(x)_k w_k) where q(x) is Comfy Kitchen's NVFP4 quantization of the
bf16 activation ``x`` with tensor scale ``g_x`` (numerics.nvfp4; on the device
device.nvfp4.quantize_block16), done per CTA tile and k-block inside the GEMM
(kernels.nvfp4.gemm_shell.P1Study): no packed activation or activation scale tensor exists in
global memory. Bit-identical to gemm_nvfp4 on quantize_nvfp4(x, g_x)'s output with the same
swap-AB config. The weight comes as its register-order prepack (kernels.nvfp4.prepack) with
its tensor scale ``g_w``. Every input is checked before the launch.
"""
from __future__ import annotations

import torch

from device.ffi import require_hopper
from device.runtime import check_cuda_tensor, cluster_ctas, sm_count
from epilogues.tile_store import workspace_floats
from kernels.nvfp4.gemm import (GATE_RESIDUAL, _check_epilogue_operands, _mailbox_address,
                                k_splits)
from kernels.nvfp4.gemm import default_config as p0_default_config
from kernels.nvfp4.gemm_shell import ENTRY, BlockscaledGemmSm90, P1Study, entry_buffers
from kernels.nvfp4.prepack import weight_rows
from numerics.nvfp4 import BLOCK
from producers.register_order import Bf16RegisterOrderProducer

_DEFAULT = {}


def default_config(splits: int = 1) -> BlockscaledGemmSm90:
    """The P1 baseline build (C = G = 1) at ``splits`` K splits, one object per split count."""
    if splits not in _DEFAULT:
        _DEFAULT[splits] = P1Study(splits=splits).build()
    return _DEFAULT[splits]


def choose_config(M: int, N: int, K: int, sms: int | None = None):
    """(P1's build for an M x N x K call, whether its bits are P0's default call's): the
    baseline at the K split P0's chooser gives its swap-AB f16 build, so where P0 runs that
    build without stream-K the two are the same sums in the same order (bit-identical); where
    P0 takes stream-K or the 256-token build, P1 runs the same split rule and its bits differ
    from P0's default (they equal gemm_nvfp4 on the same swap-AB config)."""
    sms = sms or sm_count()
    p0 = p0_default_config(M, N, K, sms)
    # P0's swap-AB f16 build (128 tokens a tile; the 256-token build has 256), on the split rule
    same = p0.tile_m == 128 and not p0.stream_k
    return default_config(k_splits(M, N, K, sms)), same


def validate(x, g_x, prepacked, g_w, out, gate=None, residual=None):
    """All checks, in order; returns (M, N, K). Raises before any launch."""
    require_hopper()
    check_cuda_tensor("x", x, dtypes=(torch.bfloat16,))
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous 2-D bf16 [M, K]; got shape {tuple(x.shape)}, "
                         f"contiguous={x.is_contiguous()}")
    M, K = x.shape
    if M == 0 or K == 0 or K % 32:
        raise ValueError(f"x is [{M}, {K}]: need M >= 1 and K a positive multiple of 32 "
                         f"(NVFP4 blocks of {BLOCK}, TMA rows of 16-byte units)")
    N = weight_rows(prepacked, K)
    for name, g in (("g_x", g_x), ("g_w", g_w)):
        check_cuda_tensor(name, g, dtypes=(torch.float32,), align=4)
        if g.numel() != 1:
            raise ValueError(f"{name} must hold one fp32 value; it has {g.numel()}")
    for name, t in (("g_x", g_x), ("g_w", g_w), ("prepacked.codes", prepacked.codes),
                    ("prepacked.scales", prepacked.scales)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}; x is on {x.device}")
    if out is not None:
        check_cuda_tensor("out", out, dtypes=(torch.bfloat16,))
        if tuple(out.shape) != (M, N) or out.device != x.device:
            raise ValueError(f"out must be bf16 [{M}, {N}] on {x.device}; got "
                             f"{tuple(out.shape)} on {out.device}")
    if M * N >= 2**31:
        raise ValueError("problem too large for the kernel's 32-bit output indexing")
    _check_epilogue_operands(gate, residual, M, N, x.device)
    return M, N, K


def gemm_nvfp4_p1(x, g_x, prepacked, g_w, *, out=None, config: BlockscaledGemmSm90 | None = None,
                  gate=None, residual=None):
    """bf16 [M, N] = x·Wᵀ with x quantized inside the GEMM (module docstring). ``g_x``: fp32 [1]
    on the device, g = global_scale_from_amax(amax(x)) (kernels.nvfp4.amax, numerics.nvfp4);
    ``prepacked``: the weight's register-order prepack; ``g_w``: its fp32 [1] tensor scale.
    ``config``: a P1Study build (default: :func:`choose_config`'s). With ``gate`` (bf16 [N])
    and ``residual`` (bf16 [M, N]; may be ``out`` itself) the store is P4's gated residual add,
    as gemm_nvfp4's."""
    M, N, K = validate(x, g_x, prepacked, g_w, out, gate, residual)
    config = config or choose_config(M, N, K)[0]
    if not isinstance(config.producer, Bf16RegisterOrderProducer):
        raise TypeError("config must be a P1 build (kernels.nvfp4.gemm_shell.P1Study)")
    if gate is not None:
        config = config.with_output(GATE_RESIDUAL)
    elif config.epilogue.operands:
        raise ValueError("config's epilogue reads gate and residual: pass both")
    if config.cluster_n > 1 and -(-N // config.tile_n) % config.cluster_n:
        raise ValueError(f"config clusters {config.cluster_n} CTAs on neighbouring "
                         f"{config.tile_n}-row weight tiles; "
                         f"N = {N} gives {-(-N // config.tile_n)} tiles, not a multiple of "
                         f"{config.cluster_n}")
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    tiles = -(-M // config.tile_m) * -(-N // config.tile_n)
    words = workspace_floats(config.splits, tiles, config.tile_m, config.tile_n)
    if words:
        if words >= 2**31:
            raise ValueError(f"split-K workspace of {config.splits} splits exceeds 32-bit "
                             "indexing; use fewer splits")
        work = torch.empty(words, dtype=torch.float32, device=x.device)
        counters = torch.zeros(tiles, dtype=torch.int32, device=x.device)
    else:  # never dereferenced
        work = counters = None
    xb = x.view(torch.uint8)  # the kernel reads it as bf16 [M, K] (its TMA view)
    ENTRY(config, config.static_key(),
          entry_buffers(xb, xb, prepacked, g_x, g_w, out, _mailbox_address(), work, counters,
                        gate, residual),
          (M, N, K // 32, cluster_ctas(config.cluster_n)))
    return out


DUMP_POISON = -0x5A5A5A5B  # 0xA5A5A5A5: what a word no tile wrote keeps
_DUMP: dict = {}  # the debug build's config, made once


def gemm_nvfp4_p1_dump(x, g_x, prepacked, g_w, *, config: BlockscaledGemmSm90 | None = None):
    """The debug build (P1Study(dump=True)): the GEMM as :func:`gemm_nvfp4_p1`, and what every
    consumed tile's quantizer produced, one copy per weight tile (each output-N CTA quantizes
    its activation tile again): (out bf16 [M, N], codes uint8 [n_tiles, M, K/2] in the packed
    activation's byte order, scales uint8 [n_tiles, M, K/16] row-major, not swizzled,
    unwritten: a 0-d int64 tensor counting the (weight tile, row, k-block) cells no tile wrote:
    their scale word keeps DUMP_POISON, which no E4M3 scale byte (<= 0x7E) can form)."""
    M, N, K = validate(x, g_x, prepacked, g_w, None)
    config = config or _DUMP.get("config") or _DUMP.setdefault("config",
                                                             P1Study(dump=True).build())
    if not getattr(config.activation, "dump", False):
        raise TypeError("config must be P1's debug build (P1Study(dump=True))")
    n_tiles, k_tiles = -(-N // config.tile_n), -(-K // 64)
    words = n_tiles * M * k_tiles * 9
    if words >= 2**31:
        raise ValueError(f"the dump of {n_tiles} weight tiles x {M} rows x K = {K} exceeds "
                         "32-bit indexing; use a smaller problem")
    dump = torch.full((words,), DUMP_POISON, dtype=torch.int32, device=x.device)
    out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    xb = x.view(torch.uint8)
    ENTRY(config, config.static_key(),  # the dump in the workspace slot (never added to)
          entry_buffers(xb, xb, prepacked, g_x, g_w, out, _mailbox_address(), dump),
          (M, N, K // 32, sm_count()))
    cells = dump.view(n_tiles, M, k_tiles, 9)
    codes = cells[..., :8].contiguous().view(torch.uint8).reshape(n_tiles, M, k_tiles * 32)
    scales = cells[..., 8:].contiguous().view(torch.uint8).reshape(n_tiles, M, k_tiles * 4)
    unwritten = (cells[..., 8] == DUMP_POISON).sum()
    return out, codes[..., :K // 2], scales[..., :K // 16], unwritten

