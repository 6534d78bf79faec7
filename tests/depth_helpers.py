"""Shared helpers of the depth-kernel tests (tests/test_gemv_small_m.py ... test_depth_draw.py).

References that round as the kernels do. Each one follows its kernel's operation order: fp32 sums
in the kernel's summation tree (a lane's terms in sequence, the warp's butterfly, the warps in
order), bf16 roundings exactly where the kernel rounds, and the two transcendental steps by the
torch CUDA ops that compile to the kernel's instructions: ``torch.rsqrt`` is CUDA's ``rsqrtf``
(``rsqrt.approx.f32``, as ``cute.math.rsqrt``) and ``torch.exp`` is CUDA's ``expf``, the
``ex2.approx`` sequence that ``cute.math.exp`` inlines. So on the GPU they give the kernels' bits;
on the CPU they follow the same order (the CPU tests check that order, not the bits).

Where the order is the hardware's own (the tensor cores' sums) the check is a derived bound
instead: :func:`fp32_sum_bound`, numerics.gemm_oracle's bound for fp32 summation in any order.
"""
from __future__ import annotations

import torch

from numerics.gemm_oracle import fp32_error_bound, gamma

WARP = 32
F64_U = 2.0**-53  # float64 unit roundoff: the slack of the float64 reference sums


def randn_bf16(*shape, g, scale=1.0, device="cuda"):
    """Fresh N(0, scale^2) data rounded to bf16."""
    return (torch.randn(*shape, device=device, generator=g) * scale).to(torch.bfloat16)


def norm_weight(n, g, spread=0.1, device="cuda"):
    """A norm's gamma near 1, bf16."""
    return (1 + spread * torch.randn(n, device=device, generator=g)).to(torch.bfloat16)


def poison(*shape, dtype=torch.bfloat16, device="cuda"):
    """An output buffer of NaN: every element a kernel leaves unwritten stays NaN."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def bf16(t: torch.Tensor) -> torch.Tensor:
    """``cvt.rn.bf16.f32``: fp32 rounded to nearest-even bf16, kept as fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


def f32(value: float, like: torch.Tensor) -> torch.Tensor:
    """A kernel constant ``Float32(value)``: RN_fp32(value) as a tensor on ``like``'s device (a
    Python float added to a tensor may be applied in float64)."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


# ---- the kernels' summation trees -----------------------------------------------------------
def butterfly_sum(t: torch.Tensor) -> torch.Tensor:
    """``cute.arch.warp_reduction`` over the last dim (a power of two of lanes): shuffles with
    offsets n/2, ..., 1, each lane adding its partner's value. Every lane ends with the same
    sum (fp32 addition commutes), lane 0's: halves added pairwise, level by level."""
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t[..., 0]


def sequential_sum(t: torch.Tensor) -> torch.Tensor:
    """``acc = 0; acc = acc + t_i`` over the last dim, in order, in t's dtype."""
    acc = torch.zeros(t.shape[:-1], dtype=t.dtype, device=t.device)
    for i in range(t.shape[-1]):
        acc = acc + t[..., i]
    return acc


def block_sum(terms: torch.Tensor) -> torch.Tensor:
    """The sum every depth kernel forms over a CTA: ``terms`` [..., warps, 32 lanes, L], each
    lane adding its L terms in order, the warp's butterfly, then the warps' sums in order."""
    lanes = sequential_sum(terms)  # [..., warps, 32]
    return sequential_sum(butterfly_sum(lanes))


def row_terms(t: torch.Tensor, threads: int) -> torch.Tensor:
    """[..., K] -> [..., warps, 32, K / threads]: the order in which ``threads`` threads hold a
    row in 16-byte chunks of 8 elements, thread j chunks j, j + threads, ... (rows_rmsnorm,
    the draw's norm; one warp: the GEMV's norm prologue and its dot products)."""
    *lead, K = t.shape
    per = K // (8 * threads)
    v = t.reshape(*lead, per, threads // WARP, WARP, 8)
    n = len(lead)
    v = v.permute(*range(n), n + 1, n + 2, n, n + 3)  # [..., warps, lanes, chunk, element]
    return v.reshape(*lead, threads // WARP, WARP, per * 8)


# ---- RMSNorm and the SwiGLU epilogue as the kernels round ----------------------------------
def rms_factor(sum_sq: torch.Tensor, n: int, eps: float) -> torch.Tensor:
    """device.rounding.rms_factor: rsqrt(sum_sq · RN(1/n) + RN(eps)) (the product is
    exact for n a power of two, so the fused multiply-add rounds as the add)."""
    return torch.rsqrt(sum_sq * f32(1.0 / n, sum_sq) + f32(eps, sum_sq))


def rms_norm_reference(x: torch.Tensor, gamma_: torch.Tensor, eps: float,
                       threads: int) -> torch.Tensor:
    """``bf16(gamma · bf16(x · r))``, r from the squares summed as ``threads`` threads sum them
    (:func:`row_terms`): kernels/depth/rows_rmsnorm.py and the draw's norm (128 threads), the
    GEMV's norm prologue (32). bf16 in, bf16 out."""
    xf = x.float()
    r = rms_factor(block_sum(row_terms(xf * xf, threads)), x.shape[-1], eps)
    return (gamma_.float() * bf16(xf * r.unsqueeze(-1))).to(torch.bfloat16)


def silu_kernel(y: torch.Tensor) -> torch.Tensor:
    """epilogue_store's ``y / (1 + exp(-y))`` in fp32 (its ``1 + e^{-y}`` is one fused
    multiply-add of expf's scaling, the same value as expf then the add: the scaling by a power
    of two is exact)."""
    return y / (1.0 + torch.exp(-y))


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """kernels/depth/projection_io.epilogue_store with SwiGLU from the bf16-rounded gate and up
    projections: ``bf16(bf16(silu(g)) · u)`` (the product of two bf16 is exact in fp32)."""
    s = bf16(silu_kernel(gate.float()))
    return (s * up.float()).to(torch.bfloat16)


# ---- the GEMV's sums ------------------------------------------------------------------------
def gemv_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 [M, N] = x · w^T as kernels/depth/gemv_small_m.py sums it: lane l multiplies the
    8 elements of chunks l, l + 32, ... in order (exact bf16 products), the warp adds its lanes
    by butterfly. x [M, K], w [N, K] bf16."""
    terms = x.float().unsqueeze(1) * w.float().unsqueeze(0)  # [M, N, K]
    return block_sum(row_terms(terms, WARP))


def gemv_reference(x, w, *, gamma_=None, resid=None, swiglu=False, eps=1e-6):
    """gemv_small_m's output bits (bf16): the norm prologue, then the sums, then the epilogue
    (plain: one rounding; residual: bf16(resid + bf16(sum)); SwiGLU on the rounded gate and up
    sums, w being [2N, K])."""
    if gamma_ is not None:
        x = rms_norm_reference(x, gamma_, eps, WARP)
    if swiglu:
        n = w.shape[0] // 2
        return swiglu_reference(gemv_sums(x, w[:n]).to(torch.bfloat16),
                                gemv_sums(x, w[n:]).to(torch.bfloat16))
    y = gemv_sums(x, w)
    if resid is not None:
        return (resid.float() + bf16(y)).to(torch.bfloat16)
    return y.to(torch.bfloat16)


# ---- the tensor-core sums: a derived bound ---------------------------------------------------
def fp32_sum_bound(a: torch.Tensor, w: torch.Tensor) -> tuple:
    """(exact, bound), float64 [M, N]: |out - exact| <= bound for out = RN_bf16 (or bf16 widened
    to fp32) of any fp32 summation of the exact products a_k w_k (each bf16 x bf16 product is
    exact in fp32), in any order and association: numerics.gemm_oracle.fp32_error_bound, whose
    integer sums I · 2^-20 are here the float64 sums scaled by 2^20, with alpha = 1. The float64
    sums are themselves within gamma_K(2^-53) · sum|a w| of the real ones: ``exact`` is raised by
    that before the bound is formed and the bound widened by it after."""
    a64, w64 = a.double(), w.double()
    K = a.shape[1]
    exact = a64 @ w64.T
    mag = a64.abs() @ w64.abs().T
    slack = gamma(K, F64_U) * mag
    bound = fp32_error_bound((exact.abs() + slack) * 2.0**20, (mag + slack) * 2.0**20, 1.0, K)
    return exact, bound + slack


def assert_fp32_sums(out: torch.Tensor, a: torch.Tensor, w: torch.Tensor):
    """Every element of ``out`` (a projection a · w^T, bf16 or bf16-valued fp32) written and
    within :func:`fp32_sum_bound` of the exact product."""
    exact, bound = fp32_sum_bound(a, w)
    err = (out.double() - exact).abs()
    assert not out.isnan().any(), "outputs left unwritten (NaN)"
    assert (err <= bound).all(), f"max error / bound {(err / bound).max().item():.3f}"


# ---- the attention step ----------------------------------------------------------------------
def attention_step_model(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, q_heads,
                         kv_heads, eps):
    """models.codepredictor's attention for one position, in its own ops and dtype: (out
    [M, q·D], k cache, v cache) after appending this position's k and v at ``pos``."""
    from models.codepredictor import rms_norm, rotate_half

    M, D = qkv.shape[0], q_norm.shape[0]
    q = qkv[:, :q_heads * D].view(M, q_heads, D)
    k = qkv[:, q_heads * D:(q_heads + kv_heads) * D].view(M, kv_heads, D)
    v = qkv[:, (q_heads + kv_heads) * D:].view(M, kv_heads, D)
    q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    c, s = cos[pos], sin[pos]
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    kc, vc = k_cache.clone(), v_cache.clone()
    kc[:, :, pos], vc[:, :, pos] = k, v
    rep = q_heads // kv_heads
    keys = kc[:, :, :pos + 1].repeat_interleave(rep, dim=1)
    vals = vc[:, :, :pos + 1].repeat_interleave(rep, dim=1)
    acc = torch.float64 if qkv.dtype == torch.float64 else torch.float32
    scores = (q.unsqueeze(2).to(acc) @ keys.transpose(-1, -2).to(acc)).squeeze(2) * D ** -0.5
    p = torch.softmax(scores, dim=-1).to(qkv.dtype)
    out = (p.unsqueeze(2).to(acc) @ vals.to(acc)).squeeze(2).to(qkv.dtype)
    return out.reshape(M, q_heads * D), kc, vc


def attention_step_reference(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos, q_heads,
                             kv_heads, eps, exact=False):
    """kernels/depth/attention.py's step as it rounds (bf16 in, bf16 out): per (row, kv head)
    the rep query heads and k normalised (squares summed over each warp of dimensions by
    butterfly, then the warps in order), rotated (bf16 at the norm, q·cos, rot·sin and their
    sum), the 32 (head, slot) scores summed over the dimensions in the same tree, scaled by
    RN(D^-1/2), softmax over the live slots (max, expf of the fp32 difference, the 16 slots'
    sum by butterfly, one IEEE division, p rounded to bf16), p·V summed over the slots in
    order. Returns (out [M, q·D], k cache, v cache). ``exact``: the same steps in float64
    without the roundings (to check the order against :func:`attention_step_model`)."""
    dt = torch.float64 if exact else torch.float32
    rnd = (lambda t: t) if exact else bf16
    M, D = qkv.shape[0], q_norm.shape[0]
    rep, W = q_heads // kv_heads, D // WARP
    x = qkv.to(dt)
    q = x[:, :q_heads * D].view(M, kv_heads, rep, D)
    k = x[:, q_heads * D:(q_heads + kv_heads) * D].view(M, kv_heads, 1, D)
    v_new = qkv[:, (q_heads + kv_heads) * D:].view(M, kv_heads, D)
    vecs = torch.cat([q, k], dim=2)  # [M, kv, rep + 1, D]: the CTA's vectors
    sq = block_sum((vecs * vecs).view(M, kv_heads, rep + 1, W, WARP, 1))
    r = torch.rsqrt(sq * torch.tensor(1.0 / D, dtype=dt, device=qkv.device)
                    + torch.tensor(eps, dtype=dt, device=qkv.device))
    g = torch.stack([q_norm.to(dt)] * rep + [k_norm.to(dt)])  # [rep + 1, D]
    normed = rnd(g * rnd(vecs * r.unsqueeze(-1)))
    partner = torch.cat([-normed[..., D // 2:], normed[..., :D // 2]], dim=-1)
    c, s = cos[pos].to(dt), sin[pos].to(dt)
    rot = rnd(rnd(normed * c) + rnd(partner * s))
    kc, vc = k_cache.clone(), v_cache.clone()
    kc[:, :, pos] = rot[:, :, rep].to(qkv.dtype)
    vc[:, :, pos] = v_new
    keys, vals = kc.to(dt), vc.to(dt)  # [M, kv, 16, D]
    prod = rot[:, :, :rep].unsqueeze(3) * keys.unsqueeze(2)  # [M, kv, rep, 16, D]
    tot = block_sum(prod.view(*prod.shape[:-1], W, WARP, 1))
    live = torch.arange(keys.shape[2], device=qkv.device) <= pos
    scale = torch.tensor(D ** -0.5, dtype=dt, device=qkv.device)
    sc = torch.where(live, tot * scale, torch.tensor(-3.0e38, dtype=dt, device=qkv.device))
    e = torch.where(live, torch.exp(sc - sc.amax(-1, keepdim=True)), 0.0)
    p = rnd(e / butterfly_sum(e).unsqueeze(-1))  # [M, kv, rep, 16]
    terms = torch.where(live.unsqueeze(-1), p.unsqueeze(-1) * vals.unsqueeze(2), 0.0)
    out = sequential_sum(terms.movedim(3, -1))  # over the slots: [M, kv, rep, D]
    return out.to(qkv.dtype).reshape(M, q_heads * D), kc, vc


def assert_swiglu_on_own_sums(project, pack, x, a, w, **kw):
    """A skinny projection's SwiGLU epilogue, bit for bit: ``project(x, pack(w, swiglu), out,
    swiglu=..., **kw)`` of ``w`` [2N, K] against swiglu_reference of the same kernel's gate and
    up projected alone (the same sums: an output's sum depends on the K slices only, which
    the tile options leave alone), each of those within the fp32 bound of the exact product.
    ``x``: the activations as the kernel reads them, ``a`` the same row-major. Returns
    (gate, the SwiGLU output)."""
    M, n = a.shape[0], w.shape[0] // 2
    gate, up = (project(x, pack(half, False), poison(M, n), **kw) for half in (w[:n], w[n:]))
    assert_fp32_sums(gate, a, w[:n])
    assert_fp32_sums(up, a, w[n:])
    got = project(x, pack(w, True), poison(M, n), swiglu=True, **kw)
    assert torch.equal(got, swiglu_reference(gate, up))
    return gate, got
