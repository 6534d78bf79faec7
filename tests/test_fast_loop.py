"""The fast depth loop against the reference loop: same codes, logits within rounding noise."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.codepredictor import depth_loop, random_weights, rms_norm
from models.codepredictor_config import QWEN3_TTS_1P7B, CodePredictorConfig
from models.fast_loop import FastLoop, FastWeights, bucket_for, draw_topk
from models.sampler import Sampler, SamplerSettings, draw, filtered_scores

TINY = CodePredictorConfig(hidden=64, intermediate=128, layers=2, q_heads=4, kv_heads=2,
                           head_dim=16, talker_hidden=48, vocab=32)


def _inputs(cfg, R, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(R, cfg.talker_hidden, generator=g).to(device=device, dtype=dtype)
    return h, torch.randint(0, 3072, (R,), generator=g).to(device)


def test_fast_loop_greedy_equals_reference_fp64():
    w = random_weights(TINY, seed=1, dtype=torch.float64)
    h, g0 = _inputs(TINY, 3, seed=5, dtype=torch.float64)
    ref = depth_loop(w, h, g0)
    fast = FastLoop(FastWeights(w), 3)(h, g0)
    assert torch.equal(fast.codes, ref.codes)
    # attention scores and softmax are fp32 in both loops (HF's rule), summed in other orders
    assert torch.allclose(fast.logits, ref.logits, rtol=1e-5, atol=1e-6)
    assert torch.allclose(fast.talker_sum, ref.talker_sum, rtol=1e-12, atol=1e-12)
    for (kf, vf), (kr, vr) in zip(fast.kv, ref.kv):
        assert torch.allclose(kf, kr, atol=1e-5) and torch.allclose(vf, vr, atol=1e-5)


def test_fast_loop_teacher_forced_bf16_within_rounding_noise():
    w32 = random_weights(TINY, seed=2, dtype=torch.float32)
    h, g0 = _inputs(TINY, 4, seed=6)
    ref32 = depth_loop(w32, h, g0)
    w16 = w32.to(dtype=torch.bfloat16)
    ref16 = depth_loop(w16, h, g0, codes=ref32.codes)
    fast = FastLoop(FastWeights(w16), 4, teacher_forced=True)(h.to(torch.bfloat16), g0,
                                                              codes=ref32.codes)
    assert torch.equal(fast.codes, ref32.codes)
    noise = (ref16.logits - ref32.logits).norm()
    assert (fast.logits - ref32.logits).norm() <= 2 * noise + 1e-6


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(0, 40), T=st.sampled_from([0.0, 0.7, 1.3]))
def test_draw_topk_equals_the_reference_draw(seed, k, T):
    g = torch.Generator().manual_seed(seed)
    V, R = 32, 4
    logits = torch.randn(R, V, generator=g).round(decimals=1)  # ties at the k-th value
    smp = Sampler(R, SamplerSettings(temperature=T, top_k=k), seeds=[seed % 1000 + i
                                                                       for i in range(R)])
    smp.offset += seed % 17
    ref = draw(filtered_scores(logits, smp.temperature, smp.top_k), smp.temperature, smp.seed,
               smp.offset)
    kmax = min(max(k, 1) if k else V, V)
    got = draw_topk(logits, smp.temperature, smp.top_k, smp.seed, smp.offset, kmax)
    assert torch.equal(got, ref)


def test_bucket_for():
    assert [bucket_for(r) for r in (1, 3, 64, 65, 128)] == [1, 4, 64, 128, 128]
    with pytest.raises(ValueError):
        bucket_for(129)


def test_fast_loop_refuses_what_it_cannot_draw():
    w = random_weights(TINY, seed=3, dtype=torch.float32)
    with pytest.raises(ValueError):
        FastLoop(FastWeights(w), 2, Sampler(2))  # a CPU sampler: no fused draw
    with pytest.raises(ValueError):
        FastLoop(FastWeights(w), 2)(*_inputs(TINY, 3))  # wrong row count
    with pytest.raises(ValueError, match="CUDA"):
        FastLoop(FastWeights(w), 2, path="kernels")  # the CuTe DSL path needs the GPU
    with pytest.raises(ValueError, match="path"):
        FastLoop(FastWeights(w), 2, path="fused")
    with pytest.raises(ValueError, match="tiles"):
        FastLoop(FastWeights(w), 2, tiles={"mlp": {"warps": 8}})  # not a projection's name
    with pytest.raises(ValueError, match="tiles"):
        FastLoop(FastWeights(w), 2, tiles="{'qkv': {'warps': 8}}}")  # a literal that failed


def test_fast_loop_refuses_an_unknown_fold_norm():
    w = random_weights(TINY, seed=0)
    with pytest.raises(ValueError, match="fold_norm"):
        FastLoop(FastWeights(w), 2, fold_norm=True)
    with pytest.raises(ValueError, match="mma"):
        FastLoop(FastWeights(w), 2, mma="hgmma")
    with pytest.raises(ValueError, match="unknown projections"):
        FastLoop(FastWeights(w), 2, mma=("wo", "mlp"))
    with pytest.raises(ValueError, match="fold_norm"):
        FastLoop(FastWeights(w), 2, mma=("down",), fold_norm="own")
    with pytest.raises(ValueError, match="prefill"):
        FastLoop(FastWeights(w), 2, prefill="parallel")
    with pytest.raises(ValueError, match="prefill"):  # a CPU loop runs the compiled path
        FastLoop(FastWeights(w), 2, prefill="overlap")
    with pytest.raises(ValueError, match="input_proj"):
        FastLoop(FastWeights(w), 2, input_proj="cublas")
    with pytest.raises(ValueError, match="input_proj"):  # the kernels path only
        FastLoop(FastWeights(w), 2, input_proj="skinny")
    assert FastLoop(FastWeights(w), 2).input_proj == "torch"  # FRAME_INPUT_PROJ: kernels only


def test_frame_tiles_per_bucket():
    """The measured tiles apply to their bucket's one-chain frame only, per mainloop (none
    on the shared-memory wgmma), and are copies (a loop's edits reach no other loop)."""
    from models.fast_loop import FRAME_TILES, RWGMMA_TILES, frame_mma, frame_tiles, mainloops

    assert frame_tiles(64) == FRAME_TILES[64] and frame_tiles(128) == {} == frame_tiles(16)
    assert frame_tiles(64, mainloops(frame_mma(64, "kernels"))) == RWGMMA_TILES[64]
    assert "heads" not in frame_tiles(64, {"heads": "wgmma"})
    assert frame_tiles(64, {"heads": "rwgmma"})["heads"] == RWGMMA_TILES[64]["heads"]
    frame_tiles(64)["gate_up"]["splits"] = 8
    assert FRAME_TILES[64]["gate_up"]["splits"] == 2


@pytest.mark.parametrize("rows", [1, 48])
def test_layer0_qkv_table_rows_are_each_codes_projection(rows):
    """The per-code table in chunks of the loop's rows (48 rows: one short chunk of TINY's 32
    codes): row (s, code) is layer 0's QKV of ``embed_proj[s][code]``, through the loop's
    own projection (here a float64 stand-in for the kernels), and is built once."""
    w = random_weights(TINY, seed=3, dtype=torch.float64)
    fw = FastWeights(w)
    loop = FastLoop.__new__(FastLoop)
    loop.fw, loop.cfg, loop.run_rows = fw, TINY, rows
    loop.tiles, loop.fold_norm, loop.wgmma, loop.mma = {}, False, frozenset(), "sync"
    loop.kernel_w = {"qkv": fw.qkv}
    calls = []

    def project(name, a, w_, out, buf, *, gamma, sums_ready):
        assert name == "qkv" and a.shape[0] == rows and not sums_ready
        calls.append(1)
        out.copy_(rms_norm(a, gamma, TINY.rms_eps) @ w_.T)

    loop._project = project
    table = loop._layer0_qkv_table()
    assert table.shape == (TINY.positions - 2, TINY.vocab, fw.qkv[0].shape[0])
    want = rms_norm(fw.embed_proj[:TINY.positions - 2], fw.in_norm[0], TINY.rms_eps) @ fw.qkv[0].T
    assert torch.allclose(table, want, rtol=0, atol=1e-12)
    launches = (TINY.positions - 2) * -(-TINY.vocab // rows)
    assert len(calls) == launches
    assert loop._layer0_qkv_table() is table and len(calls) == launches  # kept on fw


def test_frame_mma_per_bucket():
    """The mainloops the frame A/B measured faster: down on the shared-memory wgmma at 64 and
    128 kernel rows, gate/up and qkv on the register-A wgmma at 32-128 (at 64 rows by TMA, o
    and the heads too); on the kernels path without fold_norm only, and as copies."""
    from models.fast_loop import FRAME_MMA, frame_mma

    rw = {"gate_up": "rwgmma", "qkv": "rwgmma"}
    tma = {"gate_up": "rwgmma_tma", "qkv": "rwgmma_tma", "wo": "rwgmma_tma",
           "heads": "rwgmma_tma"}
    assert frame_mma(64, "kernels") == {"down": "wgmma", **tma} == frame_mma(50, "kernels")
    assert frame_mma(128, "kernels") == {"down": "wgmma", **rw}
    assert frame_mma(32, "kernels") == rw
    assert frame_mma(16, "kernels") == "sync" == frame_mma(1, "kernels")
    assert frame_mma(64, "compiled") == "sync" == frame_mma(64, "kernels", fold_norm="own")
    frame_mma(64, "kernels")["down"] = "sync"
    assert FRAME_MMA[64]["down"] == "wgmma"


RWGMMA_ALL = {"qkv": "rwgmma", "wo": "rwgmma", "gate_up": "rwgmma", "down": "wgmma",
              "heads": "rwgmma"}
RWGMMA_TMA = {name: "rwgmma_tma" for name in ("qkv", "wo", "gate_up", "down", "heads")}


def test_mainloops_by_projection():
    from models.fast_loop import mainloops

    assert mainloops(("down",)) == {"down": "wgmma"} and mainloops("sync") == {}
    assert mainloops({"qkv": "rwgmma", "wo": "sync"}) == {"qkv": "rwgmma"}
    with pytest.raises(ValueError, match="projections"):
        mainloops({"qkv": "tensor"})
    with pytest.raises(ValueError, match="projections"):
        mainloops({"attention": "wgmma"})


def test_wgmma_projections_by_name():
    from models.fast_loop import PROJECTIONS, wgmma_projections

    assert wgmma_projections("sync") == frozenset()
    assert wgmma_projections("wgmma") == frozenset(PROJECTIONS)
    assert wgmma_projections(("wo", "down")) == {"wo", "down"}
    assert wgmma_projections([]) == frozenset()


def test_ab_frame_summarises_instances_per_variant():
    from scripts.ab_frame import summary_lines

    times = [[2440, 2438, 2439], [2500, 2501, 2502], [2450, 2449, 2451]]
    assert summary_lines(64, ["defaults", "tiles={}"], [0, 1, 0], times) == [
        "64 rows defaults: mean of 2 instances 2444 µs (medians of rounds 2439-2450)",
        "64 rows tiles={}: median of rounds 2501 µs"]
    assert summary_lines(1, ["refused"], [], []) == []  # a variant refused at build


def test_ab_frame_variants_take_nested_literals():
    from scripts.ab_frame import parse_variant

    assert parse_variant("") == {}
    assert parse_variant("pdl=False,path=kernels") == {"pdl": False, "path": "kernels"}
    assert parse_variant("tiles={'qkv': {'warps': 4}, 'heads': {'splits': 8}},pdl=True") == \
        {"tiles": {"qkv": {"warps": 4}, "heads": {"splits": 8}}, "pdl": True}
    assert parse_variant("fold_norm=producer") == {"fold_norm": "producer"}


def test_profile_end_increments_sum_to_the_span_and_name_kernels_by_class():
    from scripts.profile_fast_loop import end_increments, kernel_kind

    # a, then b overlapping a's tail (PDL), an idle gap, then c; d inside c
    ev = [("c", 20.0, 30.0), ("a", 0.0, 10.0), ("b", 8.0, 15.0), ("d", 22.0, 25.0)]
    rows = end_increments(ev)
    assert rows["a"]["moved"] == 10 and rows["b"]["moved"] == 5 and rows["c"]["moved"] == 15
    assert rows["d"]["moved"] == 0 and rows["b"]["own"] == 7
    assert sum(r["moved"] for r in rows.values()) == 30.0
    assert kernel_kind("kernel_cutlass_kernel_kernelsgemm_skinnyGemmSkinny_object_at__tensor"
                       "ptri32gmemalign16o4819214_0") == "GemmSkinny"
    assert kernel_kind("kernel_cutlass_kernel_kernelsrows_rmsnormRowsRmsNorm_object_at__t") \
        == "RowsRmsNorm"
    assert kernel_kind("nvjet_sm90_tst_64x8") == "nvjet_sm90_tst_64x8"
    assert kernel_kind("kernel_cutlass_kernel_tma_kernelsgemm_skinny_rwgmmaGemmSkinnyRegWgmma"
                       "_object_at__tensor") == "GemmSkinnyRegWgmma"


def test_trace_draw_phase_summary():
    from scripts.trace_frame import phase_summary

    # 2 draws x 3 rows x 6 points (ns): row r of draw d released at 1000 + 10 r
    base = torch.tensor([0, 1000, 1600, 3600, 4100, 5100], dtype=torch.int64)
    stamps = torch.stack([torch.stack([base + 10 * r + 100_000 * d for r in range(3)])
                          for d in range(2)])
    rows = phase_summary(stamps)
    want = {"resident_before_release_us": 1.0, "logits_us": 0.6, "selected_us": 2.0,
            "drawn_us": 0.5, "gathered_us": 1.0, "span_us": 4.12}  # release 1.0, last 5.12 µs
    assert len(rows) == 2 and all(r == pytest.approx(want) for r in rows)


def test_trace_frame_takes_attention_stamps_per_launch():
    from types import SimpleNamespace

    from kernels.depth.attention import ATTN_TRACE_POINTS
    from scripts.trace_frame import phase_summary, traced_stamps

    P = len(ATTN_TRACE_POINTS)
    # 16 positions x 5 layers x 4 run rows (3 real) x 8 kv heads; launch (p, l) at 1000 (5 p + l)
    launch = torch.arange(16 * 5, dtype=torch.int64).reshape(16, 5, 1, 1, 1) * 1000
    stamps = launch + torch.arange(P, dtype=torch.int64) * 100 + torch.zeros(16, 5, 4, 8, P,
                                                                            dtype=torch.int64)
    got, points = traced_stamps(SimpleNamespace(attn_traces=stamps), "attention", 3)
    assert points == ATTN_TRACE_POINTS and tuple(got.shape) == (80, 3 * 8, P)
    summary = phase_summary(got, points)
    assert summary[7]["scored_us"] == pytest.approx(0.1)
    assert summary[7]["span_us"] == pytest.approx(0.1 * (P - 2))


def test_trace_frame_cta_spread_quantiles():
    from scripts.trace_frame import cta_spread

    # 5 CTAs released at 1000 + 100 c ns, each done 400 ns later
    stamps = torch.tensor([[0, 1000 + 100 * c, 1400 + 100 * c] for c in range(5)])
    got = cta_spread(stamps, ("entry", "wait_done", "done"))
    assert got["wait_done"] == pytest.approx([0.0, 0.04, 0.2, 0.36, 0.4])
    assert got["done"][0] == pytest.approx(0.4) and got["entry"][-1] == pytest.approx(-1.0)


def test_profile_labels_the_frames_kernels_by_role():
    from scripts.profile_fast_loop import frame_roles, label_roles

    roles = frame_roles(QWEN3_TTS_1P7B, draw_norm=False)
    # 16 positions x 5 layers x 7 kernels less position 0's last wo, norm, gate_up and down,
    # and a norm, head and draw at positions 1-15
    assert len(roles) == 16 * 5 * 7 - 4 + 15 * 3 and roles.count("heads") == 15
    assert roles[:4] == ["norm_in", "qkv", "attention", "wo"] and roles[-1] == "draw"
    assert roles[4 * 7:4 * 7 + 4] == ["norm_in", "qkv", "attention", "norm_in"]
    # the draws at positions 1-14 normalise the next position's first row
    with_draw_norm = frame_roles(QWEN3_TTS_1P7B)
    assert len(with_draw_norm) == len(roles) - 14
    assert with_draw_norm.count("norm_in") == roles.count("norm_in") - 14
    # the draws gather the next position's first QKV rows: no norm_in nor qkv there
    tabled = frame_roles(QWEN3_TTS_1P7B, draw_norm=False, qkv_table=True)
    assert len(tabled) == len(roles) - 2 * 14 and tabled.count("qkv") == 16 * 5 - 14
    ev = [("nvjet", 0.0, 1.0), ("GemmSkinny", 3.0, 4.0), ("RowsRmsNorm", 1.0, 2.0)]
    assert label_roles(ev, ["norm_in", "qkv"]) == [
        ("nvjet", 0.0, 1.0), ("GemmSkinny:qkv", 3.0, 4.0), ("RowsRmsNorm:norm_in", 1.0, 2.0)]
    assert label_roles(ev, ["norm_in"]) == ev  # counts differ: left unlabelled


def test_row_parts_default_and_checks():
    from models.fast_loop import check_parts, default_parts

    assert default_parts(128) == (64, 64) and default_parts(120) == (64, 56)
    assert default_parts(64) == () and default_parts(112) == ()
    assert check_parts((64,), 64, "kernels") == () and check_parts((), 5, "compiled") == ()
    assert check_parts((32, 16, 5), 53, "kernels") == (32, 16, 5)
    for parts, rows, path in [((64, 64), 128, "compiled"), ((60, 4), 64, "kernels"),
                              ((32, 16), 64, "kernels"), ((64, 0), 64, "kernels")]:
        with pytest.raises(ValueError, match="parts"):
            check_parts(parts, rows, path)
    w = random_weights(TINY, seed=0)
    with pytest.raises(ValueError, match="parts"):  # a CPU loop takes the compiled path
        FastLoop(FastWeights(w), 4, parts=(2, 2))


def test_sampler_rows_view_shares_the_rows():
    settings = [SamplerSettings(temperature=0.5 + 0.1 * i, top_k=3 + i) for i in range(5)]
    whole = Sampler(5, settings, seeds=[9, 8, 7, 6, 5])
    twin = Sampler(5, settings, seeds=[9, 8, 7, 6, 5])
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    view = whole.rows_view(1, 4)
    assert torch.equal(view.sample(logits[1:4]), twin.sample(logits)[1:4])
    view.advance_offsets(2)  # the view's rows of ``whole`` moved, the others not
    assert whole.offset.tolist() == [0, 3, 3, 3, 0]
    with pytest.raises(ValueError, match="rows"):
        whole.rows_view(3, 6)


@pytest.mark.gpu
@pytest.mark.parametrize("R", [1, 16, 64])
def test_fast_loop_draw_noise_norm_and_trace_change_no_bits_on_h200(R):
    """The default draws (early Gumbel terms, ``draw_norm``) against the inline terms without
    the norm, with the draws and the attention steps traced: the same codes, logits, talker
    sum and KV; every draw and attention CTA stamped in order."""
    w = random_weights(QWEN3_TTS_1P7B, seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R + 2, device="cuda", dtype=torch.bfloat16)
    seeds = list(range(400, 400 + R))
    loops = [FastLoop(fw, R, Sampler(R, seeds=seeds, device="cuda"), **kw)
             for kw in ({}, dict(draw_noise="inline", draw_norm=False, draw_trace=True,
                                   attn_trace=True))]
    a, b = (loop(h, g0) for loop in loops)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.logits, b.logits)
    assert torch.equal(a.talker_sum, b.talker_sum)
    assert torch.equal(loops[0].k_cache, loops[1].k_cache)
    assert torch.equal(loops[0].v_cache, loops[1].v_cache)
    stamps = loops[1].draw_traces[:, :R]
    assert (stamps > 0).all() and (stamps.diff(dim=2) >= 0).all()
    stamps = loops[1].attn_traces[:, :, :R]
    assert (stamps > 0).all() and (stamps.diff(dim=-1) >= 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("R", [1, 2, 16, 64, 128])
def test_fast_loop_prefill_overlap_and_qkv_table_change_no_bits_on_h200(R):
    """Position 0 on its own stream beside position 1 (``prefill="overlap"``; at 128 rows in
    each of the two parts), with the talker sum's slot 0 and the offsets on that stream or not
    (``side_copies``), the offsets advanced by the last draw or after it (``draw_advance``;
    with it the GEMVs' x loaded straight into registers, ``gemv_x``),
    and layer 0's QKV rows gathered from the per-code table (``qkv_table``), compute the
    serial loop's bits: codes, logits, talker sum, KV, offsets; sampled and teacher-forced."""
    w = random_weights(QWEN3_TTS_1P7B, seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R + 5, device="cuda", dtype=torch.bfloat16)
    seeds = list(range(500, 500 + R))
    variants = [dict(prefill="serial", qkv_table=False), dict(prefill="overlap", qkv_table=False),
                dict(prefill="overlap", qkv_table=True),
                dict(prefill="overlap", qkv_table=True, side_copies=False),
                dict(prefill="overlap", qkv_table=True, draw_advance=False, gemv_x="direct")]
    loops = [FastLoop(fw, R, Sampler(R, seeds=seeds, device="cuda"), **kw) for kw in variants]
    for frame in range(2):  # the second frame replays over the first's caches
        a, *others = (loop(h, g0) for loop in loops)
        for b in others:
            assert torch.equal(a.codes, b.codes) and torch.equal(a.logits, b.logits)
            assert torch.equal(a.talker_sum, b.talker_sum)
            for (k, v), (k1, v1) in zip(a.kv, b.kv):
                assert torch.equal(k, k1) and torch.equal(v, v1)
        for loop in loops:  # by the last draw, or beside the talker sum (side_copies)
            assert (loop.sampler.offset == (frame + 1) * QWEN3_TTS_1P7B.heads_drawn).all()
    codes = torch.randint(0, QWEN3_TTS_1P7B.vocab, (R, 15), device="cuda")
    a, b = (FastLoop(fw, R, teacher_forced=True, **kw)(h, g0, codes=codes)
            for kw in (variants[0], variants[2]))
    assert torch.equal(a.codes, codes) and torch.equal(a.logits, b.logits)
    assert torch.equal(a.talker_sum, b.talker_sum)


@pytest.mark.gpu
@pytest.mark.parametrize("R,parts", [(128, None), (100, (64, 36))])
def test_fast_loop_row_parts_equal_their_own_loops_on_h200(R, parts):
    """``parts`` (two chains on two streams in one graph; the default at 128 rows): each part's
    rows carry the bits a loop of that part's rows alone computes (codes, logits, talker sum,
    KV), and the loop keeps the reference's bar (forced codes equal, logits within twice the
    bf16 noise)."""
    w = random_weights(QWEN3_TTS_1P7B, seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R, device="cuda", dtype=torch.bfloat16)
    seeds = list(range(200, 200 + R))
    loop = FastLoop(fw, R, Sampler(R, seeds=seeds, device="cuda"), parts=parts)
    assert loop.parts == (64, R - 64)
    out = loop(h, g0)
    assert (loop.sampler.offset == QWEN3_TTS_1P7B.heads_drawn).all()
    # each part alone, with the parts' tiles, mma and input projection (not a lone 64-row
    # frame's own)
    for a, b in ((0, 64), (64, R)):
        alone = FastLoop(fw, b - a, Sampler(b - a, seeds=seeds[a:b], device="cuda"),
                         tiles=loop.tiles, mma=loop.mma,
                         input_proj=loop.part_loops[0].input_proj)(h[a:b], g0[a:b])
        assert torch.equal(out.codes[a:b], alone.codes)
        assert torch.equal(out.logits[a:b], alone.logits)
        assert torch.equal(out.talker_sum[a:b], alone.talker_sum)
        for (k, v), (k1, v1) in zip(out.kv, alone.kv):
            assert torch.equal(k[a:b], k1) and torch.equal(v[a:b], v1)
    ref = depth_loop(w, h, g0, codes=out.codes)
    ref32 = depth_loop(w.to(dtype=torch.float32), h.float(), g0, codes=out.codes)
    forced = FastLoop(fw, R, teacher_forced=True, parts=parts)(h, g0, codes=out.codes)
    assert torch.equal(forced.codes, out.codes)
    assert (forced.logits - ref32.logits).norm() <= 2 * (ref.logits - ref32.logits).norm()


def _assert_talker_sum_one_rounding(w, g0, out, ref):
    """The kernels path's talker sum (fp32 partial of the first 15 slots plus the last, one
    rounding): within one bf16 rounding of the exact sum of its codes' 16 embeddings, and equal
    to the reference's ``sum(1)`` (torch's order) but for rare last-bit ties."""
    embs = [w.talker_embed[g0]] + [w.embeds[s][out.codes[:, s]] for s in range(out.codes.shape[1])]
    terms = torch.stack(embs, 1).double()
    exact = terms.sum(1)
    slack = terms.shape[1] * 2.0**-24 * terms.abs().amax(1, keepdim=True)  # fp32 accumulation
    assert ((out.talker_sum.double() - exact).abs() <= 2.0**-8 * exact.abs() + slack).all()
    if torch.equal(out.codes, ref.codes):
        same = float((out.talker_sum == ref.talker_sum).float().mean())
        assert same >= 0.999, same


@pytest.mark.gpu
def test_fast_loop_on_h200_matches_reference_1p7b():
    w = random_weights(QWEN3_TTS_1P7B, seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    # the fused GEMVs (<= 2 rows), the split-K tensor-core path on 5 rows padded to 16, 16, and
    # 64 (its own tiles, FRAME_TILES)
    for R in (1, 2, 5, 16, 64):
        h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R, device="cuda", dtype=torch.bfloat16)
        seeds = list(range(100, 100 + R))
        ref = depth_loop(w, h, g0, sampler=Sampler(R, seeds=seeds, device="cuda"))
        loop = FastLoop(fw, R, Sampler(R, seeds=seeds, device="cuda"))
        out = loop(h, g0)
        assert (loop.sampler.offset == QWEN3_TTS_1P7B.heads_drawn).all()
        if loop.run_rows > R:  # padding rows change nothing: the same rows of a full loop
            P = loop.run_rows
            full = FastLoop(fw, P, Sampler(P, seeds=seeds + [7] * (P - R), device="cuda"))
            h_p, g_p = _inputs(QWEN3_TTS_1P7B, P, seed=99, device="cuda", dtype=torch.bfloat16)
            h_p[:R], g_p[:R] = h, g0
            got = full(h_p, g_p)
            assert torch.equal(got.codes[:R], out.codes)
            assert torch.equal(got.logits[:R], out.logits)
            assert torch.equal(got.talker_sum[:R], out.talker_sum)
        # sampled codes agree unless bf16 noise moves a near-tie; most rows/groups must agree
        agree = float((out.codes == ref.codes).float().mean())
        assert agree >= 0.8, agree
        forced = FastLoop(fw, R, teacher_forced=True)(h, g0, codes=ref.codes)
        _assert_talker_sum_one_rounding(w, g0, out, ref)
        _assert_talker_sum_one_rounding(w, g0, forced, ref)
        w32 = w.to(dtype=torch.float32)
        ref32 = depth_loop(w32, h.float(), g0, codes=ref.codes)
        noise = (ref.logits - ref32.logits).norm()
        assert torch.equal(forced.codes, ref.codes)
        assert (forced.logits - ref32.logits).norm() <= 2 * noise


@pytest.mark.gpu
@pytest.mark.parametrize("R", [16, 64])
@pytest.mark.parametrize("mode", ["own", "producer"])
def test_fast_loop_fold_norm_on_h200_matches_reference_1p7b(R, mode):
    """``fold_norm`` (no row-norm kernels: gamma in the weights, the factor from the
    projection's own cluster exchange): under teacher forcing the codes are the given ones and
    the logits stay within twice the bf16 loop's noise. Greedy: each code is the argmax of its
    own logits, and those logits are within the noise of the fp32 reference forced to the same
    codes (its normalised rows are not rounded to bf16 as the reference's are, so near-ties
    fall differently and code-by-code agreement with the bf16 loop is not the measure)."""
    w = random_weights(QWEN3_TTS_1P7B, seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R, device="cuda", dtype=torch.bfloat16)
    ref = depth_loop(w, h, g0)  # greedy
    ref32 = depth_loop(w.to(dtype=torch.float32), h.float(), g0, codes=ref.codes)
    noise = (ref.logits - ref32.logits).norm()
    forced = FastLoop(fw, R, teacher_forced=True, fold_norm=mode)(h, g0, codes=ref.codes)
    assert torch.equal(forced.codes, ref.codes)
    assert (forced.logits - ref32.logits).norm() <= 2 * noise
    greedy = FastLoop(fw, R, fold_norm=mode)(h, g0)
    assert torch.equal(greedy.codes, greedy.logits.argmax(-1))
    own32 = depth_loop(w.to(dtype=torch.float32), h.float(), g0, codes=greedy.codes)
    own16 = depth_loop(w, h, g0, codes=greedy.codes)
    assert (greedy.logits - own32.logits).norm() <= 2 * (own16.logits - own32.logits).norm()


@pytest.mark.gpu
@pytest.mark.parametrize("R", [16, 64])
def test_fast_loop_skinny_input_projection_on_h200_matches_reference_1p7b(R):
    """``input_proj="skinny"`` (position 0's input by the skinny GEMM with the bias rows as
    its residual): the bf16 loop's bar, as the wgmma mainloops' below."""
    test_fast_loop_wgmma_on_h200_matches_reference_1p7b(R, None, input_proj="skinny")


@pytest.mark.gpu
@pytest.mark.parametrize("mma", ["wgmma", ("wo", "down"), ("down",), RWGMMA_ALL, RWGMMA_TMA])
@pytest.mark.parametrize("R", [16, 64])
def test_fast_loop_wgmma_on_h200_matches_reference_1p7b(R, mma, **loop_kw):
    """``mma="wgmma"`` (projections by kernels/depth/gemm_skinny_wgmma.py, their inputs kept
    chunk-major), wgmma for o / down (attention and the mma.sync gate/up writing chunk-major),
    for down alone, and the register-A wgmma (kernels/depth/gemm_skinny_rwgmma.py) for the other
    four: the bf16 loop's bar (sampled codes agree, forced codes equal, logits within twice
    its noise)."""
    w = random_weights(QWEN3_TTS_1P7B, seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R, device="cuda", dtype=torch.bfloat16)
    seeds = list(range(100, 100 + R))
    ref = depth_loop(w, h, g0, sampler=Sampler(R, seeds=seeds, device="cuda"))
    out = FastLoop(fw, R, Sampler(R, seeds=seeds, device="cuda"), mma=mma, **loop_kw)(h, g0)
    assert float((out.codes == ref.codes).float().mean()) >= 0.8
    ref32 = depth_loop(w.to(dtype=torch.float32), h.float(), g0, codes=ref.codes)
    noise = (ref.logits - ref32.logits).norm()
    forced = FastLoop(fw, R, teacher_forced=True, mma=mma, **loop_kw)(h, g0, codes=ref.codes)
    assert torch.equal(forced.codes, ref.codes)
    assert (forced.logits - ref32.logits).norm() <= 2 * noise

@pytest.mark.compile
@pytest.mark.parametrize("M,K", [(1, 1024), (8, 3072)])
def test_gemv_compiles_to_16_byte_loads_and_shuffles(M, K):
    from kernels.depth.gemv_small_m import GemvSmallM, compile_args
    from workbench.compile import compile_report

    r = compile_report(GemvSmallM(M, K), *compile_args(M, K))
    assert r.census["ld.global.v4"] == K // 256  # W; x comes by cp.async (x_copy "async")
    assert r.ptx.count("shfl.sync.bfly") == 5 * M and r.spill_bytes == 0
    r = compile_report(GemvSmallM(M, K, x_copy="direct"), *compile_args(M, K))
    assert r.census["ld.global.v4"] == (K // 256) * (M + 1)  # W once, x per row


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("N,K", [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072),
                                 (2048, 1024), (40, 256)])
def test_gemv_small_m_matches_fp64(M, N, K):
    from kernels.depth.gemv_small_m import gemv_small_m

    g = torch.Generator(device="cuda").manual_seed(M * N + K)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemv_small_m(x, w, out=out)
    exact = x.double() @ w.double().T
    # fp32 sums of exact products, one bf16 rounding: |err| <= K·2^-23·Σ|xw| + half a bf16 ulp
    bound = K * 2.0**-23 * (x.double().abs() @ w.double().abs().T) + exact.abs() * 2.0**-8
    assert ((out.double() - exact).abs() <= bound).all()
