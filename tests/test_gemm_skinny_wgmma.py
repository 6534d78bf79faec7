"""kernels/depth/gemm_skinny_wgmma.py: the skinny projection with wgmma fed from shared memory by
bulk copies (notes/fast-loop.md v10j). Its packing, its compiled code, and on the H200 its
outputs within the derived fp32 bound (tests/depth_helpers.py), its epilogues bit for bit."""
import pytest
import torch

from tests.depth_helpers import assert_fp32_sums, assert_swiglu_on_own_sums, poison, randn_bf16


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
                                      pytest.param(16, 2048, 1024, {}, marks=pytest.mark.fast),
                                      (128, 1024, 2048, {}),
                                      (64, 1024, 2048, dict(m_split=2, stages=2))])
def test_skinny_wgmma_matches_fp64_and_reruns_bit_identical(M, N, K, kw):
    """The wgmma mainloop within the fp32 bound of the exact product (every output written:
    poisoned first; fp32 logits at N = 2048), the same bits on a rerun, and the epilogues on its
    own sums bit for bit: SwiGLU (N = 6144: assert_swiglu_on_own_sums), the residual."""
    from kernels.depth.gemm_skinny import gemm_skinny, tile_warps
    from kernels.depth.gemm_skinny_wgmma import chunk_major, gemm_skinny_wgmma, pack_weights_wgmma

    kw = dict(kw)
    swiglu, out_f32 = N == 6144, N == 2048
    g = torch.Generator(device="cuda").manual_seed(M * N + K + 3)
    a = randn_bf16(M, K, g=g)
    w = randn_bf16(N, K, g=g, scale=0.03)
    kw["warps"] = kw.get("warps") or tile_warps(N, K, M)
    a_cm = chunk_major(a)
    if swiglu:
        assert_swiglu_on_own_sums(
            gemm_skinny_wgmma, lambda t, s: pack_weights_wgmma(t, s, kw["warps"]), a_cm, a, w,
            **kw)
        return
    wp = pack_weights_wgmma(w, warps=kw["warps"])
    dt = torch.float32 if out_f32 else torch.bfloat16
    out = gemm_skinny_wgmma(a_cm, wp, poison(M, N, dtype=dt), **kw)
    assert_fp32_sums(out, a, w)
    assert torch.equal(gemm_skinny_wgmma(a_cm, wp, poison(M, N, dtype=dt), **kw), out)
    with pytest.raises(ValueError, match="packed for"):  # the other kernel's layout
        gemm_skinny(a, wp, poison(M, N, dtype=dt))
    if N == 1024:
        resid = randn_bf16(M, N, g=g)
        r2 = resid.clone()
        gemm_skinny_wgmma(a_cm, wp, r2, resid=r2, **kw)
        assert torch.equal(r2, (resid.float() + out.float()).to(torch.bfloat16))


@pytest.mark.gpu
def test_skinny_wgmma_chunk_major_out_is_the_row_major_permuted():
    """``chunk_major_out`` (SwiGLU into a next wgmma projection): the same bits as row-major,
    laid out [N / 8][M][8] (chunk_major())."""
    from kernels.depth.gemm_skinny_wgmma import chunk_major, gemm_skinny_wgmma, pack_weights_wgmma

    g = torch.Generator(device="cuda").manual_seed(11)
    M, K = 32, 1024
    a_cm = chunk_major(randn_bf16(M, K, g=g))
    wp = pack_weights_wgmma(randn_bf16(6144, K, g=g, scale=0.03), swiglu=True)
    plain = gemm_skinny_wgmma(a_cm, wp, poison(M, 3072), swiglu=True)
    cm_out = gemm_skinny_wgmma(a_cm, wp, poison(M, 3072), swiglu=True, chunk_major_out=True)
    assert torch.equal(cm_out, chunk_major(plain))
