"""wgmma as inline PTX, A in registers or shared memory: the one definition the wgmma
kernels share (kernels/depth/gemm_skinny_rwgmma.py: bf16 weights; consumers/register_a_wgmma.py:
exact f16 expansions of NVFP4 weights).

``wgmma.mma_async.sync.aligned.m64nNk16.f32.{dtype}.{dtype}``: A is four 32-bit registers a
thread (the m64k16 fragment: register j holds rows groupID + 8·(j & 1), k = 2·tig + 8·(j >> 1)
and k + 1), B a shared-memory descriptor (K-major), D N/2 fp32 registers a thread. Issue only
between ``warpgroup.fence()`` and ``commit_group()`` / ``wait_group()``; the A registers must
not change until the group that reads them has retired.
"""
from __future__ import annotations

from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Float32, Int64, Uint32  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

RS_DTYPES = ("bf16", "f16")


def _wgmma(acc, operands, constraints, operand_text: str, dtype: str, loc, ip):
    """``wgmma.mma_async.sync.aligned.m64nNk16.f32.{dtype}.{dtype}`` on the fp32 accumulators
    ``acc`` (N / 2 a thread, tied in and out) with the A / B operands given as their inline-asm
    values, constraints and text (whatever follows D); returns the new accumulators."""
    na = len(acc)
    d = ",".join(f"${i}" for i in range(na))
    ops = [Float32(x).ir_value(loc=loc, ip=ip) for x in acc] + operands
    cons = ",".join(["=f"] * na + [str(i) for i in range(na)] + constraints)
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * na), ops,
        "{ .reg .pred p; setp.ne.b32 p, 1, 0; "
        f"wgmma.mma_async.sync.aligned.m64n{2 * na}k16.f32.{dtype}.{dtype} {{{d}}}, "
        f"{operand_text}; }}",
        cons, has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(na)]


@dsl_user_op
def wgmma_rs_m64k16(acc, a, desc_b, dtype: str = "bf16", *, loc=None, ip=None):
    """acc (N / 2 fp32 a thread, a list) += A (4 words) · B^T; returns the new accumulators."""
    if dtype not in RS_DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose from {RS_DTYPES}")
    na = len(acc)
    a_regs = ",".join(f"${2 * na + i}" for i in range(4))
    return _wgmma(acc, [Uint32(x).ir_value(loc=loc, ip=ip) for x in a]
                  + [Int64(desc_b).ir_value(loc=loc, ip=ip)], ["r"] * 4 + ["l"],
                  f"{{{a_regs}}}, ${2 * na + 4}, p, 1, 1, 0", dtype, loc, ip)


@dsl_user_op
def wgmma_ss_m64k16(acc, desc_a, desc_b, *, loc=None, ip=None):
    """bf16 x bf16 with both operands in shared memory (K-major descriptors): acc (N / 2 fp32 a
    thread) += A · B^T."""
    na = len(acc)
    return _wgmma(acc, [Int64(desc_a).ir_value(loc=loc, ip=ip),
                        Int64(desc_b).ir_value(loc=loc, ip=ip)], ["l", "l"],
                  f"${2 * na}, ${2 * na + 1}, p, 1, 1, 0, 0", "bf16", loc, ip)


def sw128_kmajor_descriptor(start_addr, sbo_bytes: int = 1024) -> Int64:
    """A K-major, 128-byte-swizzled shared-memory matrix descriptor (sm_90 GMMA): start
    address and SBO (8-row atoms, ``sbo_bytes`` apart) in 16-byte units, LBO 1 (unused for
    swizzled K-major), layout type 1 = SWIZZLE_128B in bits 62-63."""
    return Int64((start_addr >> 4) & 0x3FFF) | Int64(1 << 16) | (Int64(sbo_bytes >> 4) << 32) \
        | (Int64(1) << 62)

