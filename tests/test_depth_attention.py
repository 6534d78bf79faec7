"""kernels/depth/attention.py: one depth-loop attention step (q/k RMSNorm, RoPE, KV append,
attention over <= 16 slots). Its compiled code; the torch reference that rounds as the kernel
does (tests/depth_helpers.py) against models.codepredictor in float64 and the kernel's
reduce-scatter replayed on the CPU; on the H200 the kernel against that reference, bit for bit."""
import numpy as np
import pytest
import torch

from tests.depth_helpers import (WARP, attention_step_model, attention_step_reference,
                                 butterfly_sum, norm_weight, poison, randn_bf16)

Q_HEADS, KV_HEADS, D = 16, 8, 128  # the 1.7B CodePredictor's (configs.codepredictor)


# ---- compile tests (CPU) --------------------------------------------------------------------
@pytest.mark.compile
def test_attention_compiles_with_every_rounding():
    from kernels.depth.attention import ATTN_TRACE_POINTS, DepthAttention, compile_args
    from workbench.compile import compile_report

    r = compile_report(DepthAttention(8, 16, 8), *compile_args(8))
    assert r.spill_bytes == 0 and "griddepcontrol.wait" in r.ptx
    # every bf16 rounding of the reference is there (an extf(truncf) pair folds away silently):
    # norm 2 and RoPE 3 per vector (2 q heads + k), p (one per lane), 2 outputs, the k store
    assert r.ptx.count("cvt.rn.bf16.f32") == 3 * 2 + 3 * 3 + 1 + 2 + 1
    assert "%globaltimer" not in r.ptx
    traced = compile_report(DepthAttention(8, 16, 8, trace=True), *compile_args(8))
    assert traced.spill_bytes == 0 and traced.ptx.count("%globaltimer") == len(ATTN_TRACE_POINTS)


# ---- the reference (CPU) --------------------------------------------------------------------
def test_attention_reference_follows_the_model_in_float64():
    """attention_step_reference(exact=True), the kernel's order without its roundings, against
    models.codepredictor's attention (attention_step_model), both in float64, junk (NaN, inf)
    in the slots above ``pos``. The model takes the norm's statistics in fp32, so the q and k
    vectors are random signs times one power of two each and eps is 0: their mean square is a
    power of 4 and every norm exact in both. The caches then agree bit for bit (the same
    products, added the same way); the outputs differ only by the order of float64 sums, each
    value < 10^3 float64 operations deep (< 2^-43 relative), so 2^-30 of the largest separates
    that from any difference in the operations, which would be O(1)."""
    g = torch.Generator().manual_seed(7)
    M, pos = 2, 9
    width = (Q_HEADS + KV_HEADS) * D
    signs = torch.randint(0, 2, (M, width), generator=g).double() * 2 - 1
    scale = torch.exp2(torch.randint(-2, 3, (M, Q_HEADS + KV_HEADS, 1), generator=g).double())
    qk = (signs.view(M, -1, D) * scale).view(M, width)
    qkv = torch.cat([qk, torch.randn(M, KV_HEADS * D, generator=g, dtype=torch.float64)], 1)
    qn, kn = (1 + 0.2 * torch.randn(D, generator=g, dtype=torch.float64) for _ in range(2))
    cos, sin = (torch.randn(16, D, generator=g, dtype=torch.float64) for _ in range(2))
    kc, vc = (torch.randn(M, KV_HEADS, 16, D, generator=g, dtype=torch.float64)
              for _ in range(2))
    kc[:, :, pos + 1:], vc[:, :, pos + 1:] = float("nan"), float("inf")
    args = (qkv, qn, kn, cos, sin, kc, vc, pos, Q_HEADS, KV_HEADS, 0.0)
    want, kc_want, vc_want = attention_step_model(*args)
    got, kc_got, vc_got = attention_step_reference(*args, exact=True)
    for a, b in ((kc_got, kc_want), (vc_got, vc_want)):
        assert torch.equal(a[:, :, :pos + 1], b[:, :, :pos + 1])
    assert (got - want).abs().max() <= 2.0**-30 * want.abs().max()


def test_attention_reduce_scatter_is_the_butterfly_tree():
    """The kernel's score sums, replayed lane by lane in IEEE fp32 (numpy): each of 32 lanes
    holds 32 (head, slot) products; five steps (offset 16 .. 1) in which a lane keeps one half
    of its list, sends the other to its partner and adds what it receives leave lane i with
    pair i summed over the warp, equal bit for bit to tests/depth_helpers.butterfly_sum over the
    lanes (the tree attention_step_reference uses)."""
    rng = np.random.default_rng(5)
    part = [list(rng.standard_normal(32).astype(np.float32)) for _ in range(WARP)]
    want = butterfly_sum(torch.tensor(np.array(part)).T)  # [pair, lane] -> [pair]
    for step in range(5):
        o = 16 >> step
        upper = [(lane & o) != 0 for lane in range(WARP)]
        send = [[p[i] if up else p[i + o] for i in range(o)] for p, up in zip(part, upper)]
        part = [[np.float32((p[i + o] if up else p[i]) + send[lane ^ o][i]) for i in range(o)]
                for lane, (p, up) in enumerate(zip(part, upper))]
    got = torch.tensor(np.array([p[0] for p in part]))
    assert torch.equal(got, want)


# ---- GPU tests -------------------------------------------------------------------------------
def _step_inputs(M, pos, g):
    from models.codepredictor import rope_tables
    from configs.codepredictor import QWEN3_TTS_1P7B as cfg

    qkv = randn_bf16(M, (Q_HEADS + 2 * KV_HEADS) * D, g=g, scale=2.0)
    qn, kn = norm_weight(D, g, spread=0.2), norm_weight(D, g, spread=0.2)
    cos, sin = rope_tables(cfg, torch.arange(16, device="cuda"), torch.bfloat16, "cuda")
    kc, vc = randn_bf16(M, KV_HEADS, 16, D, g=g), randn_bf16(M, KV_HEADS, 16, D, g=g)
    if pos < 15:  # slots above pos hold junk the mask must ignore
        kc[:, :, pos + 1:] = float("nan")
        vc[:, :, pos + 1:] = float("inf")
    return qkv, qn, kn, cos.contiguous(), sin.contiguous(), kc, vc, cfg.rms_eps


@pytest.mark.gpu
@pytest.mark.parametrize("M,pos", [(1, 0), (1, 7), (3, 15),
                                   pytest.param(8, 5, marks=pytest.mark.fast)])
def test_depth_attention_step_is_bit_exact(M, pos):
    """The output, the appended k and v and the untouched cache slots against
    attention_step_reference, bit for bit (the output poisoned first); the junk above ``pos``
    stays where it was."""
    from kernels.depth.attention import depth_attention

    g = torch.Generator(device="cuda").manual_seed(M * 16 + pos)
    qkv, qn, kn, cos, sin, kc, vc, eps = _step_inputs(M, pos, g)
    want, kc_want, vc_want = attention_step_reference(qkv, qn, kn, cos, sin, kc, vc, pos,
                                                      Q_HEADS, KV_HEADS, eps)
    out = depth_attention(qkv, qn, kn, cos, sin, kc, vc, pos, poison(M, Q_HEADS * D),
                          q_heads=Q_HEADS, kv_heads=KV_HEADS, eps=eps)
    assert torch.equal(out, want)
    assert torch.equal(kc[:, :, :pos + 1], kc_want[:, :, :pos + 1])
    assert torch.equal(vc[:, :, :pos + 1], vc_want[:, :, :pos + 1])
    assert kc[:, :, pos + 1:].isnan().all() and vc[:, :, pos + 1:].isinf().all()


@pytest.mark.gpu
def test_depth_attention_chunk_major_is_the_row_major_permuted():
    """``chunk_major``: the same bits as row-major, laid out [q·D / 8][M][8] (chunk_major())."""
    from kernels.depth.attention import depth_attention
    from kernels.depth.gemm_skinny_wgmma import chunk_major

    g = torch.Generator(device="cuda").manual_seed(11)
    M, pos = 32, 5
    qkv, qn, kn, cos, sin, kc, vc, eps = _step_inputs(M, pos, g)
    outs = []
    for cm in (False, True):
        k2, v2 = kc.clone(), vc.clone()
        outs.append(depth_attention(qkv, qn, kn, cos, sin, k2, v2, pos,
                                    poison(M, Q_HEADS * D), q_heads=Q_HEADS,
                                    kv_heads=KV_HEADS, eps=eps, chunk_major=cm))
    assert torch.equal(outs[1], chunk_major(outs[0]))
