"""kernels/depth/gemv_small_m.py (<= 8 rows): the fused GEMV's compiled code, its bits against a
reference that sums and rounds in the kernel's order (tests/depth_helpers.py), its input checks.
Compile tests run anywhere; the rest needs the H200."""
import numpy as np
import pytest
import torch

from tests.depth_helpers import WARP, gemv_reference, gemv_sums, norm_weight, poison, randn_bf16


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
@pytest.mark.parametrize("M,K", [(1, 1024), (8, 3072)])
def test_plain_gemv_compiles_to_16_byte_loads_and_shuffles(M, K):
    """No fusion: W in 16-byte loads (x by cp.async, or with x_copy "direct" one 16-byte load a
    row and chunk), one 5-step butterfly a row, no spills."""
    from kernels.depth.gemv_small_m import GemvSmallM, compile_args
    from workbench.compile import compile_report

    r = compile_report(GemvSmallM(M, K), *compile_args(M, K))
    assert r.census["ld.global.v4"] == K // 256
    assert r.ptx.count("shfl.sync.bfly") == 5 * M and r.spill_bytes == 0
    r = compile_report(GemvSmallM(M, K, x_copy="direct"), *compile_args(M, K))
    assert r.census["ld.global.v4"] == (K // 256) * (M + 1)


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


# ---- the reference's order (CPU) ------------------------------------------------------------
def test_gemv_sums_follow_the_kernels_lane_order():
    """tests/depth_helpers.gemv_sums against the kernel's loops replayed scalar by scalar in
    IEEE fp32 (numpy): lane l adds w·x over its chunks l, l + 32, ... (8 elements each, in
    order), then every lane adds its butterfly partner's sum (offsets 16 .. 1); all lanes end
    equal and equal to the helper's, bit for bit."""
    g = torch.Generator().manual_seed(3)
    M, N, K = 2, 3, 512
    x, w = randn_bf16(M, K, g=g, device="cpu"), randn_bf16(N, K, g=g, device="cpu")
    xs, ws = x.float().numpy(), w.float().numpy()
    got = gemv_sums(x, w).numpy()
    for m in range(M):
        for n in range(N):
            lanes = []
            for lane in range(WARP):
                acc = np.float32(0)
                for i in range(K // 256):
                    for e in range(8):
                        k = 8 * (32 * i + lane) + e
                        acc = np.float32(acc + ws[n, k] * xs[m, k])
                lanes.append(acc)
            for o in (16, 8, 4, 2, 1):
                lanes = [np.float32(lanes[lane] + lanes[lane ^ o]) for lane in range(WARP)]
            assert len(set(v.tobytes() for v in lanes)) == 1
            assert lanes[0].tobytes() == got[m, n].tobytes()


# ---- GPU tests -------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, pytest.param(3, marks=pytest.mark.fast), 8])
def test_fused_gemv_variants_are_bit_exact(M):
    """Every fusion against tests/depth_helpers.gemv_reference, bit for bit (poisoned outputs:
    every element written): the norm prologue (rows normalised as one warp a row sums them),
    out_f32 (the bf16 results widened), the residual (also in place), SwiGLU."""
    from kernels.depth.gemv_small_m import gemv_small_m as gemv

    g = torch.Generator(device="cuda").manual_seed(M)
    K, N = 1024, 2048
    x = randn_bf16(M, K, g=g, scale=3.0)
    w = randn_bf16(2 * N, K, g=g, scale=0.03)
    gamma = norm_weight(K, g)
    out = gemv(x, w[:N], poison(M, N), gamma=gamma)
    assert torch.equal(out, gemv_reference(x, w[:N], gamma_=gamma))
    out32 = gemv(x, w[:N], poison(M, N, dtype=torch.float32), gamma=gamma)
    assert torch.equal(out32, out.float())
    resid = randn_bf16(M, N, g=g)
    want = gemv_reference(x, w[:N], resid=resid)
    assert torch.equal(gemv(x, w[:N], poison(M, N), resid=resid), want)
    gemv(x, w[:N], resid, resid=resid)
    assert torch.equal(resid, want)
    got = gemv(x, w, poison(M, N), swiglu=True)
    assert torch.equal(got, gemv_reference(x, w, swiglu=True))


@pytest.mark.gpu
@pytest.mark.parametrize("M,K", [(1, 1024), (1, 3072), (2, 2048), (3, 3072), (8, 1024),
                                 (8, 4096)])
def test_gemv_x_copies_give_the_same_bits(M, K):
    """``x_copy`` (X_COPIES) moves x by cp.async into shared memory or straight into registers:
    the same sums in the same order, so the reference's bits, plain, with the residual (in
    place) and with SwiGLU."""
    from kernels.depth.gemv_small_m import gemv_small_m as gemv

    g = torch.Generator(device="cuda").manual_seed(M * K)
    N = 1024
    x, w = randn_bf16(M, K, g=g, scale=3.0), randn_bf16(2 * N, K, g=g, scale=0.03)
    resid = randn_bf16(M, N, g=g)
    outs = {}
    for how in ("async", "direct"):
        r = resid.clone()
        gemv(x, w[:N], r, resid=r, x_copy=how)
        outs[how] = (gemv(x, w[:N], poison(M, N), x_copy=how), r,
                     gemv(x, w, poison(M, N), swiglu=True, x_copy=how))
    sums = gemv_sums(x, w[:N])
    plain = sums.to(torch.bfloat16)
    assert torch.equal(outs["async"][0], plain)
    assert torch.equal(outs["async"][1], gemv_reference(x, w[:N], resid=resid))
    for a, b in zip(outs["async"], outs["direct"]):
        assert not a.isnan().any() and torch.equal(a, b)
    with pytest.raises(ValueError, match="x_copy"):
        gemv(x, w[:N], x_copy="tma")


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("N,K", [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072),
                                 (2048, 1024), (40, 256)])
def test_plain_gemv_is_within_the_fp32_sum_bound_of_fp64(M, N, K):
    """The plain projection on the model's projection shapes (and an edge: K = 256, one chunk a
    lane) within the bound of fp32 sums of exact products against fp64: a check that does not
    lean on the reference's summation order."""
    from kernels.depth.gemv_small_m import gemv_small_m

    g = torch.Generator(device="cuda").manual_seed(M * N + K)
    x, w = randn_bf16(M, K, g=g), randn_bf16(N, K, g=g, scale=0.02)
    out = gemv_small_m(x, w, out=poison(M, N))
    exact = x.double() @ w.double().T
    # fp32 sums of exact products, one bf16 rounding: |err| <= K·2^-23·Σ|xw| + half a bf16 ulp
    bound = K * 2.0**-23 * (x.double().abs() @ w.double().abs().T) + exact.abs() * 2.0**-8
    assert ((out.double() - exact).abs() <= bound).all()


@pytest.mark.gpu
def test_fused_gemv_rejects_bad_input():
    from kernels.depth.gemv_small_m import gemv_small_m as gemv

    g = torch.Generator(device="cuda").manual_seed(5)
    x, w = randn_bf16(2, 1024, g=g), randn_bf16(64, 1024, g=g)
    with pytest.raises(ValueError, match="gamma"):
        gemv(x, w, gamma=randn_bf16(512, g=g))
    with pytest.raises(ValueError, match="multiple of 4"):
        gemv(x, w[:63])
    with pytest.raises(TypeError, match="x has dtype float32"):
        gemv(x.float(), w)
    with pytest.raises(ValueError, match="resid"):
        gemv(x, w, resid=randn_bf16(2, 64, g=g), out=torch.zeros(2, 64, device="cuda"))
