"""kernels/depth/gemm_skinny_rwgmma.py: the skinny projection with wgmma taking the weights from
registers (notes/fast-loop.md v11a), its a slice by bulk copies or TMA. Its packing, its compiled
code, and on the H200 its outputs within the derived fp32 bound (tests/depth_helpers.py), its
epilogues bit for bit."""
import pytest
import torch

from tests.depth_helpers import assert_fp32_sums, assert_swiglu_on_own_sums, poison, randn_bf16


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
                                      (32, 6144, 1024, {}),
                                      pytest.param(16, 4096, 1024, {}, marks=pytest.mark.fast),
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
    """The register-A wgmma mainloop within the fp32 bound of the exact product (every output
    written: poisoned first; fp32 logits at N = 2048), the same bits on a rerun, and the
    epilogues on its own sums bit for bit: SwiGLU (N = 6144: assert_swiglu_on_own_sums; its
    chunk-major output the row-major one permuted), the residual."""
    from kernels.depth.gemm_skinny import gemm_skinny
    from kernels.depth.gemm_skinny_rwgmma import gemm_skinny_rwgmma, pack_weights_rwgmma
    from kernels.depth.gemm_skinny_wgmma import chunk_major

    swiglu, out_f32 = N == 6144, N == 2048
    g = torch.Generator(device="cuda").manual_seed(M * N + K + 5)
    a = randn_bf16(M, K, g=g)
    w = randn_bf16(N, K, g=g, scale=0.03)
    a_in = a if kw.get("a_copy") == "tma" else chunk_major(a)  # TMA reads a row-major
    if swiglu:
        _, out = assert_swiglu_on_own_sums(gemm_skinny_rwgmma, pack_weights_rwgmma, a_in, a, w,
                                           **kw)
        wp = pack_weights_rwgmma(w, swiglu=True)
        cm = gemm_skinny_rwgmma(a_in, wp, poison(M, N // 2), swiglu=True, chunk_major_out=True,
                                **kw)
        assert torch.equal(cm, chunk_major(out))
        return
    wp = pack_weights_rwgmma(w)
    dt = torch.float32 if out_f32 else torch.bfloat16
    out = gemm_skinny_rwgmma(a_in, wp, poison(M, N, dtype=dt), **kw)
    assert_fp32_sums(out, a, w)
    assert torch.equal(gemm_skinny_rwgmma(a_in, wp, poison(M, N, dtype=dt), **kw), out)
    with pytest.raises(ValueError, match="packed for"):  # the other kernel's layout
        gemm_skinny(a, wp, poison(M, N, dtype=dt))
    if N == 1024:
        resid = randn_bf16(M, N, g=g)
        r2 = resid.clone()
        gemm_skinny_rwgmma(a_in, wp, r2, resid=r2, **kw)
        assert torch.equal(r2, (resid.float() + out.float()).to(torch.bfloat16))
