"""Thin PTX wrappers: one instruction (or a short fixed sequence) each, named so the compile
census can see it. ``asm`` is the one inline-asm entry every device helper goes through."""
from __future__ import annotations

import os

from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint32  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402


def asm(ret, args, text, constraints, loc, ip):
    return llvm.inline_asm(ret, [a.ir_value(loc=loc, ip=ip) for a in args], text, constraints,
                           has_side_effects=False, is_align_stack=False,
                           asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def fmul_ftz(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """IEEE fp32 multiply, denormals flushed (FMUL.FTZ)."""
    return Float32(asm(T.f32(), [Float32(a), Float32(b)], "mul.ftz.f32 $0, $1, $2;", "=f,f,f",
                        loc, ip))

@dsl_user_op
def fmul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """IEEE fp32 multiply with denormals (``mul.rn``: the explicit rounding mode keeps ptxas from
    contracting it with a following add into an FMA)."""
    return Float32(asm(T.f32(), [Float32(a), Float32(b)], "mul.rn.f32 $0, $1, $2;", "=f,f,f",
                        loc, ip))

@dsl_user_op
def fadd_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """IEEE fp32 add with denormals (``add.rn``: never contracted into an FMA)."""
    return Float32(asm(T.f32(), [Float32(a), Float32(b)], "add.rn.f32 $0, $1, $2;", "=f,f,f",
                        loc, ip))

@dsl_user_op
def fma_rn(a: Float32, b: Float32, c: Float32, *, loc=None, ip=None) -> Float32:
    """``fma.rn.f32``: a · b + c with one rounding."""
    return Float32(asm(T.f32(), [Float32(a), Float32(b), Float32(c)], "fma.rn.f32 $0, $1, $2, $3;",
                       "=f,f,f,f", loc, ip))

@dsl_user_op
def rcp_approx(a: Float32, *, loc=None, ip=None) -> Float32:
    """``rcp.approx.f32``: 1 / a within an ulp, subnormal results kept (no flush)."""
    return Float32(asm(T.f32(), [Float32(a)], "rcp.approx.f32 $0, $1;", "=f,f", loc, ip))

@dsl_user_op
def rcp_approx_ftz(a: Float32, *, loc=None, ip=None) -> Float32:
    """MUFU.RCP; its bits are modelled by numerics.rcp_approx."""
    return Float32(asm(T.f32(), [Float32(a)], "rcp.approx.ftz.f32 $0, $1;", "=f,f", loc, ip))

@dsl_user_op
def fmin_nan_ignoring(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``fminf``: a NaN operand yields the other operand."""
    return Float32(asm(T.f32(), [Float32(a), Float32(b)], "min.f32 $0, $1, $2;", "=f,f,f",
                        loc, ip))

@dsl_user_op
def fmax_abs(acc: Float32, x: Float32, *, loc=None, ip=None) -> Float32:
    """max(acc, |x|) ignoring NaN (``__hmax`` semantics; all-NaN stays NaN)."""
    return Float32(asm(T.f32(), [Float32(acc), Float32(x)],
                        "{ .reg .f32 t; abs.f32 t, $2; max.f32 $0, $1, t; }", "=f,f,f", loc, ip))

@dsl_user_op
def prmt(a: Uint32, b: Uint32, selector: int, *, loc=None, ip=None) -> Uint32:
    """``prmt.b32``: bytes of {b, a} picked by the four selector nibbles."""
    return Uint32(asm(T.i32(), [Uint32(a), Uint32(b)], f"prmt.b32 $0, $1, $2, {selector:#x};",
                       "=r,r,r", loc, ip))

@dsl_user_op
def bf16_lo(word: Uint32, *, loc=None, ip=None) -> Float32:
    """The bf16 in the low half of a word, as fp32 (exact)."""
    return Float32(asm(T.f32(), [Uint32(word)], "{ .reg .b32 t; shl.b32 t, $1, 16; "
                        "mov.b32 $0, t; }", "=f,r", loc, ip))

@dsl_user_op
def bf16_hi(word: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(asm(T.f32(), [Uint32(word)], "{ .reg .b32 t; and.b32 t, $1, 0xFFFF0000; "
                        "mov.b32 $0, t; }", "=f,r", loc, ip))

@dsl_user_op
def f16_lo(word: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(asm(T.f32(), [Uint32(word)], "{ .reg .b16 l, h; mov.b32 {l, h}, $1; "
                        "cvt.f32.f16 $0, l; }", "=f,r", loc, ip))

@dsl_user_op
def f16_hi(word: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(asm(T.f32(), [Uint32(word)], "{ .reg .b16 l, h; mov.b32 {l, h}, $1; "
                        "cvt.f32.f16 $0, h; }", "=f,r", loc, ip))


@dsl_user_op
def smem_u32(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """The 32-bit shared-memory address of ``ptr``."""
    return Int32(llvm.ptrtoint(T.i32(), ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip))

@dsl_user_op
def bulk_copy_g2s(dst: cute.Pointer, src: cute.Pointer, size: int, mbar: cute.Pointer, *,
                  loc=None, ip=None):
    """``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes``: ``size`` bytes
    (a multiple of 16; both ends 16-byte aligned) from global ``src`` into this CTA's shared
    ``dst``, completing that many bytes on ``mbar``."""
    d = llvm.ptrtoint(T.i32(), dst.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)
    s = llvm.ptrtoint(T.i64(), src.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)
    b = llvm.ptrtoint(T.i32(), mbar.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)
    llvm.inline_asm(None, [d, s, Int32(size).ir_value(loc=loc, ip=ip), b],
                    "{ .reg .u64 g; cvta.to.global.u64 g, $1; "
                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                    "[$0], [g], $2, [$3]; }", "r,l,r,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


# ---- cross-CTA handoffs (the depth frame's counters and cluster-pair partials) -------------
def _asm_effect(ret, args, text, constraints, loc, ip):
    """Inline asm that must not be hoisted, merged or dropped (a spin's load, a signal)."""
    return llvm.inline_asm(ret, args, text, constraints, has_side_effects=True,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _gaddr(ptr, loc, ip):
    return llvm.ptrtoint(T.i64(), ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)


def _saddr(ptr, loc, ip):
    return llvm.ptrtoint(T.i32(), ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)


@dsl_user_op
def ld_acquire_gpu(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """``ld.acquire.gpu.global.b32``: a counter's value, ordering every later read after the
    writes its signallers released."""
    return Int32(_asm_effect(T.i32(), [_gaddr(ptr, loc, ip)], "ld.acquire.gpu.global.b32 $0, [$1];",
                             "=r,l", loc, ip))


@dsl_user_op
def red_release_gpu_add(ptr: cute.Pointer, value: Int32, *, loc=None, ip=None) -> None:
    """``red.release.gpu.global.add.s32``: a signal, after every write before it is visible."""
    _asm_effect(None, [_gaddr(ptr, loc, ip), Int32(value).ir_value(loc=loc, ip=ip)],
                "red.release.gpu.global.add.s32 [$0], $1;", "l,r", loc, ip)


@dsl_user_op
def st_cluster_u32(ptr: cute.Pointer, rank: Int32, value: Int32, *, loc=None, ip=None) -> None:
    """Store ``value`` at ``ptr``'s offset in the shared memory of cluster CTA ``rank``
    (``mapa`` + ``st.shared::cluster``)."""
    _asm_effect(None, [_saddr(ptr, loc, ip), Int32(rank).ir_value(loc=loc, ip=ip),
                       Int32(value).ir_value(loc=loc, ip=ip)],
                "{ .reg .b32 r; mapa.shared::cluster.u32 r, $0, $1; "
                "st.shared::cluster.u32 [r], $2; }", "r,r,r", loc, ip)


@dsl_user_op
def arrive_cluster_release(mbar: cute.Pointer, rank: Int32, *, loc=None, ip=None) -> None:
    """Arrive on the mbarrier at ``mbar``'s offset in cluster CTA ``rank``, releasing this
    thread's earlier writes (to that CTA's shared memory too) at cluster scope."""
    _asm_effect(None, [_saddr(mbar, loc, ip), Int32(rank).ir_value(loc=loc, ip=ip)],
                "{ .reg .b32 r; mapa.shared::cluster.u32 r, $0, $1; "
                "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r]; }", "r,r", loc, ip)


@dsl_user_op
def arrive_expect_tx_cluster(mbar: cute.Pointer, rank: Int32, tx_bytes: int, *, loc=None,
                             ip=None) -> None:
    """Arrive on the mbarrier at ``mbar``'s offset in cluster CTA ``rank`` and raise its phase's
    transaction count by ``tx_bytes`` (bytes a bulk copy into that CTA then completes). The
    default semantics (release at CTA scope, as CUTLASS's cluster barriers): the bytes' arrival
    is the transaction count's, so no cluster-scope fence is needed."""
    _asm_effect(None, [_saddr(mbar, loc, ip), Int32(rank).ir_value(loc=loc, ip=ip),
                       Int32(tx_bytes).ir_value(loc=loc, ip=ip)],
                "{ .reg .b32 r; mapa.shared::cluster.u32 r, $0, $1; "
                "mbarrier.arrive.expect_tx.shared::cluster.b64 _, [r], $2; }",
                "r,r,r", loc, ip)


@dsl_user_op
def bulk_copy_s2peer(src: cute.Pointer, size: int, mbar: cute.Pointer, rank: Int32, *,
                     loc=None, ip=None) -> None:
    """``cp.async.bulk.shared::cluster.shared::cta``: ``size`` bytes (a multiple of 16, 16-byte
    aligned) of this CTA's shared memory at ``src`` to the same offset in cluster CTA ``rank``,
    completing them on that CTA's mbarrier at ``mbar``'s offset. The bytes travel through the
    async proxy, so the peer's wgmmas may read them once that phase completes (TMA's
    contract); the writer's generic stores to ``src`` need a ``fence.proxy.async`` first."""
    _asm_effect(None, [_saddr(src, loc, ip), Int32(size).ir_value(loc=loc, ip=ip),
                       _saddr(mbar, loc, ip), Int32(rank).ir_value(loc=loc, ip=ip)],
                "{ .reg .b32 d, m; mapa.shared::cluster.u32 d, $0, $3; "
                "mapa.shared::cluster.u32 m, $2, $3; "
                "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
                "[d], [$0], $1, [m]; }", "r,r,r,r", loc, ip)


@dsl_user_op
def try_wait_acquire_cluster(mbar: cute.Pointer, parity: Int32, *, loc=None, ip=None) -> Int32:
    """1 when this CTA's mbarrier has completed the phase of ``parity``, acquiring at cluster
    scope what its arrivers released; else 0 (after the hardware's suspend time)."""
    return Int32(_asm_effect(
        T.i32(), [_saddr(mbar, loc, ip), Int32(parity).ir_value(loc=loc, ip=ip)],
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [$1], $2; "
        "selp.u32 $0, 1, 0, p; }", "=r,r,r", loc, ip))


@dsl_user_op
def st_cluster_f32x2(ptr: cute.Pointer, rank: Int32, a: Float32, b: Float32, *, loc=None,
                     ip=None) -> None:
    """Store two fp32 at ``ptr``'s offset (8-byte aligned) in the shared memory of cluster CTA
    ``rank`` (``mapa`` + ``st.shared::cluster.v2.f32``): a split tile's partial sums."""
    _asm_effect(None, [_saddr(ptr, loc, ip), Int32(rank).ir_value(loc=loc, ip=ip),
                       Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                "{ .reg .b32 r; mapa.shared::cluster.u32 r, $0, $1; "
                "st.shared::cluster.v2.f32 [r], {$2, $3}; }", "r,r,f,f", loc, ip)


@dsl_user_op
def st_cluster_f32x4(ptr: cute.Pointer, rank: Int32, words, *, loc=None, ip=None) -> None:
    """Store four fp32 at ``ptr``'s offset (16-byte aligned) in the shared memory of cluster
    CTA ``rank`` (``mapa`` + ``st.shared::cluster.v4.f32``): a K-split cluster's partial sums
    (epilogues.tile_store.ClusterSplitStore)."""
    _asm_effect(None, [_saddr(ptr, loc, ip), Int32(rank).ir_value(loc=loc, ip=ip)]
                + [Float32(w).ir_value(loc=loc, ip=ip) for w in words],
                "{ .reg .b32 r; mapa.shared::cluster.u32 r, $0, $1; "
                "st.shared::cluster.v4.f32 [r], {$2, $3, $4, $5}; }", "r,r,f,f,f,f", loc, ip)


@dsl_user_op
def ld_shared_v4_f32(ptr: cute.Pointer, *, loc=None, ip=None) -> list:
    """``ld.shared.v4.f32`` at ``ptr`` (this CTA, 16-byte aligned): four fp32, read after the
    wait that acquired the peers' writes (not hoisted above it: a side effect)."""
    res = _asm_effect(llvm.StructType.get_literal([T.f32()] * 4), [_saddr(ptr, loc, ip)],
                      "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,r", loc, ip)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def fence_proxy_async_global(*, loc=None, ip=None) -> None:
    """``fence.proxy.async.global``: order this thread's generic-proxy global accesses with
    async-proxy ones (a bulk copy that another CTA issues after acquiring this CTA's signal
    reads what the generic stores wrote)."""
    _asm_effect(None, [], "fence.proxy.async.global;", "", loc, ip)


@dsl_user_op
def ld_relaxed_gpu_f32(ptr: cute.Pointer, *, loc=None, ip=None) -> Float32:
    """``ld.relaxed.gpu.global.f32``: a value another CTA wrote in this launch (coherent at
    L2, never a stale L1 line), read after an acquire ordered it."""
    return Float32(_asm_effect(T.f32(), [_gaddr(ptr, loc, ip)],
                               "ld.relaxed.gpu.global.f32 $0, [$1];", "=f,l", loc, ip))


@dsl_user_op
def fence_proxy_async_shared_cta(*, loc=None, ip=None) -> None:
    """``fence.proxy.async.shared::cta``: this thread's generic shared-memory writes become
    visible to the async proxy (the wgmma that reads the rewritten stage)."""
    _asm_effect(None, [], "fence.proxy.async.shared::cta;", "", loc, ip)


@dsl_user_op
def ld_relaxed_gpu_v4(ptr: cute.Pointer, *, loc=None, ip=None) -> list:
    """``ld.relaxed.gpu.global.v4.b32``: 16 bytes (16-byte aligned) another CTA wrote in this
    launch, as four 32-bit words (coherent at L2, never a stale L1 line), read after an
    acquire ordered them."""
    res = _asm_effect(llvm.StructType.get_literal([T.i32()] * 4), [_gaddr(ptr, loc, ip)],
                      "ld.relaxed.gpu.global.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
                      loc, ip)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_relaxed_gpu_u32(ptr: cute.Pointer, *, loc=None, ip=None) -> Uint32:
    """``ld.relaxed.gpu.global.b32``: :func:`ld_relaxed_gpu_f32`'s 32-bit word."""
    return Uint32(_asm_effect(T.i32(), [_gaddr(ptr, loc, ip)],
                              "ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l", loc, ip))


@dsl_user_op
def ld_shared_v4(addr: Int32, *, loc=None, ip=None) -> list:
    """``ld.shared.v4.b32`` at 32-bit shared address ``addr`` (16-byte aligned): four words."""
    res = _asm_effect(llvm.StructType.get_literal([T.i32()] * 4),
                      [Int32(addr).ir_value(loc=loc, ip=ip)],
                      "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", loc, ip)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def st_shared_v4(addr: Int32, words: list, *, loc=None, ip=None) -> None:
    """``st.shared.v4.b32`` of four words at 32-bit shared address ``addr`` (16-byte aligned)."""
    _asm_effect(None, [Int32(addr).ir_value(loc=loc, ip=ip)] +
                [Uint32(w).ir_value(loc=loc, ip=ip) for w in words],
                "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", loc, ip)


# ---- programmatic dependent launch, and the timing-perturbation debug build ----------------
# The fast loop's kernels order themselves only through these two wrappers (their other
# synchronisation is inside a CTA or a cluster). With $WB_PERTURB_TIMING set when a kernel is
# traced, each of them also sleeps a short per-CTA pseudo-random time, to widen the windows of
# any race between kernels (a read before the wait of data a predecessor writes, a missing
# edge between streams): a debug build, never a default. The default build emits exactly the
# griddepcontrol instruction, so its PTX is unchanged. Every compile-cache key of a kernel that
# calls them names ``timing_perturbation()``.
PERTURB_ENV = "WB_PERTURB_TIMING"
PERTURB_DEFAULT_NS = 2000  # "1": up to ~2 us a point (nanosleep may take 2x), a kernel's span
PERTURB_MAX_NS = 1_000_000  # nanosleep's own bound


def timing_perturbation() -> int:
    """The perturbed build's sleep bound in ns, read from $WB_PERTURB_TIMING ("" or "0": the
    default build, 0; "1": PERTURB_DEFAULT_NS; else a bound in ns)."""
    raw = os.environ.get(PERTURB_ENV, "").strip()
    if raw in ("", "0"):
        return 0
    try:
        ns = PERTURB_DEFAULT_NS if raw == "1" else int(raw)
    except ValueError:
        ns = 0
    if not 1 <= ns <= PERTURB_MAX_NS:
        raise ValueError(f"${PERTURB_ENV}={raw!r}: 0 (off), 1 ({PERTURB_DEFAULT_NS} ns) or a "
                         f"bound in ns up to {PERTURB_MAX_NS}")
    return ns


@dsl_user_op
def nanosleep(ns: Uint32, *, loc=None, ip=None) -> None:
    """``nanosleep.u32``: suspend the thread for about ``ns`` (0 to 2·ns), never reordered
    with the memory accesses around it."""
    _asm_effect(None, [Uint32(ns).ir_value(loc=loc, ip=ip)], "nanosleep.u32 $0;",
                "r,~{memory}", loc, ip)


def perturb_timing(salt: int) -> None:
    """In the perturbed build, sleep a per-CTA pseudo-random 0..bound ns (a hash of the CTA
    index, the salt and %globaltimer in ~1 us steps, so a CTA's threads nearly always agree
    and each replay draws anew); in the default build, nothing."""
    bound = timing_perturbation()
    if not bound:
        return
    bx, by, bz = cute.arch.block_idx()
    h = Uint32(cute.arch.globaltimer_lo()) >> Uint32(10)
    h = h + Uint32(bx) * Uint32(0x9E3779B1) + Uint32(by) * Uint32(0x85EBCA77) \
        + Uint32(bz) * Uint32(0xC2B2AE3D) + Uint32(salt)
    for shift, mul in ((16, 0x7FEB352D), (15, 0x846CA68B)):  # an integer hash's finaliser
        h = (h ^ (h >> Uint32(shift))) * Uint32(mul)
    h = h ^ (h >> Uint32(16))
    nanosleep(h % Uint32(bound + 1))


def pdl_launch_dependents() -> None:
    """``griddepcontrol.launch_dependents``; the perturbed build sleeps before it (which CTA
    releases the grid last varies) and after it (the writes a dependent must not read before
    its wait land later)."""
    perturb_timing(0x1)
    cute.arch.griddepcontrol_launch_dependents()
    perturb_timing(0x2)


def pdl_wait() -> None:
    """``griddepcontrol.wait``; the perturbed build sleeps after it."""
    cute.arch.griddepcontrol_wait()
    perturb_timing(0x3)
