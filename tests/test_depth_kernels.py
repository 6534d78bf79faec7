"""The fast loop's CuTe DSL kernels (<= 8 rows) against torch references: fused GEMVs, the
attention step, the in-kernel draw. Compile tests run anywhere; the rest needs the H200."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.codepredictor import rms_norm, rotate_half
from models.fast_loop import FRAME_TILES
from models.sampler import Sampler, SamplerSettings, draw, filtered_scores

BF16_ULP = 2.0**-7  # relative spacing bound of bf16 (8 significant bits)


# ---- compile tests (CPU) --------------------------------------------------------------------
@pytest.mark.compile
@pytest.mark.parametrize("variant", [dict(norm=True), dict(norm=True, swiglu=True),
                                     dict(residual=True), dict(norm=True, out_f32=True)])
@pytest.mark.parametrize("M", [1, 8])
def test_fused_gemv_compiles_with_pdl_and_no_spills(variant, M):
    from kernels.depth.gemv_small_m import GemvSmallM, compile_args
    from workbench.compile import compile_report

    K = 1024 if variant.get("norm") else 3072
    r = compile_report(GemvSmallM(M, K, pdl=True, **variant),
                       *compile_args(M, K, variant.get("out_f32", False)))
    assert r.spill_bytes == 0
    assert "griddepcontrol.wait" in r.ptx and "griddepcontrol.launch_dependents" in r.ptx
    # the weight loads (and gamma's) come before the dependency wait: they are the prefetch
    first_wait = r.ptx.index("griddepcontrol.wait")
    rows = 2 if variant.get("swiglu") else 1
    gamma = K // 256 if variant.get("norm") else 0
    assert r.ptx[:first_wait].count("ld.global.v4") == rows * K // 256 + gamma
    # without the norm prologue x comes by cp.async, all of the CTA's copies in one group
    # (v13b: loaded a chunk at a time, K / 512 L2 trips in series)
    copies = r.ptx.count("cp.async.cg.shared.global")
    assert copies == (0 if variant.get("norm") else -(-M * K // 8 // 128))
    assert r.ptx.count("ld.global.v4", first_wait) == (M * K // 256 if variant.get("norm") else 0)


@pytest.mark.compile
def test_attention_and_sampler_compile():
    from kernels.depth.attention import ATTN_TRACE_POINTS, DepthAttention
    from kernels.depth.attention import compile_args as att_args
    from kernels.depth.draw import DepthSampler
    from kernels.depth.draw import compile_args as smp_args
    from workbench.compile import compile_report

    r = compile_report(DepthAttention(8, 16, 8), *att_args(8))
    assert r.spill_bytes == 0 and "griddepcontrol.wait" in r.ptx
    # every bf16 rounding of the reference is there (an extf(truncf) pair folds away silently):
    # norm 2 and RoPE 3 per vector (2 q heads + k), p (one per lane), 2 outputs, the k store
    assert r.ptx.count("cvt.rn.bf16.f32") == 3 * 2 + 3 * 3 + 1 + 2 + 1
    assert "%globaltimer" not in r.ptx
    traced = compile_report(DepthAttention(8, 16, 8, trace=True), *att_args(8))
    assert traced.spill_bytes == 0 and traced.ptx.count("%globaltimer") == len(ATTN_TRACE_POINTS)
    r = compile_report(DepthSampler(8, 2048, 1024, 2048, "sample"), *smp_args())
    assert r.spill_bytes == 0 and r.ptx.count("call") == 0
    assert "atom.shared" in r.ptx and "mul.hi.u32" in r.ptx
    # fp64 log inlined (libdevice's polynomial, the one torch's CUDA log uses), no approximations
    assert "lg2.approx" not in r.ptx and "fma.rn.f64" in r.ptx
    assert "rsqrt" not in r.ptx and "%globaltimer" not in r.ptx


@pytest.mark.compile
@pytest.mark.parametrize("noise", ["early", "compact", "inline"])
def test_sampler_noise_norm_and_trace_compile(noise):
    """``noise``: "compact" moves the survivors to shared memory by one ballot and one leader's
    atomic per element slot, then draws one a thread in a loop over them; "early" and "inline"
    draw once per element slot, unrolled (early before the dependency wait); ``norm_eps``: the next row normalised (the norm kernel's bf16x2
    roundings); ``trace``: a %globaltimer read per DRAW_TRACE_POINTS entry."""
    from kernels.depth.draw import DRAW_TRACE_POINTS, DepthSampler
    from kernels.depth.draw import compile_args as smp_args
    from workbench.compile import compile_report

    r = compile_report(DepthSampler(8, 2048, 1024, 2048, "sample", trace=True, noise=noise,
                                    norm_eps=1e-6), *smp_args())
    compact = noise == "compact"
    assert r.spill_bytes == 0 and r.ptx.count("call") == 0
    # Philox4x32-10 inlined once (compact) or once per element slot: up to 20 mul.hi each (the
    # compiler folds or drops a few: only two of the four words are used)
    muls = r.ptx.count("mul.hi.u32")
    assert 16 <= muls <= 20 if compact else muls >= 8 * 16
    assert r.ptx.count("vote.sync.ballot") == (8 if compact else 0)
    assert r.ptx.count("rsqrt.approx.f32") == 1  # the row norm's factor
    assert r.ptx.count("%globaltimer") == len(DRAW_TRACE_POINTS)
    if noise == "early":  # every Philox product before the wait
        wait = r.ptx.index("griddepcontrol.wait")
        assert r.ptx.count("mul.hi.u32", 0, wait) == muls


@pytest.mark.compile
def test_sampler_qkv_gather_compiles_to_16_byte_copies():
    """``qkv_width``: the next position's QKV row gathered from the per-code table in 16-byte
    runs, two a thread at 4096 columns, after the draw and without spills."""
    from kernels.depth.draw import DepthSampler
    from kernels.depth.draw import compile_args as smp_args
    from workbench.compile import compile_report

    plain = compile_report(DepthSampler(64, 2048, 1024, 2048, "greedy"), *smp_args())
    r = compile_report(DepthSampler(64, 2048, 1024, 2048, "greedy", qkv_width=4096),
                       *smp_args())
    assert r.spill_bytes == 0
    v4 = "ld.global.v4.b32", "st.global.v4.b32"
    assert [r.ptx.count(op) - plain.ptx.count(op) for op in v4] == [2, 2]
    with pytest.raises(ValueError, match="QKV"):
        DepthSampler(64, 2048, 1024, 2048, "greedy", qkv_width=1000)


@pytest.mark.compile
def test_sampler_talker_sum_compiles_to_one_rounding_a_pair():
    """``talker_sum``: the partial's two 16-byte loads and the result's one store a thread,
    one bf16x2 rounding a pair of columns, after the gather and without spills."""
    from kernels.depth.draw import DepthSampler
    from kernels.depth.draw import compile_args as smp_args
    from workbench.compile import compile_report

    plain = compile_report(DepthSampler(64, 2048, 1024, 2048, "sample"), *smp_args())
    r = compile_report(DepthSampler(64, 2048, 1024, 2048, "sample", talker_sum=True),
                       *smp_args())
    assert r.spill_bytes == 0
    extra = [r.ptx.count(op) - plain.ptx.count(op)
             for op in ("ld.global.v4.b32", "st.global.v4.b32", "cvt.rn.bf16x2.f32")]
    assert extra == [2, 1, 4], extra


@pytest.mark.compile
@pytest.mark.parametrize("mode", ["sample", "forced"])
def test_sampler_loads_leave_in_one_batch(mode):
    """The row's parameters (and the offset ``advance`` adds to) are read before the
    dependency wait; after it the row's logits all leave before the first division, and the
    gathers (table, Talker embedding, talker-sum partial, QKV rows) before the first of their
    stores, so each phase waits for memory once (v13a: the division's slow-path branch and the
    stores' possible aliasing had kept every load behind the previous one's use)."""
    import re

    from kernels.depth.draw import DepthSampler
    from kernels.depth.draw import compile_args as smp_args
    from workbench.compile import compile_report

    r = compile_report(DepthSampler(64, 2048, 1024, 2048, mode, talker_sum=True,
                                    qkv_width=4096, advance=15), *smp_args())
    assert r.spill_bytes == 0
    ptx = r.ptx
    wait = ptx.index("griddepcontrol.wait")
    params = 4 if mode == "sample" else 1  # T, k, seed, offset / the offset alone
    assert len(re.findall(r"ld\.global\.b(32|64)", ptx[:wait])) == params
    after = ptx[wait:]
    if mode == "sample":
        loads = [m.start() for m in re.finditer(r"ld\.global\.b32", after)]
        assert len(loads) >= 8 and max(loads[:8]) < after.index("div.rn.f32")
    gathers = [m.start() for m in re.finditer(r"ld\.global\.v4", after)]
    assert len(gathers) == 1 + 1 + 2 + 2  # table, embedding, partial (2), QKV (2)
    assert max(gathers) < after.index("st.global.v4")
    # the offset advance: one 64-bit store of the value read before the wait
    assert after.count("st.global.b64") == 2  # the code and the offset


# ---- GPU tests -------------------------------------------------------------------------------
def _randn(*shape, g, scale=1.0):
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)


def _poison(*shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 8])
def test_fused_gemv_variants_match_torch(M):
    from kernels.depth.gemv_small_m import gemv_small_m as gemv

    g = torch.Generator(device="cuda").manual_seed(M)
    K, N = 1024, 2048
    x = _randn(M, K, g=g, scale=3.0)
    w = _randn(2 * N, K, g=g, scale=0.03)
    gamma = (1 + _randn(K, g=g, scale=0.1).float()).to(torch.bfloat16)
    # norm: the kernel's normalised x may differ from torch's by an ulp where rsqrt rounds
    # differently, so: tight bound for almost all elements, one-ulp-of-a slack for all
    a = rms_norm(x, gamma, 1e-6).double()
    exact = a @ w[:N].double().T
    mag = a.abs() @ w[:N].double().abs().T
    out = gemv(x, w[:N], _poison(M, N), gamma=gamma)
    err = (out.double() - exact).abs()
    tight = K * 2.0**-23 * mag + exact.abs() * 2.0**-8
    assert (err <= tight + BF16_ULP * mag).all()
    assert (err <= tight).float().mean() >= 0.99
    # out_f32: the same bf16 results, widened
    out32 = gemv(x, w[:N], _poison(M, N, dtype=torch.float32), gamma=gamma)
    assert torch.equal(out32, out.float())
    # residual: bf16(resid + bf16(x W^T)), exactly, also in place
    plain = gemv(x, w[:N], _poison(M, N))
    resid = _randn(M, N, g=g)
    want = (resid.float() + plain.float()).to(torch.bfloat16)
    assert torch.equal(gemv(x, w[:N], _poison(M, N), resid=resid), want)
    gemv(x, w[:N], resid, resid=resid)
    assert torch.equal(resid, want)
    # swiglu: bf16(bf16(silu(g)) * u) from the plain projections (exp may differ by an ulp)
    gate, up = gemv(x, w[:N], _poison(M, N)), gemv(x, w[N:], _poison(M, N))
    want = torch.nn.functional.silu(gate) * up
    got = gemv(x, w, _poison(M, N), swiglu=True)
    diff = (got.float() - want.float()).abs()
    assert (diff <= 2 * BF16_ULP * want.float().abs()).all()
    assert (diff == 0).float().mean() >= 0.99


@pytest.mark.compile
def test_gemv_refuses_rows_beyond_shared_memory():
    """x's rows in shared memory (the norm prologue, x_copy "async") must fit its 48 KB:
    refused before compiling; the wrapper takes "direct" instead for a plain projection."""
    from kernels.depth.gemv_small_m import GemvSmallM

    GemvSmallM(8, 3072, x_copy="async")  # 48 KB exactly
    GemvSmallM(8, 4096, x_copy="direct")
    for kw in (dict(x_copy="async"), dict(norm=True)):
        with pytest.raises(ValueError, match="shared memory"):
            GemvSmallM(8, 4096, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("M,K", [(1, 1024), (1, 3072), (2, 2048), (3, 3072), (8, 1024),
                                 (8, 4096)])
def test_gemv_x_copies_give_the_same_bits(M, K):
    """``x_copy`` (X_COPIES) moves x by cp.async into shared memory or straight into registers:
    the same sums in the same order, so the same bits, plain, with the residual (in place) and
    with SwiGLU."""
    from kernels.depth.gemv_small_m import gemv_small_m as gemv

    g = torch.Generator(device="cuda").manual_seed(M * K)
    N = 1024
    x, w = _randn(M, K, g=g, scale=3.0), _randn(2 * N, K, g=g, scale=0.03)
    resid = _randn(M, N, g=g)
    outs = {}
    for how in ("async", "direct"):
        r = resid.clone()
        gemv(x, w[:N], r, resid=r, x_copy=how)
        outs[how] = (gemv(x, w[:N], _poison(M, N), x_copy=how), r,
                     gemv(x, w, _poison(M, N), swiglu=True, x_copy=how))
    for a, b in zip(outs["async"], outs["direct"]):
        assert not a.isnan().any() and torch.equal(a, b)
    with pytest.raises(ValueError, match="x_copy"):
        gemv(x, w[:N], x_copy="tma")


@pytest.mark.gpu
def test_fused_gemv_rejects_bad_input():
    from kernels.depth.gemv_small_m import gemv_small_m as gemv

    x = torch.zeros(2, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(64, 1024, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError):
        gemv(x, w, gamma=torch.zeros(512, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError):
        gemv(x, w[:63])  # N not a multiple of 4
    with pytest.raises(TypeError):
        gemv(x.float(), w)
    with pytest.raises(ValueError):
        gemv(x, w, resid=torch.zeros(2, 64, dtype=torch.bfloat16, device="cuda"),
             out=torch.zeros(2, 64, device="cuda"))


def _attention_reference(qkv, q_norm, k_norm, cos, sin, kc, vc, pos, qh, kvh, eps):
    """The reference's _layer attention for one position, in its own bf16 ops."""
    M = qkv.shape[0]
    D = q_norm.shape[0]
    q = qkv[:, :qh * D].view(M, qh, D)
    k = qkv[:, qh * D:(qh + kvh) * D].view(M, kvh, D)
    v = qkv[:, (qh + kvh) * D:].view(M, kvh, D)
    q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    c, s = cos[pos], sin[pos]
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    kc, vc = kc.clone(), vc.clone()
    kc[:, :, pos], vc[:, :, pos] = k, v
    rep = qh // kvh
    K = kc[:, :, :pos + 1].repeat_interleave(rep, dim=1)
    V = vc[:, :, :pos + 1].repeat_interleave(rep, dim=1)
    scores = (q.unsqueeze(2).float() @ K.transpose(-1, -2).float()).squeeze(2) * D ** -0.5
    p = torch.softmax(scores, dim=-1).to(torch.bfloat16)
    out = (p.unsqueeze(2).float() @ V.float()).squeeze(2).to(torch.bfloat16)
    return out.reshape(M, qh * D), kc, vc


@pytest.mark.gpu
@pytest.mark.parametrize("M,pos", [(1, 0), (1, 7), (3, 15), (8, 5)])
def test_depth_attention_matches_reference_step(M, pos):
    from kernels.depth.attention import depth_attention
    from models.codepredictor import rope_tables
    from models.codepredictor_config import QWEN3_TTS_1P7B as cfg

    g = torch.Generator(device="cuda").manual_seed(M * 16 + pos)
    qh, kvh, D = cfg.q_heads, cfg.kv_heads, cfg.head_dim
    qkv = _randn(M, (qh + 2 * kvh) * D, g=g, scale=2.0)
    qn, kn = (1 + _randn(D, g=g, scale=0.2).float()).to(torch.bfloat16), \
        (1 + _randn(D, g=g, scale=0.2).float()).to(torch.bfloat16)
    cos, sin = rope_tables(cfg, torch.arange(16, device="cuda"), torch.bfloat16, "cuda")
    kc, vc = _randn(M, kvh, 16, D, g=g), _randn(M, kvh, 16, D, g=g)
    if pos < 15:  # slots above pos hold junk the mask must ignore
        kc[:, :, pos + 1:] = float("nan")
        vc[:, :, pos + 1:] = float("inf")
    want, kc_ref, vc_ref = _attention_reference(qkv, qn, kn, cos, sin, kc, vc, pos, qh, kvh,
                                                cfg.rms_eps)
    out = _poison(M, qh * D)
    depth_attention(qkv, qn, kn, cos.contiguous(), sin.contiguous(), kc, vc, pos, out,
                    q_heads=qh, kv_heads=kvh, eps=cfg.rms_eps)
    torch.testing.assert_close(vc[:, :, :pos + 1], vc_ref[:, :, :pos + 1], rtol=0, atol=0)
    # k: an ulp of the normalised vector where rsqrt rounds differently, which RoPE's sum may
    # leave larger than an ulp of a (cancelling) result
    kd = (kc[:, :, pos].float() - kc_ref[:, :, pos].float()).abs()
    assert (kd == 0).float().mean() >= 0.97
    assert kd.max() <= 2 * BF16_ULP * kc_ref[:, :, pos].float().abs().max()
    assert torch.equal(kc[:, :, :pos], kc_ref[:, :, :pos])
    assert not out.isnan().any()
    # softmax probabilities round to bf16 in both; the rest is fp32 summation order and ulps
    torch.testing.assert_close(out.float(), want.float(), rtol=4 * BF16_ULP, atol=0.02)


def _draw_case(M, V, seed, g):
    logits = (torch.randn(M, V, device="cuda", generator=g) * 3).round(decimals=1)  # ties
    temps = [0.0, 0.7, 1.3, 0.9]
    ks = [0, 1, 50, V + 5, 7]
    settings_ = [SamplerSettings(temperature=temps[(seed + i) % 4], top_k=ks[(seed + i) % 5])
                 for i in range(M)]
    smp = Sampler(M, settings_, seeds=[(seed + i) * 0x1_0000_0001 % 2**62 for i in range(M)],
                  device="cuda")
    smp.offset += (seed % 5) * 2**32 + 11
    return logits, smp


@pytest.mark.gpu
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**20), M=st.sampled_from([1, 3, 8, 64]), d=st.integers(0, 14),
       noise=st.sampled_from(["early", "compact", "inline"]), norm=st.booleans())
def test_depth_draw_equals_reference_sampler_and_gathers(seed, M, d, noise, norm):
    """The codes of models.sampler on the same logits (ties at the k-th value, k from 1 to
    past V, greedy rows), the gathered rows, and with ``norm`` the next row normalised with
    the norm kernel's bits; with the Gumbel terms drawn in each of the NOISE places."""
    from functools import partial

    from kernels.depth.draw import depth_draw as plain_draw
    from kernels.depth.rows_rmsnorm import rows_rmsnorm

    V, hidden, talker = 2048, 1024, 2048
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits, smp = _draw_case(M, V, seed, g)
    table, embeds = _randn(V, hidden, g=g), _randn(V, talker, g=g)
    gamma, xn = _randn(hidden, g=g), _poison(M, hidden)
    depth_draw = partial(plain_draw, noise=noise,
                         **(dict(gamma=gamma, xn=xn) if norm else {}))

    def check_norm(x_next):
        if norm:
            assert torch.equal(xn, rows_rmsnorm(x_next, gamma, _poison(M, hidden)))

    ref = draw(filtered_scores(logits, smp.temperature, smp.top_k), smp.temperature, smp.seed,
               smp.offset + d)
    big = torch.zeros(M, 15, V, device="cuda")
    big[:, d] = logits  # strided rows, as the loop's logits buffer
    codes = torch.full((M, 15), -1, dtype=torch.int64, device="cuda")
    x_next, used = _poison(M, hidden), _poison(M, 16, talker)
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1 if d < 15 else 0],
               d, mode="sample", temperature=smp.temperature, top_k=smp.top_k, seed=smp.seed,
               offset=smp.offset)
    assert torch.equal(codes[:, d], ref)
    assert torch.equal(x_next, table[ref]) and torch.equal(used[:, d + 1], embeds[ref])
    check_norm(x_next)
    # greedy and teacher-forced modes
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="greedy")
    assert torch.equal(codes[:, d], logits.argmax(-1))
    forced = torch.randint(0, V, (M, 15), device="cuda", generator=g)
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="forced",
               codes_in=forced[:, d])
    assert torch.equal(codes[:, d], forced[:, d]) and torch.equal(x_next, table[forced[:, d]])
    check_norm(x_next)
    # the frame's last draw ends the talker sum: bf16(fp32 partial + the gathered row)
    part = torch.randn(M, talker, device="cuda", generator=g) * 4
    total = _poison(M, talker)
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="forced",
               codes_in=forced[:, d], sum_in=part, sum_out=total)
    assert torch.equal(total, torch.add(part, embeds[forced[:, d]], out=_poison(M, talker)))
    # the frame's last draw also advances the offsets, after its own reads of them
    before = smp.offset.clone()
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="sample",
               temperature=smp.temperature, top_k=smp.top_k, seed=smp.seed, offset=smp.offset,
               advance=15)
    assert torch.equal(codes[:, d], ref) and torch.equal(smp.offset, before + 15)
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="forced",
               codes_in=forced[:, d], offset=smp.offset, advance=2)
    assert torch.equal(smp.offset, before + 17)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["sample", "greedy", "forced"])
def test_depth_draw_trace_stamps_every_row_in_order(mode):
    """``trace``: each row's CTA stamps DRAW_TRACE_POINTS, non-decreasing, and draws the same
    code as the untraced build."""
    from kernels.depth.draw import DRAW_TRACE_POINTS, depth_draw

    M, V, d = 64, 2048, 3
    g = torch.Generator(device="cuda").manual_seed(17)
    logits, smp = _draw_case(M, V, 5, g)
    table, embeds = _randn(V, 1024, g=g), _randn(V, 2048, g=g)
    forced = torch.randint(0, V, (M,), device="cuda", generator=g)
    kw = dict(mode=mode, codes_in=forced) if mode != "sample" else dict(
        mode=mode, temperature=smp.temperature, top_k=smp.top_k, seed=smp.seed,
        offset=smp.offset)
    codes = []
    for trace in (None, torch.full((M, len(DRAW_TRACE_POINTS)), -1, dtype=torch.int64,
                                   device="cuda")):
        c = torch.full((M,), -1, dtype=torch.int64, device="cuda")
        depth_draw(logits, c, table, embeds, _poison(M, 1024), _poison(M, 2048), d, trace=trace,
                   **kw)
        codes.append(c)
    assert torch.equal(codes[0], codes[1])
    assert (trace > 0).all() and (trace.diff(dim=1) >= 0).all()


# ---- above 8 rows: the row norm and the split-K tensor-core projection ---------------------
@pytest.mark.compile
@pytest.mark.parametrize("variant", [{}, dict(residual=True), dict(swiglu=True),
                                     dict(out_f32=True), dict(swiglu=True, chunk_major_out=True)])
@pytest.mark.parametrize("M,K,warps,m_split", [(16, 1024, 4, 1), (128, 3072, 4, 1),
                                               (64, 1024, 8, 1), (64, 2048, 4, 2)])
def test_skinny_gemm_compiles_to_mma_sync_and_cp_async(variant, M, K, warps, m_split):
    from kernels.depth.gemm_skinny import GemmSkinny, compile_args
    from workbench.compile import compile_report

    g = GemmSkinny(M, K, pdl=True, warps=warps, m_split=m_split, **variant)
    r = compile_report(g, *compile_args(variant.get("out_f32", False)))
    assert r.ptx.count("call") == 0
    if warps == 8:  # held to 128 registers (two CTAs an SM): 4 of them spilled across the
        assert r.registers <= 128 and r.spill_bytes <= 64  # first mma (2 STL, 2 LDL at 64 rows)
    else:
        assert r.spill_bytes == 0
    # (M/8/m_split) n-tiles of a rows x 2 k16 steps per 32-wide block (one 16-row weight
    # tile a warp)
    assert r.ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == \
        (M // 8 // m_split) * 2 * (g.k_slice // 32)
    assert r.ptx.count("cp.async.cg.shared.global") == M * (g.k_slice // 8) // g.threads
    wait = r.ptx.index("griddepcontrol.wait")
    assert r.ptx[:wait].count("ld.global.v4") == 2 * (g.k_slice // 32)  # weights before the wait
    # split-K through the cluster's shared memory: two barriers, every partial of this CTA's
    # share read from the peers, no global workspace, atomics or gpu-scope fences
    assert r.ptx.count("barrier.cluster.arrive") == 2 and r.ptx.count("barrier.cluster.wait") == 2
    per_thread = -(-g.share // g.threads)
    assert r.ptx.count("ld.shared::cluster.f32") == per_thread * g.splits * g.w_rows
    assert "atom." not in r.ptx and "fence.acq_rel.gpu" not in r.ptx



@pytest.mark.compile
def test_skinny_gemm_trace_stamps_only_in_traced_builds():
    """``trace``: thread 0 reads %globaltimer once per TRACE_POINTS entry; the default build
    reads it never (the stamps are compiled out, not skipped at run time)."""
    from kernels.depth.gemm_skinny import TRACE_POINTS, GemmSkinny, compile_args
    from workbench.compile import compile_report

    traced = compile_report(GemmSkinny(64, 1024, pdl=True, trace=True), *compile_args()).ptx
    plain = compile_report(GemmSkinny(64, 1024, pdl=True), *compile_args()).ptx
    assert traced.count("%globaltimer") == len(TRACE_POINTS)
    assert "%globaltimer" not in plain



@pytest.mark.compile
@pytest.mark.parametrize("M,kw", [(64, {}), (64, dict(swiglu=True, warps=8)),
                                  (16, dict(out_f32=True)), (128, dict(m_split=2))])
def test_skinny_gemm_folded_norm_compiles_without_spills(M, kw):
    """``rms_eps``: the sums of squares of the a rows come from a second read of the chunks
    the mma used (one butterfly pair a row), the factor from the cluster exchange; the same
    mma count, no spills, within the launch bound's registers."""
    from kernels.depth.gemm_skinny import GemmSkinny, compile_args
    from workbench.compile import compile_report

    g = GemmSkinny(M, 1024, pdl=True, rms_eps=1e-6, **kw)
    r = compile_report(g, *compile_args(kw.get("out_f32", False)))
    plain = compile_report(GemmSkinny(M, 1024, pdl=True, **kw),
                           *compile_args(kw.get("out_f32", False)))
    assert r.spill_bytes == 0 and r.ptx.count("mma.sync") == plain.ptx.count("mma.sync")
    assert r.ptx.count("shfl.sync.bfly") == 2 * g._owned_tiles()
    assert "rsqrt" in r.ptx and "rsqrt" not in plain.ptx


@pytest.mark.compile
def test_skinny_gemm_sums_of_squares_in_and_out_compile_without_spills():
    """``ss_in``: the producer's sums of the share's rows arrive by 4-byte cp.async with the
    slice (no wait of their own), the mma loop reads no chunk twice and nothing is exchanged
    for the factors; ``ss_out``: one warp reduction (5 butterflies) a stored output."""
    from kernels.depth.gemm_skinny import GemmSkinny, compile_args
    from workbench.compile import compile_report

    own = compile_report(GemmSkinny(64, 1024, pdl=True, rms_eps=1e-6), *compile_args())
    cfg = GemmSkinny(64, 1024, pdl=True, rms_eps=1e-6, ss_in=True)
    given = compile_report(cfg, *compile_args())
    assert given.spill_bytes == 0 and given.ptx.count("cp.async.ca.shared.global") >= 1
    assert given.ptx.count("ld.shared::cluster") < own.ptx.count("ld.shared::cluster")
    assert "shfl.sync.bfly" not in given.ptx
    out = GemmSkinny(64, 2048, pdl=True, residual=True, ss_out=True)
    r = compile_report(out, *compile_args())
    per_thread = out.share // out.threads
    assert r.spill_bytes == 0 and r.ptx.count("shfl.sync.bfly") == 5 * per_thread
    with pytest.raises(ValueError, match="ss_in"):
        GemmSkinny(64, 1024, ss_in=True)
    with pytest.raises(ValueError, match="ss_out"):
        GemmSkinny(64, 1024, ss_out=True)


@pytest.mark.compile
@pytest.mark.parametrize("M,K,stages,kw", [(64, 1024, 4, {}), (64, 3072, 4, dict(m_split=2)),
                                           (16, 1024, 2, dict(warps=8, swiglu=True))])
def test_skinny_gemm_staged_copy_waits_for_one_range_at_a_time(M, K, stages, kw):
    """``a_stages``: one cp.async group per K-range, then before each range's mma a wait that
    leaves the later groups in flight (wait_group stages-1 .. 0) and one CTA barrier; the same
    mma count as the one-shot copy, no spills."""
    import re

    from kernels.depth.gemm_skinny import GemmSkinny, compile_args
    from workbench.compile import compile_report

    r = compile_report(GemmSkinny(M, K, pdl=True, a_stages=stages, **kw), *compile_args())
    one = compile_report(GemmSkinny(M, K, pdl=True, **kw), *compile_args())
    waits = [int(n) for n in re.findall(r"cp\.async\.wait_group\s+(\d+)", r.ptx)]
    assert waits == list(range(stages - 1, -1, -1))
    assert r.ptx.count("cp.async.commit_group") == stages
    assert r.ptx.count("mma.sync") == one.ptx.count("mma.sync") and r.spill_bytes == 0
    with pytest.raises(ValueError, match="a_stages"):
        GemmSkinny(M, K, a_stages=3, **kw)



def test_default_stages_fall_back_to_what_fits_the_tiles():
    """A defaulted ``a_stages`` (``stage_count``) for tiles it was not measured with halves
    until the copy splits into whole rounds; the check is the constructor's."""
    pytest.importorskip("cutlass")
    from kernels.depth.gemm_skinny import GemmSkinny, fitting_stages, stages_fit

    assert fitting_stages(4, 64, 256, 128) == 4  # QKV at 64 rows, 4 warps
    assert fitting_stages(4, 16, 256, 256) == 2  # 16 rows on 8 warps: 128 chunks a stage
    assert fitting_stages(4, 16, 128, 256) == 1
    for stages in (1, 2, 4):
        fits = stages_fit(stages, 16, 256, 256)
        try:
            GemmSkinny(16, 1024, warps=8, a_stages=stages)
            built = True
        except ValueError:
            built = False
        assert built == fits

def test_fold_gamma_scales_columns_and_checks_its_shape():
    from kernels.depth.gemm_skinny import fold_gamma

    w = torch.randn(32, 64).to(torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(64)).to(torch.bfloat16)
    assert torch.equal(fold_gamma(w, gamma), (w.float() * gamma.float()).to(torch.bfloat16))
    with pytest.raises(ValueError, match="gamma"):
        fold_gamma(w, gamma[:32])



def test_skinny_trace_summary_reads_row_major_stamps():
    """scripts/trace_skinny.py's summary on synthetic stamps [CTA, point] (ns): phases keyed by
    the point that ends them, the gap from the previous launch's last exit, the critical path,
    residency before release and late entries; an unwritten stamp (-1, the poison) is refused."""
    pytest.importorskip("cutlass")
    from scripts.trace_skinny import summarize

    steps = torch.tensor([0, 500, 1000, 2000, 2500, 3000, 3100])  # entry .. exit, ns
    first = torch.stack([steps + 1000 * c for c in range(3)])  # 3 CTAs, staggered by 1 µs
    second = torch.stack([steps + 8000 + 100 * c for c in range(2)])
    a, b = summarize([("qkv", True), ("wo", False)], [first, second])
    assert a["ctas"] == 3 and a["gap_after_previous_exit_us"] is None
    assert a["phase_median_us"] == pytest.approx({"a_loaded": 0.5, "mma_done": 1.0,
                                                  "exchange_done": 0.5, "stored": 0.5,
                                                  "exit": 0.1})
    assert a["critical_us"] == pytest.approx(5.1 - 0.5)  # last exit 2000 + 3100 ns
    assert b["wait_first_us"] == pytest.approx(8.5)
    assert b["gap_after_previous_exit_us"] == pytest.approx(8.5 - 5.1)
    assert a["resident_before_release_median_us"] == pytest.approx(0.5)
    assert a["entered_after_release"] == 2  # entries at 1 and 2 µs, first release at 0.5
    assert b["entered_after_release"] == 0
    with pytest.raises(ValueError, match="unwritten"):
        summarize([("qkv", True)], [torch.full((2, 7), -1)])


def _mma_m16n8k16(a_regs, b_regs):
    """D = A·B of one ``mma.sync.m16n8k16`` from per-lane registers, with the fragment layouts
    of the PTX ISA (A row-major 16x16: a0-a7; B column-major 16x8: b0-b3; D 16x8: d0-d3);
    each register a pair of elements, the first in the low half. Returns per-lane d0..d3."""
    A, B = torch.zeros(16, 16, dtype=torch.float64), torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(32):
        g, q = lane // 4, lane % 4
        a = [v for reg in a_regs[lane] for v in reg]
        b = [v for reg in b_regs[lane] for v in reg]
        for i in range(8):
            A[g + 8 * ((i // 2) % 2), 2 * q + (i & 1) + 8 * (i // 4)] = a[i]
        for i in range(4):
            B[2 * q + (i & 1) + 8 * (i // 2), g] = b[i]
    D = A @ B
    return [[D[g, 2 * q], D[g, 2 * q + 1], D[g + 8, 2 * q], D[g + 8, 2 * q + 1]]
            for g, q in ((lane // 4, lane % 4) for lane in range(32))]


def test_skinny_gemm_pack_weights_permutes_and_refuses_bad_shapes():
    pytest.importorskip("cutlass")
    from kernels.depth.gemm_skinny import pack_weights

    w = torch.arange(64 * 96, dtype=torch.float32).reshape(64, 96)
    for swiglu in (False, True):
        p = pack_weights(w, swiglu)
        assert p.swiglu == swiglu and p.data.shape == w.shape
        assert torch.equal(p.data.flatten().sort().values, w.flatten())  # a permutation
    # unit (group 1, block 2, step 1, lane (g 3, q 2)) = rows 16 + 3, 16 + 11 at k0 = 64 + 20
    u = pack_weights(w).data.reshape(-1, 8)[((1 * 3 + 2) * 2 + 1) * 32 + 3 * 4 + 2]
    k0 = 64 + 8 * 2 + 4
    assert u.tolist() == [w[19, k0], w[19, k0 + 1], w[27, k0], w[27, k0 + 1],
                          w[19, k0 + 2], w[19, k0 + 3], w[27, k0 + 2], w[27, k0 + 3]]
    with pytest.raises(ValueError):
        pack_weights(w[:, :80])  # K not a multiple of 32
    with pytest.raises(ValueError):
        pack_weights(w[:48], swiglu=True)  # gate + up rows must pair into groups of 8


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("swiglu", [False, True])
def test_skinny_gemm_packed_fragments_are_exact_under_the_ptx_layouts(swiglu, warps):
    """kernels/depth/gemm_skinny.py's transposed mma: lane (g, q) takes its A fragment (weights) from
    one 16-byte unit of pack_weights and its B fragment (a row 8t + g) from words 2s, 2s + 1 of
    that row's chunk q; replayed under an emulation of the PTX m16n8k16 layouts, the two k16
    steps of every 32-wide block give exactly W · a^T, each weight row landing in the partial
    column the kernel stores it to."""
    pytest.importorskip("cutlass")
    from kernels.depth.gemm_skinny import GemmSkinny, pack_weights

    g = torch.Generator().manual_seed(1)
    K, N = 64, 16 * warps  # two blocks; one tile (SwiGLU: 8 output columns a warp, gate and up)
    W = torch.randn((2 if swiglu else 1) * N, K, generator=g, dtype=torch.float64)
    A = torch.randn(8, K, generator=g, dtype=torch.float64)  # one n-tile of a rows
    packed = pack_weights(W, swiglu).data.reshape(-1, K // 32, 2, 32, 8)  # group, b, s, lane
    cfg = GemmSkinny(16, 1024, swiglu=swiglu, warps=warps)
    want = A @ W.T  # [a row, weight row]
    for warp in range(warps):
        acc = torch.zeros(32, 4, dtype=torch.float64)
        for b in range(K // 32):
            for s in range(2):
                a_regs, b_regs = [], []
                for lane in range(32):
                    gr, q = lane // 4, lane % 4
                    unit = packed[warp, b, s, lane]  # group = tile 0 * warps + warp
                    a_regs.append([unit[2 * i: 2 * i + 2].tolist() for i in range(4)])
                    chunk = A[gr, 32 * b + 8 * q: 32 * b + 8 * q + 8]
                    b_regs.append([chunk[4 * s: 4 * s + 2].tolist(),
                                   chunk[4 * s + 2: 4 * s + 4].tolist()])
                acc += torch.tensor(_mma_m16n8k16(a_regs, b_regs), dtype=torch.float64)
        for lane in range(32):
            gr, q = lane // 4, lane % 4
            for h in range(2):
                col = cfg._partial_column(warp, gr, h)  # r * tile_out + output column
                wrow = (N if col >= cfg.tile_out else 0) + col % cfg.tile_out if swiglu else col
                for e in range(2):
                    assert abs(acc[lane, 2 * h + e] - want[2 * q + e, wrow]) < 1e-12


def test_skinny_gemm_takes_every_projection_of_the_loop():
    """Each projection of the 1.7B loop fits the kernel at 16-128 rows with its default tile
    (tile_warps, warps_per_group): whole tiles, a cluster of at most 8 K slices, shared memory
    within the SM's 227 KB (and GemmSkinny's own check that 512 threads keep to 256-wide
    slices)."""
    pytest.importorskip("cutlass")
    from kernels.depth.gemm_skinny import MAX_SPLITS, GemmSkinny, tile_warps, warps_per_group
    from models.codepredictor_config import QWEN3_TTS_1P7B
    from models.fast_loop import projection_shapes

    for M in (16, 32, 64, 128):
        for n, k, swiglu in projection_shapes(QWEN3_TTS_1P7B):
            rows = (2 if swiglu else 1) * n
            g = GemmSkinny(M, k, swiglu=swiglu, warps=tile_warps(rows, k, M),
                           m_split=warps_per_group(rows, k, M))
            assert n % g.tile_out == 0 and g.splits * g.k_slice == k
            assert g.splits <= MAX_SPLITS and g.k_slice % 32 == 0
            assert g.share * g.splits == M * g.tile_out
            assert g.smem_bytes <= 227 * 1024


# spills of the loop's default builds (bytes): wo at 128 rows keeps 4 warps at 255 registers
# (gate/up at 64 rows spilled 36 under 8 warps' 128-register bound until it went to 4 warps)
KNOWN_SPILLS = {(128, "wo"): 20}


@pytest.mark.compile
@pytest.mark.parametrize("M", [16, 32, 64, 128])
def test_skinny_gemm_default_builds_of_the_loop_spill_only_where_known(M):
    """Every projection of the 1.7B loop as the fast loop builds it (tile_warps,
    warps_per_group, stage_count, the bucket's FRAME_TILES, PDL): no spills beyond
    ``KNOWN_SPILLS``, so a new one is noticed."""
    from kernels.depth.gemm_skinny import (GemmSkinny, compile_args, stage_count, tile_warps,
                                           warps_per_group)
    from models.fast_loop import frame_tiles
    from workbench.compile import compile_report

    shapes = {"qkv": (4096, 1024, {}), "wo": (1024, 2048, dict(residual=True)),
              "gate_up": (6144, 1024, dict(swiglu=True)), "down": (1024, 3072,
                                                             dict(residual=True)),
              "heads": (2048, 1024, dict(out_f32=True))}
    for name, (rows, K, kw) in shapes.items():
        tile = {**dict(warps=tile_warps(rows, K, M), m_split=warps_per_group(rows, K, M),
                       a_stages=stage_count(rows, K, M)), **frame_tiles(M).get(name, {})}
        g = GemmSkinny(M, K, pdl=True, **tile, **kw)
        r = compile_report(g, *compile_args(kw.get("out_f32", False)))
        assert r.spill_bytes <= KNOWN_SPILLS.get((M, name), 0), (name, r.spill_bytes)


@pytest.mark.gpu
@pytest.mark.parametrize("M,name", [(M, name) for M, tiles in FRAME_TILES.items()
                                    for name in tiles])
def test_skinny_gemm_frame_tiles_match_fp64(M, name):
    """The loop's measured tiles (FRAME_TILES), every output written (poisoned first): the
    plain projections within fp32 split-K noise of the fp64 product (bf16 or fp32 out), SwiGLU
    within two bf16 ulps of silu(gate) · up from gate and up projected alone in as many
    slices (the same sums)."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    N, K = {"qkv": (4096, 1024), "gate_up": (3072, 1024), "heads": (2048, 1024),
            "wo": (1024, 2048), "down": (1024, 3072)}[name]
    tile = FRAME_TILES[M][name]
    g = torch.Generator(device="cuda").manual_seed(M + N)
    a = _randn(M, K, g=g)
    if name == "gate_up":
        w = _randn(2 * N, K, g=g, scale=0.03)
        gate, up = (gemm_skinny(a, pack_weights(half), _poison(M, N), splits=tile.get("splits"))
                    for half in (w[:N], w[N:]))
        got = gemm_skinny(a, pack_weights(w, swiglu=True), _poison(M, N), swiglu=True, **tile)
        want = torch.nn.functional.silu(gate) * up
        diff = (got.float() - want.float()).abs()
        assert (diff <= 2 * BF16_ULP * want.float().abs()).all()
        assert (diff == 0).float().mean() >= 0.99
        return
    w = _randn(N, K, g=g, scale=0.03)
    exact = a.double() @ w.double().T
    bound = K * 2.0**-23 * (a.double().abs() @ w.double().abs().T) + exact.abs() * 2.0**-8
    for dtype in (torch.bfloat16, torch.float32):
        out = gemm_skinny(a, pack_weights(w), _poison(M, N, dtype=dtype), **tile)
        assert ((out.double() - exact).abs() <= bound).all(), dtype


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 48, 128])
def test_rows_rmsnorm_matches_reference(M):
    from kernels.depth.rows_rmsnorm import rows_rmsnorm

    g = torch.Generator(device="cuda").manual_seed(M)
    x = _randn(M, 1024, g=g, scale=3.0)
    gamma = (1 + _randn(1024, g=g, scale=0.1).float()).to(torch.bfloat16)
    out = rows_rmsnorm(x, gamma, _poison(M, 1024))
    want = rms_norm(x, gamma, 1e-6)
    diff = (out.float() - want.float()).abs()
    assert (diff <= BF16_ULP * want.float().abs()).all()  # rsqrt may move a rounding by an ulp
    assert (diff == 0).float().mean() >= 0.99


@pytest.mark.parametrize("M", [16, 48, 64, 128])
@pytest.mark.parametrize("K,swiglu,splits", [(1024, False, None), (1024, True, None),
                                             (2048, False, 8), (1024, True, 8),
                                             (3072, False, None), (3072, False, 8)])
@pytest.mark.parametrize("warps,m_split", [(4, 1), (8, 1), (4, 2)])
def test_skinny_gemm_cluster_shares_store_every_output_once(M, K, swiglu, splits, warps,
                                                            m_split):
    """The reduction's partition, replayed on the CPU: over the cluster's CTAs, threads and
    iterations every output of the tile is stored exactly once, and every partial a thread
    loads (stored or not: small shares wrap) lies inside the tile."""
    pytest.importorskip("cutlass")
    from kernels.depth.gemm_skinny import GemmSkinny

    g = GemmSkinny(M, K, swiglu=swiglu, splits=splits, warps=warps, m_split=m_split)
    per_thread = -(-g.share // g.threads)
    stored = []
    for split in range(g.splits):
        for tidx in range(g.threads):
            for i in range(per_thread):
                m, c = g._reduced_output(split, tidx, i)
                assert 0 <= m < M and 0 <= c < g.tile_out
                if g.share % g.threads == 0 or tidx + g.threads * i < g.share:
                    stored.append((m, c))
    assert sorted(stored) == [(m, c) for m in range(M) for c in range(g.tile_out)]


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,kw", [(64, 4096, 1024, {}), (64, 1024, 3072, dict(m_split=2)),
                                      (16, 6144, 1024, dict(warps=8)),
                                      (128, 1024, 2048, {}), (32, 2048, 1024, dict(rms_eps=1e-6))])
@pytest.mark.parametrize("stages", [2, 4])
def test_skinny_gemm_staged_copy_is_bit_identical(M, N, K, kw, stages):
    """``a_stages``: the same sums in the same order as the one-shot copy, so the same bits
    (every output written: poisoned first), the residual and SwiGLU epilogues included."""
    from kernels.depth.gemm_skinny import GemmSkinny, gemm_skinny, pack_weights

    swiglu = N == 6144
    try:
        GemmSkinny(M, K, swiglu=swiglu, a_stages=stages, **{k: v for k, v in kw.items()
                                                            if k != "rms_eps"})
    except ValueError:
        pytest.skip("the copy does not split into whole rounds here")
    g = torch.Generator(device="cuda").manual_seed(M + N + K + stages)
    a = _randn(M, K, g=g)
    wp = pack_weights(_randn(N, K, g=g, scale=0.03), swiglu=swiglu)
    n_out = N // 2 if swiglu else N
    one = gemm_skinny(a, wp, _poison(M, n_out), swiglu=swiglu, **kw)
    got = gemm_skinny(a, wp, _poison(M, n_out), swiglu=swiglu, a_stages=stages, **kw)
    assert torch.equal(got, one)
    if not swiglu and "rms_eps" not in kw:
        resid = _randn(M, n_out, g=g)
        want = gemm_skinny(a, wp, resid.clone(), resid=resid, **kw)
        r2 = resid.clone()
        assert torch.equal(gemm_skinny(a, wp, r2, resid=r2, a_stages=stages, **kw), want)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,kw", [(16, 1024, 2048, {}), (64, 1024, 2048, dict(m_split=2)),
                                      (64, 1024, 3072, {}), (128, 1024, 3072, dict(warps=8)),
                                      (16, 1024, 3072, dict(m_split=2, splits=8))])
def test_skinny_gemm_residual_writes_sums_of_squares_of_what_it_stores(M, N, K, kw):
    """``ss_out``: a residual projection also writes, per row and 32 columns, the fp32 sum of
    squares of the bf16 values it stored (every entry: NaN-poisoned first), and the stored
    values are the same bits as without it."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = _randn(M, K, g=g)
    wp = pack_weights(_randn(N, K, g=g, scale=0.03))
    resid = _randn(M, N, g=g)
    want = gemm_skinny(a, wp, resid.clone(), resid=resid, **kw)
    ss = torch.full((N // 32, M), float("nan"), device="cuda")
    got = resid.clone()
    gemm_skinny(a, wp, got, resid=got, ss_out=ss, **kw)
    assert torch.equal(got, want)
    exact = got.double().pow(2).view(M, N // 32, 32).sum(-1).T
    assert torch.allclose(ss.double(), exact, rtol=2.0**-18, atol=0)
    with pytest.raises(ValueError, match="ss_out"):
        gemm_skinny(a, wp, _poison(M, N), ss_out=ss)  # no residual: nothing to sum
    with pytest.raises(ValueError, match="ss_in"):
        gemm_skinny(a, wp, _poison(M, N), ss_in=ss)  # without rms_eps


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 64, 128])
@pytest.mark.parametrize("epilogue", ["plain", "swiglu", "out_f32"])
@pytest.mark.parametrize("factors", ["own", "producer"])
def test_skinny_gemm_folded_norm_matches_fp64(M, epilogue, factors):
    """``rms_eps`` with gamma folded into W: y = rsqrt(mean(x^2) + eps) · x · fold_gamma(W)^T
    within the fp32-sum bound of the exact product (the factor's fp32 error is 2^-22), every
    output written, the same bits on a rerun; SwiGLU: silu(gate) · up of the scaled sums. The
    factors from the kernel's own squares or from given sums per 32 columns (``ss_in``)."""
    from kernels.depth.gemm_skinny import fold_gamma, gemm_skinny, pack_weights

    swiglu = epilogue == "swiglu"
    N, K, eps = 2048, 1024, 1e-6
    g = torch.Generator(device="cuda").manual_seed(M + len(epilogue))
    x = _randn(M, K, g=g, scale=3.0)
    w = _randn((2 if swiglu else 1) * N, K, g=g, scale=0.03)
    gamma = (1 + 0.2 * torch.randn(K, device="cuda", generator=g)).to(torch.bfloat16)
    wf = fold_gamma(w, gamma)
    wp = pack_weights(wf, swiglu=swiglu)
    dt = torch.float32 if epilogue == "out_f32" else torch.bfloat16
    kw = dict(rms_eps=eps)
    if factors == "producer":
        kw["ss_in"] = x.float().pow(2).view(M, K // 32, 32).sum(-1).T.contiguous()
    out = gemm_skinny(x, wp, _poison(M, N, dtype=dt), swiglu=swiglu, **kw)
    assert torch.equal(gemm_skinny(x, wp, _poison(M, N, dtype=dt), swiglu=swiglu, **kw), out)
    xd = x.double()
    r = torch.rsqrt(xd.pow(2).mean(1, keepdim=True) + eps)
    exact = r * (xd @ wf.double().T)
    bound = r * K * 2.0**-23 * (xd.abs() @ wf.double().abs().T) + exact.abs() * 2.0**-8
    if swiglu:  # against silu(gate) · up of the kernel's own folded-norm gate and up
        gate = gemm_skinny(x, pack_weights(wf[:N]), _poison(M, N), **kw)
        up = gemm_skinny(x, pack_weights(wf[N:]), _poison(M, N), **kw)
        assert ((gate.double() - exact[:, :N]).abs() <= bound[:, :N]).all()
        want = (torch.nn.functional.silu(gate) * up).float()
        diff = (out.float() - want).abs()
        assert (diff <= 2 * BF16_ULP * want.abs()).all() and (diff == 0).float().mean() >= 0.99
    else:
        assert ((out.double() - exact).abs() <= bound).all()


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 64, 128])
@pytest.mark.parametrize("N,K,splits,warps,m_split", [
    (4096, 1024, None, None, 1), (4096, 1024, None, 4, 1), (1024, 2048, None, None, 1),
    (1024, 2048, None, 8, 1), (1024, 3072, None, None, 1), (2048, 1024, None, None, 1),
    (4096, 1024, 8, None, 1), (1024, 3072, 8, None, 1), (1024, 3072, 8, 8, 1),
    (4096, 1024, None, None, 2), (1024, 2048, None, 4, 2), (1024, 3072, None, 4, 2)])
def test_skinny_gemm_matches_fp64_and_reruns_bit_identical(M, N, K, splits, warps, m_split):
    """``warps`` None: tile_warps' choice (8 for QKV at 16 rows and for down at 128, else 4)."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    g = torch.Generator(device="cuda").manual_seed(M * N + K)
    a = _randn(M, K, g=g)
    w = _randn(N, K, g=g, scale=0.03)
    wp = pack_weights(w)
    out = gemm_skinny(a, wp, _poison(M, N), splits=splits, warps=warps, m_split=m_split)
    exact = a.double() @ w.double().T
    bound = K * 2.0**-23 * (a.double().abs() @ w.double().abs().T) + exact.abs() * 2.0**-8
    assert ((out.double() - exact).abs() <= bound).all()
    assert torch.equal(gemm_skinny(a, wp, _poison(M, N), splits=splits, warps=warps, m_split=m_split), out)  # fixed order
    # epilogues, against the bf16 result above (the same sums in the same order)
    out32 = gemm_skinny(a, wp, _poison(M, N, dtype=torch.float32), splits=splits, warps=warps, m_split=m_split)
    assert torch.equal(out32, out.float())
    resid = _randn(M, N, g=g)
    want = (resid.float() + out.float()).to(torch.bfloat16)
    gemm_skinny(a, wp, resid, resid=resid, splits=splits, warps=warps, m_split=m_split)
    assert torch.equal(resid, want)


@pytest.mark.gpu
@pytest.mark.parametrize("M,splits,warps,m_split", [
    (16, None, None, 1), (128, None, None, 1), (16, 8, None, 1), (64, None, 4, 1), (16, 8, 4, 1),
    (64, None, None, 2)])
def test_skinny_gemm_swiglu_and_strided_fp32_rows(M, splits, warps, m_split):
    """(16, 8): a CTA's share of the outputs (64 with 4 warps, 128 with 8) is smaller than the
    CTA: the extra threads load but must not store. The SwiGLU weights (6144 rows) take 8 warps
    by default up to 64 rows, gate and up alone (3072) 4."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    g = torch.Generator(device="cuda").manual_seed(M)
    N, K = 3072, 1024
    a = _randn(M, K, g=g)
    w = _randn(2 * N, K, g=g, scale=0.03)
    gate = gemm_skinny(a, pack_weights(w[:N]), _poison(M, N), splits=splits)
    up = gemm_skinny(a, pack_weights(w[N:]), _poison(M, N), splits=splits)
    got = gemm_skinny(a, pack_weights(w, swiglu=True), _poison(M, N), swiglu=True,
                      splits=splits, warps=warps, m_split=m_split)
    want = torch.nn.functional.silu(gate) * up
    diff = (got.float() - want.float()).abs()
    assert (diff <= 2 * BF16_ULP * want.float().abs()).all()
    assert (diff == 0).float().mean() >= 0.99
    logits = torch.full((M, 15, N), float("nan"), device="cuda")
    gemm_skinny(a, pack_weights(w[:N]), logits[:, 3], splits=splits)
    assert torch.equal(logits[:, 3], gate.float()) and logits[:, 4].isnan().all()


@pytest.mark.compile
@pytest.mark.parametrize("M,K", [(64, 1024), (128, 3072)])
def test_skinny_gemm_reduction_loads_a_group_before_storing(M, K):
    """The reduction issues all of a group's partial loads (from the peers' shared memory)
    before its stores: a load after a store waits for it, one round trip per output."""
    from kernels.depth.gemm_skinny import REDUCE_GROUP, GemmSkinny, compile_args
    from workbench.compile import compile_report

    g = GemmSkinny(M, K, residual=True)
    ptx = compile_report(g, *compile_args()).ptx
    tail = ptx[ptx.index("ld.shared::cluster"):]  # the reduction's first partial load
    first_store = tail.index("st.global")
    assert tail[:first_store].count("ld.shared::cluster") >= REDUCE_GROUP * g.splits


# ---- the wgmma mainloop fed from shared memory (kernels/depth/gemm_skinny_wgmma.py, v10j) ----------
def test_wgmma_weights_pack_chunk_major_per_tile():
    """pack_weights_wgmma: per tile of 16 * warps rows (pack_weights' weight groups in order)
    and 16-byte chunk of K, the tile's rows; chunk_major: [K / 8, M, 8]. Both permutations."""
    pytest.importorskip("cutlass")
    from kernels.depth.gemm_skinny_wgmma import chunk_major, pack_weights_wgmma

    K, warps = 64, 4
    w = torch.arange(128 * K, dtype=torch.float32).reshape(128, K)
    p = pack_weights_wgmma(w, warps=warps).data.reshape(2, K // 8, 64, 8)
    assert torch.equal(p[1, 3, 5], w[64 + 5, 24:32])
    gu = pack_weights_wgmma(w, swiglu=True, warps=warps).data.reshape(2, K // 8, 64, 8)
    # tile 0, group 1: gate rows 8..15 then up rows 64 + 8..15 (SwiGLU groups of 8 columns)
    assert torch.equal(gu[0, 2, 16 + 3], w[8 + 3, 16:24])
    assert torch.equal(gu[0, 2, 16 + 8 + 3], w[64 + 8 + 3, 16:24])
    a = torch.arange(16 * K, dtype=torch.float32).reshape(16, K)
    cm = chunk_major(a).reshape(K // 8, 16, 8)
    assert torch.equal(cm[5, 9], a[9, 40:48])
    with pytest.raises(ValueError, match="rows"):
        pack_weights_wgmma(w[:96], warps=8)


@pytest.mark.compile
@pytest.mark.parametrize("M,K,kw", [(64, 1024, {}), (64, 3072, dict(m_split=2, residual=True)),
                                    (32, 1024, dict(warps=8, swiglu=True)),
                                    (16, 1024, dict(out_f32=True)), (128, 2048, {})])
def test_skinny_wgmma_mainloop_compiles_to_bulk_copies_and_wgmma(M, K, kw):
    """One wgmma a k16 step of the slice, two bulk copies a stage (weights before the PDL wait,
    a after it), one wait for all wgmma, no proxy fence, no spills, few registers."""
    from kernels.depth.gemm_skinny_wgmma import GemmSkinnyWgmma, compile_args
    from workbench.compile import compile_report

    g = GemmSkinnyWgmma(M, K, pdl=True, **kw)
    r = compile_report(g, *compile_args(kw.get("out_f32", False)))
    assert r.ptx.count("wgmma.mma_async") == g.k_slice // 16
    assert r.ptx.count("cp.async.bulk.shared::cluster.global") == 2 * g.stages
    assert r.ptx.count("wgmma.wait_group") == 1 and "fence.proxy.async" not in r.ptx
    ptx = r.ptx
    assert ptx.index("griddepcontrol.wait") < ptx.rindex("cp.async.bulk.shared::cluster.global")
    assert ptx.index("cp.async.bulk.shared::cluster.global") < ptx.index("griddepcontrol.wait")
    assert r.spill_bytes == 0 and r.registers <= 128


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,kw", [(64, 4096, 1024, {}), (64, 1024, 3072, dict(m_split=2)),
                                      (64, 6144, 1024, {}), (32, 6144, 1024, dict(warps=8)),
                                      (16, 2048, 1024, {}), (128, 1024, 2048, {}),
                                      (64, 1024, 2048, dict(m_split=2, stages=2))])
def test_skinny_wgmma_matches_fp64_and_reruns_bit_identical(M, N, K, kw):
    """The wgmma mainloop against fp64 (every output written: poisoned first), the same bits
    on a rerun, and the epilogues (SwiGLU, fp32 logits, residual) as the mma.sync path's on
    its own sums."""
    from kernels.depth.gemm_skinny import tile_warps
    from kernels.depth.gemm_skinny_wgmma import chunk_major, gemm_skinny_wgmma, pack_weights_wgmma

    kw = dict(kw)
    swiglu, out_f32 = N == 6144, N == 2048
    g = torch.Generator(device="cuda").manual_seed(M * N + K + 3)
    a = _randn(M, K, g=g)
    w = _randn(N, K, g=g, scale=0.03)
    warps = kw.pop("warps", None) or tile_warps(N, K, M)
    wp = pack_weights_wgmma(w, swiglu=swiglu, warps=warps)
    a_cm = chunk_major(a)
    n_out = N // 2 if swiglu else N
    dt = torch.float32 if out_f32 else torch.bfloat16
    out = gemm_skinny_wgmma(a_cm, wp, _poison(M, n_out, dtype=dt), swiglu=swiglu, warps=warps,
                            **kw)
    again = gemm_skinny_wgmma(a_cm, wp, _poison(M, n_out, dtype=dt), swiglu=swiglu,
                              warps=warps, **kw)
    assert torch.equal(again, out)
    from kernels.depth.gemm_skinny import gemm_skinny

    with pytest.raises(ValueError, match="packed for"):  # the other kernel's layout
        gemm_skinny(a, wp, _poison(M, n_out, dtype=dt), swiglu=swiglu)
    exact = a.double() @ w.double().T
    bound = K * 2.0**-23 * (a.double().abs() @ w.double().abs().T) + exact.abs() * 2.0**-8
    if swiglu:  # the gate and up sums through the reference's roundings; an ulp of gate, of
        # up and of the product may each move where the fp32 sum rounds differently: 2^-5
        gate, up = exact[:, :n_out], exact[:, n_out:]
        want = torch.nn.functional.silu(gate.to(torch.bfloat16).float()).to(torch.bfloat16) \
            .float() * up.to(torch.bfloat16).float()
        assert ((out.double() - want.double()).abs()
                <= 2.0**-5 * want.double().abs() + 2e-3).all()
    else:
        assert ((out.double() - exact).abs() <= bound).all()
    if N == 1024:
        resid = _randn(M, N, g=g)
        r2 = resid.clone()
        gemm_skinny_wgmma(a_cm, wp, r2, resid=r2, warps=warps, **kw)
        plain = gemm_skinny_wgmma(a_cm, wp, _poison(M, N, dtype=torch.float32), warps=warps,
                                  **kw)
        assert torch.equal(r2, (resid.float() + plain.to(torch.bfloat16).float())
                           .to(torch.bfloat16))



# ---- the wgmma mainloop with the weights in registers (kernels/depth/gemm_skinny_rwgmma.py, v11a) ---
def test_rwgmma_weights_pack_register_fragments():
    """pack_weights_rwgmma: per weight group, k16 step and lane (g, q), wgmma's register A
    fragment a0..a3 = (row g, k), (g + 8, k), (g, k + 8), (g + 8, k + 8) at k = 16t + 2q, each a
    bf16 pair; SwiGLU groups are the gate then the up rows of 8 columns."""
    pytest.importorskip("cutlass")
    from kernels.depth.gemm_skinny_rwgmma import pack_weights_rwgmma

    K = 64
    w = torch.arange(64 * K, dtype=torch.float32).reshape(64, K)
    p = pack_weights_rwgmma(w).data.reshape(4, K // 16, 8, 4, 8)  # group, step, g, q, 8
    assert p.shape[0] * p.shape[1] * 32 * 8 == w.numel()
    for grp, t, g, q in ((0, 0, 0, 0), (2, 3, 5, 1), (3, 1, 7, 3)):
        k, r = 16 * t + 2 * q, 16 * grp + g
        want = [w[r, k], w[r, k + 1], w[r + 8, k], w[r + 8, k + 1],
                w[r, k + 8], w[r, k + 9], w[r + 8, k + 8], w[r + 8, k + 9]]
        assert p[grp, t, g, q].tolist() == [float(x) for x in want]
    gu = pack_weights_rwgmma(w, swiglu=True).data.reshape(4, K // 16, 8, 4, 8)
    # group 1, lane (g 3, q 0), step 0: gate row 8 + 3, up row 32 + 8 + 3
    assert gu[1, 0, 3, 0, :2].tolist() == w[11, :2].tolist()
    assert gu[1, 0, 3, 0, 2:4].tolist() == w[32 + 11, :2].tolist()
    with pytest.raises(ValueError, match="rows"):
        pack_weights_rwgmma(w[:40])


@pytest.mark.compile
@pytest.mark.parametrize("M,K,kw", [(64, 1024, dict(swiglu=True, splits=2, stages=4)),
                                    (64, 1024, dict(splits=2, m_split=2, stages=4)),
                                    (128, 1024, dict(swiglu=True, stages=4)),
                                    (128, 1024, dict(stages=4)), (32, 1024, dict(warps=8)),
                                    (64, 1024, dict(swiglu=True, splits=2, stages=4,
                                                    a_copy="tma")),
                                    (64, 2048, dict(residual=True, m_split=2, stages=4,
                                                    a_copy="tma")),
                                    (64, 1024, dict(splits=2, m_split=2, stages=8,
                                                    a_copy="tma")),
                                    (64, 2048, dict(residual=True, m_split=2, stages=4)),
                                    (64, 1024, dict(out_f32=True, warps=8, m_split=2)),
                                    (32, 1024, dict(warps=8, swiglu=True)),
                                    # session 13's candidates at 64 rows (gate/up in 8
                                    # stages, the heads in 2 slices, down on TMA)
                                    (64, 1024, dict(swiglu=True, splits=2, stages=8,
                                                    a_copy="tma")),
                                    (64, 1024, dict(out_f32=True, splits=2, stages=4,
                                                    a_copy="tma")),
                                    (64, 3072, dict(residual=True, a_copy="tma"))])
def test_skinny_rwgmma_compiles_to_register_wgmma_and_bulk_copies(M, K, kw):
    """One register-A wgmma a k16 step of the slice, every weight load before the PDL wait and
    every a copy (one bulk copy a stage) after it, one wait for all wgmma, no proxy fence, no
    spills (the loop's default builds of gate/up and qkv at 32, 64 and 128 rows among them)."""
    from kernels.depth.gemm_skinny_rwgmma import GemmSkinnyRegWgmma, compile_args
    from workbench.compile import compile_report

    g = GemmSkinnyRegWgmma(M, K, pdl=True, **kw)
    r = compile_report(g, *compile_args(kw.get("out_f32", False), kw.get("a_copy", "bulk")))
    ptx = r.ptx
    assert ptx.count("wgmma.mma_async") == g.k_slice // 16
    assert "f32.bf16.bf16 {" in ptx and ptx.count("wgmma.wait_group") == 1
    assert "fence.proxy.async" not in ptx
    copy = "cp.async.bulk.shared::cluster.global"
    if kw.get("a_copy") == "tma":  # one box of 64 columns each
        copy = "cp.async.bulk.tensor.2d.shared::cta.global.tile"
        assert ptx.count(copy) == g.k_slice // 64
    else:
        assert ptx.count(copy) == g.stages
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.rindex("ld.global.v4") < wait < ptx.index(copy)
    assert r.spill_bytes == 0


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,kw", [(64, 6144, 1024, dict(splits=2, a_stages=2)),
                                      (64, 4096, 1024, dict(splits=2, m_split=2)),
                                      (64, 1024, 2048, {}), (64, 2048, 1024,
                                                             dict(warps=8, m_split=2)),
                                      (32, 6144, 1024, {}), (16, 4096, 1024, {}),
                                      (128, 1024, 3072, {}),
                                      (64, 6144, 1024, dict(splits=2, a_copy="tma")),
                                      (64, 4096, 1024, dict(splits=2, m_split=2, a_copy="tma")),
                                      (64, 4096, 1024, dict(splits=2, m_split=2, a_stages=8,
                                                            a_copy="tma")),
                                      (64, 1024, 2048, dict(a_copy="tma")),
                                      (32, 2048, 1024, dict(warps=8, a_copy="tma")),
                                      # session 13's candidates at 64 rows: gate/up in 8
                                      # stages, the heads in 2 slices, down on TMA
                                      (64, 6144, 1024, dict(splits=2, a_stages=8,
                                                            a_copy="tma")),
                                      (64, 2048, 1024, dict(splits=2, a_stages=4,
                                                            a_copy="tma")),
                                      (64, 2048, 1024, dict(splits=2, a_stages=8,
                                                            a_copy="tma")),
                                      (64, 1024, 3072, dict(a_copy="tma"))])
def test_skinny_rwgmma_matches_fp64_and_reruns_bit_identical(M, N, K, kw):
    """The register-A wgmma mainloop against fp64 (every output written: poisoned first), the
    same bits on a rerun, the epilogues (SwiGLU, fp32 logits, residual) on its own sums, and
    the chunk-major SwiGLU output equal to the row-major one permuted."""
    from kernels.depth.gemm_skinny_rwgmma import gemm_skinny_rwgmma, pack_weights_rwgmma
    from kernels.depth.gemm_skinny_wgmma import chunk_major

    swiglu, out_f32 = N == 6144, N == 2048
    g = torch.Generator(device="cuda").manual_seed(M * N + K + 5)
    a = _randn(M, K, g=g)
    w = _randn(N, K, g=g, scale=0.03)
    wp = pack_weights_rwgmma(w, swiglu=swiglu)
    a_cm = a if kw.get("a_copy") == "tma" else chunk_major(a)  # TMA reads a row-major
    n_out = N // 2 if swiglu else N
    dt = torch.float32 if out_f32 else torch.bfloat16
    out = gemm_skinny_rwgmma(a_cm, wp, _poison(M, n_out, dtype=dt), swiglu=swiglu, **kw)
    again = gemm_skinny_rwgmma(a_cm, wp, _poison(M, n_out, dtype=dt), swiglu=swiglu, **kw)
    assert torch.equal(again, out)
    from kernels.depth.gemm_skinny import gemm_skinny

    with pytest.raises(ValueError, match="packed for"):  # the other kernel's layout
        gemm_skinny(a, wp, _poison(M, n_out, dtype=dt), swiglu=swiglu)
    exact = a.double() @ w.double().T
    bound = K * 2.0**-23 * (a.double().abs() @ w.double().abs().T) + exact.abs() * 2.0**-8
    if swiglu:  # an ulp of gate, of up and of the product may each move: 2^-5 (as wgmma's)
        gate, up = exact[:, :n_out], exact[:, n_out:]
        want = torch.nn.functional.silu(gate.to(torch.bfloat16).float()).to(torch.bfloat16) \
            .float() * up.to(torch.bfloat16).float()
        assert ((out.double() - want.double()).abs()
                <= 2.0**-5 * want.double().abs() + 2e-3).all()
        cm = gemm_skinny_rwgmma(a_cm, wp, _poison(M, n_out), swiglu=True,
                                chunk_major_out=True, **kw)
        assert torch.equal(cm, chunk_major(out))
    else:
        assert ((out.double() - exact).abs() <= bound).all()
    if N == 1024:
        resid = _randn(M, N, g=g)
        r2 = resid.clone()
        gemm_skinny_rwgmma(a_cm, wp, r2, resid=r2, **kw)
        plain = gemm_skinny_rwgmma(a_cm, wp, _poison(M, N, dtype=torch.float32), **kw)
        assert torch.equal(r2, (resid.float() + plain.to(torch.bfloat16).float())
                           .to(torch.bfloat16))


@pytest.mark.gpu
def test_chunk_major_producers_write_the_row_major_values_permuted():
    """rows_rmsnorm, depth_attention and the wgmma projection's SwiGLU output with
    ``chunk_major``: the same bits as row-major, laid out [K / 8][M][8] (chunk_major())."""
    from kernels.depth.attention import depth_attention
    from kernels.depth.gemm_skinny_wgmma import chunk_major, gemm_skinny_wgmma, pack_weights_wgmma
    from kernels.depth.rows_rmsnorm import rows_rmsnorm

    g = torch.Generator(device="cuda").manual_seed(11)
    M, K = 32, 1024
    x = _randn(M, K, g=g)
    gamma = (1 + 0.1 * torch.randn(K, device="cuda", generator=g)).to(torch.bfloat16)
    row = rows_rmsnorm(x, gamma, _poison(M, K))
    assert torch.equal(rows_rmsnorm(x, gamma, _poison(M, K), chunk_major=True), chunk_major(row))
    qkv = _randn(M, 4096, g=g)
    norms = [(1 + 0.1 * torch.randn(128, device="cuda", generator=g)).to(torch.bfloat16)
             for _ in range(2)]
    cos, sin = (_randn(16, 128, g=g) for _ in range(2))
    caches = [_randn(M, 8, 16, 128, g=g) for _ in range(2)]
    outs = []
    for cm in (False, True):
        kc, vc = (c.clone() for c in caches)
        outs.append(depth_attention(qkv, *norms, cos, sin, kc, vc, 5, _poison(M, 2048),
                                    q_heads=16, kv_heads=8, chunk_major=cm))
    assert torch.equal(outs[1], chunk_major(outs[0]))
    wp = pack_weights_wgmma(_randn(6144, K, g=g, scale=0.03), swiglu=True)
    a_cm = chunk_major(x)
    plain = gemm_skinny_wgmma(a_cm, wp, _poison(M, 3072), swiglu=True)
    cm_out = gemm_skinny_wgmma(a_cm, wp, _poison(M, 3072), swiglu=True, chunk_major_out=True)
    assert torch.equal(cm_out, chunk_major(plain))
    # the mma.sync projection's SwiGLU output likewise (gate/up feeding a wgmma down)
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    ws = pack_weights(_randn(6144, K, g=g, scale=0.03), swiglu=True)
    plain = gemm_skinny(x, ws, _poison(M, 3072), swiglu=True)
    cm_out = gemm_skinny(x, ws, _poison(M, 3072), swiglu=True, chunk_major_out=True)
    assert torch.equal(cm_out, chunk_major(plain))
