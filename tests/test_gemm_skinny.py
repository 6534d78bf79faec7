"""kernels/depth/gemm_skinny.py (16-128 rows): the split-K mma.sync projection's compiled code,
its packing and partitions replayed on the CPU, and on the H200 its outputs within the derived
fp32 bound of the exact product (tests/depth_helpers.fp32_sum_bound), its epilogues bit for bit
against its own sums."""
import pytest
import torch

from configs.arch import SMEM_PER_CTA_MAX
from schedules.plan import FRAME_TILES
from tests.depth_helpers import (assert_fp32_sums, assert_swiglu_on_own_sums, fp32_sum_bound,
                                 poison, randn_bf16)


# ---- compile tests (CPU) --------------------------------------------------------------------
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
    from schedules.plan import frame_tiles
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


# ---- CPU tests -------------------------------------------------------------------------------
def test_fp32_sum_bound_holds_for_any_order_and_catches_a_second_rounding():
    """tests/depth_helpers.fp32_sum_bound (numerics.gemm_oracle's bound): fp32 sums of the same
    products in three orders (torch's matmul, forward, backward), each rounded once to bf16,
    lie within it; accumulating in bf16 (a rounding a step) leaves it."""
    g = torch.Generator().manual_seed(2)
    M, N, K = 8, 16, 1024
    a, w = randn_bf16(M, K, g=g, device="cpu"), randn_bf16(N, K, g=g, scale=0.03, device="cpu")
    exact, bound = fp32_sum_bound(a, w)
    terms = a.float().unsqueeze(1) * w.float().unsqueeze(0)  # exact products [M, N, K]
    forward, backward, bf16_acc = (torch.zeros(M, N) for _ in range(3))
    for k in range(K):
        forward = forward + terms[..., k]
        backward = backward + terms[..., K - 1 - k]
        bf16_acc = (bf16_acc + terms[..., k]).to(torch.bfloat16).float()
    for s in (a.float() @ w.float().T, forward, backward):
        assert ((s.to(torch.bfloat16).double() - exact).abs() <= bound).all()
    assert not ((bf16_acc.double() - exact).abs() <= bound).all()


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
    """kernels/depth/gemm_skinny.py's transposed mma: lane (g, q) takes its A fragment (weights)
    from one 16-byte unit of pack_weights and its B fragment (a row 8t + g) from words 2s,
    2s + 1 of that row's chunk q; replayed under an emulation of the PTX m16n8k16 layouts, the
    two k16 steps of every 32-wide block give exactly W · a^T, each weight row landing in the
    partial column the kernel stores it to."""
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
    from configs.codepredictor import QWEN3_TTS_1P7B
    from models.fast_loop import projection_shapes

    for M in (16, 32, 64, 128):
        for n, k, swiglu in projection_shapes(QWEN3_TTS_1P7B):
            rows = (2 if swiglu else 1) * n
            g = GemmSkinny(M, k, swiglu=swiglu, warps=tile_warps(rows, k, M),
                           m_split=warps_per_group(rows, k, M))
            assert n % g.tile_out == 0 and g.splits * g.k_slice == k
            assert g.splits <= MAX_SPLITS and g.k_slice % 32 == 0
            assert g.share * g.splits == M * g.tile_out
            assert g.smem_bytes <= SMEM_PER_CTA_MAX


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


# ---- GPU tests -------------------------------------------------------------------------------
def _swiglu_from_own_sums(a, w, **kw):
    """tests/depth_helpers.assert_swiglu_on_own_sums for this kernel; returns the gate."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    return assert_swiglu_on_own_sums(gemm_skinny, pack_weights, a, a, w, **kw)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("M,name", [(M, name) for M, tiles in FRAME_TILES.items()
                                    for name in tiles])
def test_skinny_gemm_frame_tiles_match_fp64(M, name):
    """The loop's measured tiles (FRAME_TILES), every output written (poisoned first): the
    plain projections within the fp32 bound of the exact product (bf16 or fp32 out), SwiGLU
    bit for bit on its own gate and up sums."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    N, K = {"qkv": (4096, 1024), "gate_up": (3072, 1024), "heads": (2048, 1024),
            "wo": (1024, 2048), "down": (1024, 3072)}[name]
    tile = dict(FRAME_TILES[M][name])
    g = torch.Generator(device="cuda").manual_seed(M + N)
    a = randn_bf16(M, K, g=g)
    if name == "gate_up":
        _swiglu_from_own_sums(a, randn_bf16(2 * N, K, g=g, scale=0.03), **tile)
        return
    w = randn_bf16(N, K, g=g, scale=0.03)
    for dtype in (torch.bfloat16, torch.float32):
        assert_fp32_sums(gemm_skinny(a, pack_weights(w), poison(M, N, dtype=dtype), **tile),
                         a, w)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,kw", [(64, 4096, 1024, {}), (64, 1024, 3072, dict(m_split=2)),
                                      (16, 6144, 1024, dict(warps=8)),
                                      (128, 1024, 2048, {})])
@pytest.mark.parametrize("stages", [2, 4])
def test_skinny_gemm_staged_copy_is_bit_identical(M, N, K, kw, stages):
    """``a_stages``: the same sums in the same order as the one-shot copy, so the same bits
    (every output written: poisoned first), the residual and SwiGLU epilogues included."""
    from kernels.depth.gemm_skinny import GemmSkinny, gemm_skinny, pack_weights

    swiglu = N == 6144
    try:
        GemmSkinny(M, K, swiglu=swiglu, a_stages=stages, **kw)
    except ValueError:
        pytest.skip("the copy does not split into whole rounds here")
    g = torch.Generator(device="cuda").manual_seed(M + N + K + stages)
    a = randn_bf16(M, K, g=g)
    wp = pack_weights(randn_bf16(N, K, g=g, scale=0.03), swiglu=swiglu)
    n_out = N // 2 if swiglu else N
    one = gemm_skinny(a, wp, poison(M, n_out), swiglu=swiglu, **kw)
    got = gemm_skinny(a, wp, poison(M, n_out), swiglu=swiglu, a_stages=stages, **kw)
    assert not one.isnan().any() and torch.equal(got, one)
    if not swiglu:
        resid = randn_bf16(M, n_out, g=g)
        want = gemm_skinny(a, wp, resid.clone(), resid=resid, **kw)
        r2 = resid.clone()
        assert torch.equal(gemm_skinny(a, wp, r2, resid=r2, a_stages=stages, **kw), want)


# M x (N, K, splits, warps, m_split); warps None: tile_warps' choice (8 for QKV at 16 rows and
# for down at 128, else 4); one small case in the fast GPU subset
SKINNY_TILES = [(4096, 1024, None, None, 1), (4096, 1024, None, 4, 1), (1024, 2048, None, None, 1),
                (1024, 2048, None, 8, 1), (1024, 3072, None, None, 1), (2048, 1024, None, None, 1),
                (4096, 1024, 8, None, 1), (1024, 3072, 8, None, 1), (1024, 3072, 8, 8, 1),
                (4096, 1024, None, None, 2), (1024, 2048, None, 4, 2), (1024, 3072, None, 4, 2)]
FAST_CASE = (16, 1024, 2048, None, None, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,splits,warps,m_split", [
    pytest.param(M, *t, marks=[pytest.mark.fast] if (M, *t) == FAST_CASE else [])
    for M in (16, 64, 128) for t in SKINNY_TILES])
def test_skinny_gemm_matches_fp64_and_reruns_bit_identical(M, N, K, splits, warps, m_split):
    """Within the fp32 bound of the exact product, every output written (poisoned first), the
    same bits on a rerun (a fixed order), and the epilogues on those sums bit for bit: fp32
    out (the bf16 results widened) and the residual (bf16(resid + bf16(sum)), in place)."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    g = torch.Generator(device="cuda").manual_seed(M * N + K)
    a = randn_bf16(M, K, g=g)
    w = randn_bf16(N, K, g=g, scale=0.03)
    wp = pack_weights(w)
    tile = dict(splits=splits, warps=warps, m_split=m_split)
    out = gemm_skinny(a, wp, poison(M, N), **tile)
    assert_fp32_sums(out, a, w)
    assert torch.equal(gemm_skinny(a, wp, poison(M, N), **tile), out)
    out32 = gemm_skinny(a, wp, poison(M, N, dtype=torch.float32), **tile)
    assert torch.equal(out32, out.float())
    resid = randn_bf16(M, N, g=g)
    want = (resid.float() + out.float()).to(torch.bfloat16)
    gemm_skinny(a, wp, resid, resid=resid, **tile)
    assert torch.equal(resid, want)


@pytest.mark.gpu
@pytest.mark.parametrize("M,splits,warps,m_split", [
    (16, None, None, 1), (128, None, None, 1), (16, 8, None, 1), (64, None, 4, 1), (16, 8, 4, 1),
    (64, None, None, 2)])
def test_skinny_gemm_swiglu_and_strided_fp32_rows(M, splits, warps, m_split):
    """SwiGLU bit for bit on the kernel's own gate and up sums. (16, 8): a CTA's share of the
    outputs (64 with 4 warps, 128 with 8) is smaller than the CTA: the extra threads load but
    must not store. The SwiGLU weights (6144 rows) take 8 warps by default up to 32 rows, gate
    and up alone (3072) 4. Then fp32 logits into strided rows of a larger buffer."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights

    g = torch.Generator(device="cuda").manual_seed(M)
    N, K = 3072, 1024
    a = randn_bf16(M, K, g=g)
    w = randn_bf16(2 * N, K, g=g, scale=0.03)
    gate = _swiglu_from_own_sums(a, w, splits=splits, warps=warps, m_split=m_split)
    logits = torch.full((M, 15, N), float("nan"), device="cuda")
    gemm_skinny(a, pack_weights(w[:N]), logits[:, 3], splits=splits)
    assert torch.equal(logits[:, 3], gate.float()) and logits[:, 4].isnan().all()


@pytest.mark.gpu
def test_skinny_gemm_chunk_major_out_is_the_row_major_permuted():
    """``chunk_major_out`` (the SwiGLU output that feeds a wgmma down): the same bits as
    row-major, laid out [N / 8][M][8] (chunk_major())."""
    from kernels.depth.gemm_skinny import gemm_skinny, pack_weights
    from kernels.depth.gemm_skinny_wgmma import chunk_major

    g = torch.Generator(device="cuda").manual_seed(11)
    M, K = 32, 1024
    x = randn_bf16(M, K, g=g)
    ws = pack_weights(randn_bf16(6144, K, g=g, scale=0.03), swiglu=True)
    plain = gemm_skinny(x, ws, poison(M, 3072), swiglu=True)
    cm_out = gemm_skinny(x, ws, poison(M, 3072), swiglu=True, chunk_major_out=True)
    assert torch.equal(cm_out, chunk_major(plain))
