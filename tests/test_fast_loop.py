"""The fast depth loop against the reference loop (same codes, logits within rounding noise), its
plan (schedules/plan.py) against the frames it replaced, and the A/B variants of it."""
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.codepredictor import depth_loop, random_weights, rms_norm
from configs.codepredictor import QWEN3_TTS_1P7B, CodePredictorConfig
from models.fast_loop import FastLoop, FastWeights, frame_difference, frame_fingerprint
from models.sampler import Sampler, SamplerSettings
from schedules.plan import (BUCKETS, PROJECTIONS, ProjectionPlan, bucket_for, checked_parts,
                            frame_plan)
from schedules.plan_variant import FrameVariant, variant_plan

REPO = Path(__file__).resolve().parents[1]
TINY = CodePredictorConfig(hidden=64, intermediate=128, layers=2, q_heads=4, kv_heads=2,
                           head_dim=16, talker_hidden=48, vocab=32)


def _plan(rows, variant):
    """The plan of ``variant`` (None: the bucket's, which FastLoop takes by default)."""
    return None if variant is None else variant_plan(rows, variant)


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


def test_bucket_for():
    assert [bucket_for(r) for r in (1, 3, 64, 65, 128)] == [1, 4, 64, 128, 128]
    with pytest.raises(ValueError, match="largest bucket"):
        bucket_for(129)


def test_fast_loop_refuses_what_it_cannot_run():
    fw = FastWeights(random_weights(TINY, seed=3, dtype=torch.float32))
    with pytest.raises(ValueError, match="T / top-k only"):
        FastLoop(fw, 2, Sampler(2))  # a CPU sampler: no fused draw
    with pytest.raises(ValueError, match="for 2 rows"):
        FastLoop(fw, 2)(*_inputs(TINY, 3))
    with pytest.raises(ValueError, match="codes"):
        FastLoop(fw, 2, teacher_forced=True)(*_inputs(TINY, 2))
    with pytest.raises(ValueError, match="plan"):  # a plan: the kernels path (CUDA) only
        FastLoop(fw, 2, plan=variant_plan(2, FrameVariant(pdl=False)))
    with pytest.raises(ValueError, match="plan"):
        FastLoop(fw, 2, plan=FrameVariant(pdl=False))  # a variant is no plan
    with pytest.raises(ValueError, match="plan"):
        FastLoop(fw, 2, plan=frame_plan(3))  # another row count's
    with pytest.raises(ValueError, match="graph"):
        FastLoop(fw, 2, graph=True)
    with pytest.raises(ValueError, match="rows"):
        FastLoop(fw, 0)
    assert FastLoop(fw, 2).plan is None  # the CPU loop has no plan


# What the default GPU frame ran with per bucket before the plan module: FastLoop's own
# derivations at 5be45d6 (frame_mma, frame_tiles, default_parts, FRAME_INPUT_PROJ and the
# draw-noise default), written down as data. Per bucket: kernel rows, parts, per projection
# (mainloop, tile) or None for the GEMVs, input projection, draw noise, the projections whose
# inputs are written chunk-major.
_SYNC = {name: ("sync", {}) for name in PROJECTIONS}
_CHAINS_128 = {**_SYNC, "qkv": ("rwgmma", {}), "gate_up": ("rwgmma", {}), "down": ("wgmma", {})}
EXPECTED_PLANS = {
    1: (1, (), None, "torch", "compact", set()),
    2: (2, (), None, "torch", "compact", set()),
    4: (16, (), _SYNC, "torch", "early", set()),
    8: (16, (), _SYNC, "torch", "early", set()),
    16: (16, (), _SYNC, "torch", "early", set()),
    32: (32, (), {**_SYNC, "qkv": ("rwgmma", {}), "gate_up": ("rwgmma", {})}, "torch", "early",
         {"qkv", "gate_up"}),
    64: (64, (), {"qkv": ("rwgmma_tma", {"splits": 2, "m_split": 2}), "wo": ("rwgmma_tma", {}),
                  "gate_up": ("rwgmma_tma", {"splits": 2, "a_stages": 8}), "down": ("wgmma", {}),
                  "heads": ("rwgmma_tma", {"splits": 2, "a_stages": 8})}, "skinny", "early",
         {"down"}),
    128: (128, (64, 64), _CHAINS_128, "torch", "early", {"qkv", "gate_up", "down"}),
}


def _plan_row(plan) -> tuple:
    projections = None if plan.gemv else {
        name: (plan.projection(name).mainloop, plan.projection(name).tile_kwargs())
        for name in PROJECTIONS}
    return (plan.run_rows, plan.parts, projections, plan.input_proj, plan.draw_noise,
            set(plan.chunk_major_inputs))


@pytest.mark.parametrize("rows", BUCKETS)
def test_default_plan_per_bucket_is_the_frame_it_replaced(rows):
    """Each bucket's plan is what FastLoop derived before (EXPECTED_PLANS), PDL on, no traces,
    padding rows at 4 and 8 rows; a 128-row part runs its parent's mainloops without a lone
    64-row frame's tiles or input projection."""
    plan = frame_plan(rows)
    assert _plan_row(plan) == EXPECTED_PLANS[rows]
    assert plan.pdl and not plan.draw_trace and not plan.attn_trace
    assert plan.padded == (rows in (4, 8))
    for r in plan.parts:
        assert _plan_row(plan.part(r)) == (64, (), _CHAINS_128, "torch", "early",
                                           {"qkv", "gate_up", "down"})
    json.dumps(plan.as_dict())  # plain data, for results files


def test_plans_between_buckets_follow_their_kernel_rows():
    assert _plan_row(frame_plan(5)) == EXPECTED_PLANS[16] and frame_plan(5).padded
    assert _plan_row(frame_plan(50)) == EXPECTED_PLANS[64]
    assert _plan_row(frame_plan(100)) == (112, (), _SYNC, "torch", "early", set())
    plan = frame_plan(120)
    assert _plan_row(plan)[:3] == (128, (64, 56), _CHAINS_128) and plan.part(56).padded


def test_variants_change_only_what_they_name():
    base = frame_plan(64)
    others = [name for name in PROJECTIONS if name != "gate_up"]

    def same_elsewhere(plan):
        return all(plan.projection(n) == base.projection(n) for n in others)

    # a mainloop brings its own measured tile at this bucket (mma.sync's, FRAME_TILES)
    plan = variant_plan(64, FrameVariant(mainloops={"gate_up": "sync"}))
    assert plan.projection("gate_up") == ProjectionPlan("sync", (("a_stages", 2), ("splits", 2)))
    assert same_elsewhere(plan) and plan.input_proj == "skinny"
    assert variant_plan(64, FrameVariant(mainloops={"heads": "wgmma"})).projection("heads") == \
        ProjectionPlan("wgmma")  # none measured on the shared-memory wgmma
    plan = variant_plan(64, FrameVariant(tiles={"gate_up": {"warps": 4}}))  # replaces the tile
    assert plan.projection("gate_up") == ProjectionPlan("rwgmma_tma", (("warps", 4),))
    assert same_elsewhere(plan)
    plan = variant_plan(64, FrameVariant(parts=(32, 32)))  # no lone frame's tiles in parts
    assert plan.parts == (32, 32) and plan.run_rows == 64 and plan.input_proj == "torch"
    assert [p.mainloop for p in plan.projections] == [p.mainloop for p in base.projections]
    assert all(p.tile == () for p in plan.projections)
    assert variant_plan(128, FrameVariant(parts=())).parts == ()
    assert variant_plan(16, FrameVariant(input_proj="skinny")).input_proj == "skinny"
    assert not variant_plan(16, FrameVariant(pdl=False)).pdl
    assert variant_plan(1, FrameVariant(draw_trace=True, attn_trace=True)).draw_trace
    # a variant holds copies: later edits of what built it change no plan
    loops, tiles = {"qkv": "sync"}, {"qkv": {"warps": 4}}
    variant = FrameVariant(mainloops=loops, tiles=tiles)
    loops["qkv"], tiles["qkv"]["warps"] = "wgmma", 8
    assert variant_plan(64, variant).projection("qkv") == ProjectionPlan("sync", (("warps", 4),))
    assert frame_plan(64) == base


@pytest.mark.parametrize("knobs,match", [
    (dict(mainloops={"mlp": "sync"}), "mainloops"), (dict(mainloops={"qkv": "hgmma"}), "mainloops"),
    (dict(mainloops="wgmma"), "mainloops"), (dict(tiles={"mlp": {"warps": 8}}), "tiles"),
    (dict(tiles={"qkv": "{'warps': 8}"}), "tiles"), (dict(tiles={"qkv": {"wraps": 8}}), "tiles"),
    (dict(tiles={"qkv": {"warps": "8"}}), "tiles"), (dict(input_proj="cublas"), "input_proj"),
    (dict(parts=64), "parts"), (dict(pdl="no"), "pdl")])
def test_frame_variant_refuses_unknown_knobs(knobs, match):
    with pytest.raises(ValueError, match=match):
        FrameVariant(**knobs)


@pytest.mark.parametrize("rows,knobs,match", [
    (0, {}, "rows"), (129, {}, "rows"), (2, dict(mainloops={"qkv": "sync"}), "GEMVs"),
    (1, dict(tiles={"qkv": {"warps": 8}}), "GEMVs"), (2, dict(input_proj="skinny"), "input_proj"),
    (18, dict(parts=(16, 2), input_proj="skinny"), "input_proj"),
    (64, dict(parts=(60, 4)), "parts"), (64, dict(parts=(32, 16)), "parts"),
    (64, dict(parts=(64, 0)), "parts"),
    (64, dict(tiles={"down": {"a_stages": 2}}), "'wgmma' takes"),  # its copy: ``stages``
    (16, dict(mainloops={"qkv": "wgmma"}, tiles={"qkv": {"a_stages": 4}}), "'wgmma' takes")])
def test_frame_plan_refuses_what_the_frame_cannot_run(rows, knobs, match):
    with pytest.raises(ValueError, match=match):
        variant_plan(rows, FrameVariant(**knobs))


def test_row_parts_are_checked():
    assert checked_parts((64,), 64) == () and checked_parts((), 5) == ()
    assert checked_parts((32, 16, 5), 53) == (32, 16, 5)
    assert variant_plan(53, FrameVariant(parts=(32, 16, 5))).run_rows == 32 + 16 + 16


def test_every_plan_choice_cites_a_version_of_the_notes():
    """schedules/plan.py's tables carry no µs figures; each of their entry lines cites the
    notes/fast-loop.md version whose A/B chose it, and each cited version is a heading there."""
    src = (REPO / "schedules" / "plan.py").read_text()
    notes = (REPO / "notes" / "fast-loop.md").read_text()
    headings = set(re.findall(r"^#+ (v\d+[a-z]*)", notes, re.MULTILINE))
    tables = ("GEMV_MAX_ROWS", "FRAME_MAINLOOPS", "FRAME_TILES", "RWGMMA_TILES",
              "FRAME_INPUT_PROJ", "FIRST_PART_ROWS", "DRAW_NOISE_GEMV", "DRAW_NOISE_TENSOR_CORE")
    depth, entries = 0, 0
    for line in src.splitlines():
        code, _, comment = line.partition("#")
        if depth == 0 and not re.match(rf"({'|'.join(tables)}) = ", code):
            continue
        depth += code.count("{") - code.count("}")
        if re.search(r"[\"\d]", code):  # an entry (a quoted or numeric key or value)
            entries += 1
            cited = re.findall(r"\bv\d+[a-z]*\b", comment)
            assert cited and set(cited) <= headings, line
    assert entries >= len(tables) and "µs" not in src


@pytest.mark.parametrize("rows", [1, 48])
def test_layer0_qkv_table_rows_are_each_codes_projection(rows):
    """The per-code table in chunks of the loop's rows (48 rows: one short chunk of TINY's 32
    codes): row (s, code) is layer 0's QKV of ``embed_proj[s][code]``, through the loop's
    own projection (here a float64 stand-in for the kernels), and is built once."""
    w = random_weights(TINY, seed=3, dtype=torch.float64)
    fw = FastWeights(w)
    loop = FastLoop.__new__(FastLoop)
    loop.fw, loop.cfg, loop.plan = fw, TINY, frame_plan(rows)
    loop.run_rows = loop.plan.run_rows
    loop.kernel_w = {"qkv": fw.qkv}
    calls = []

    def project(name, a, w_, out, buf, *, gamma):
        assert name == "qkv" and a.shape[0] == rows
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


def test_frame_fingerprint_covers_every_output_bit():
    loop = FastLoop(FastWeights(random_weights(TINY, seed=4, dtype=torch.float32)), 3)
    h, g0 = _inputs(TINY, 3, seed=7)
    out = loop(h, g0)
    print_ = frame_fingerprint(out)
    assert print_ == frame_fingerprint(loop(h, g0)) and len(print_) == 64
    for t in (out.codes, out.logits, out.talker_sum, out.kv[-1][1]):
        bits = t.view(torch.uint8).view(-1)
        bits[-1] ^= 1
        assert frame_fingerprint(out) != print_
        bits[-1] ^= 1
    assert frame_fingerprint(out) == print_


def test_ab_frame_summarises_instances_per_variant():
    from scripts.ab_frame import summary_lines

    times = [[2440, 2438, 2439], [2500, 2501, 2502], [2450, 2449, 2451]]
    assert summary_lines(64, ["defaults", "tiles={}"], [0, 1, 0], times) == [
        "64 rows defaults: mean of 2 instances 2444 µs (medians of rounds 2439-2450)",
        "64 rows tiles={}: median of rounds 2501 µs"]
    assert summary_lines(1, ["refused"], [], []) == []  # a variant refused at build


def test_ab_frame_variants_are_frame_variants():
    from scripts.ab_frame import frame_variant, parse_variant

    assert parse_variant("") == {} and frame_variant("") == FrameVariant()
    assert parse_variant("pdl=False,input_proj=torch") == {"pdl": False, "input_proj": "torch"}
    assert parse_variant("tiles={'qkv': {'warps': 4}, 'heads': {'splits': 8}},pdl=True") == \
        {"tiles": {"qkv": {"warps": 4}, "heads": {"splits": 8}}, "pdl": True}
    assert frame_variant("mainloops={'down': 'sync'},parts=(32, 32)", draw_trace=True) == \
        FrameVariant(mainloops={"down": "sync"}, parts=(32, 32), draw_trace=True)
    assert frame_variant("parts=()", parts=(64, 64)).parts == ()  # the text over the defaults
    with pytest.raises(ValueError, match="fold_norm"):  # a removed knob is an unknown one
        frame_variant("fold_norm=producer")
    with pytest.raises(ValueError, match="mainloops"):
        frame_variant("mainloops={'qkv': 'hgmma'}")


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

    roles = frame_roles(QWEN3_TTS_1P7B)
    # positions 0 and 1: 5 layers of 7 kernels each, less position 0's last wo, norm, gate_up
    # and down, and position 1's final norm, head and draw; then 14 positions of layer 0 from
    # its attention (the draw gathered its QKV rows), 4 whole layers, a norm, head and draw
    prefill = 2 * 5 * 7 - 4 + 3
    assert roles[:prefill] == ["prefill"] * prefill and len(roles) == prefill + 14 * 36
    assert roles[prefill:prefill + 6] == ["attention", "wo", "norm_post", "gate_up", "down",
                                          "norm_in"]
    assert roles[-3:] == ["norm_final", "heads", "draw"] and roles.count("qkv") == 14 * 4
    assert frame_roles(QWEN3_TTS_1P7B, input_proj=True) == ["input_proj"] + roles
    ev = [("nvjet", 0.0, 1.0), ("GemmSkinny", 3.0, 4.0), ("RowsRmsNorm", 1.0, 2.0)]
    assert label_roles(ev, ["norm_in", "qkv"]) == [
        ("nvjet", 0.0, 1.0), ("GemmSkinny:qkv", 3.0, 4.0), ("RowsRmsNorm:norm_in", 1.0, 2.0)]
    assert label_roles(ev, ["norm_in"]) == ev  # counts differ: left unlabelled


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


# ---- on the H200 ---------------------------------------------------------------------------
def _weights_1p7b():
    w = random_weights(QWEN3_TTS_1P7B, seed=0, dtype=torch.bfloat16).to(device="cuda")
    return w, FastWeights(w)


def _snapshot(out):
    """A frame's outputs copied out of the loop's buffers (the next frame overwrites them)."""
    return type(out)(out.codes.clone(), out.talker_sum.clone(),
                     [(k.clone(), v.clone()) for k, v in out.kv], out.logits.clone())


def _prints(out) -> dict:
    """A frame's fingerprint, whole and per part (codes, logits, talker sum, each layer's
    K and V), to tell across processes which part a failure changed."""
    def sha(*ts):
        return hashlib.sha256(b"".join(t.detach().contiguous().cpu().view(torch.uint8).numpy()
                                       .tobytes() for t in ts)).hexdigest()

    return {"frame": frame_fingerprint(out), "codes": sha(out.codes), "logits": sha(out.logits),
            "talker_sum": sha(out.talker_sum),
            **{f"kv{li}": sha(k, v) for li, (k, v) in enumerate(out.kv)}}


def _assert_same_frame(a, b, record: Path | None = None):
    """b has a's bits (codes, logits, talker sum, KV), or the failure says where they first
    differ (models.fast_loop.frame_difference: group, layer and position, the talker sum) and
    keeps both frames' fingerprints, in the message and, with ``record``, in that JSON file."""
    diff = frame_difference(a, b)
    if diff is None:
        return
    report = {"difference": diff, "expected": _prints(a), "got": _prints(b)}
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(report, indent=1))
    kept = f" (kept in {record})" if record is not None else ""
    pytest.fail(f"the frames differ, first at {diff['first']}{kept}: {json.dumps(report)}")


def _all_on(mainloop: str) -> dict:
    return {name: mainloop for name in PROJECTIONS}


@pytest.mark.gpu
@pytest.mark.parametrize("R", [1, 2, 16, 64, 128])
def test_fast_loop_reruns_and_bit_neutral_variants_keep_the_bits_on_h200(R):
    """The default frame, run again from reset offsets, gives its own bits, and the variants
    that promise the plan's bits give them: PDL off (launch timing only), the draws and the
    attention steps traced (every CTA stamped, in order), and at 16 rows tiles that change
    only which warp sums an output (wo's m_split: notes/fast-loop.md v9d) or when its slice of
    the input lands (down's a_stages: v10e). Codes, logits, talker sum, KV and offsets over two
    frames (the second at the advanced offsets); teacher-forced with PDL off too."""
    _, fw = _weights_1p7b()
    h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R + 5, device="cuda", dtype=torch.bfloat16)
    seeds = list(range(500, 500 + R))
    traced = FrameVariant(draw_trace=True, attn_trace=True)
    variants = [None, FrameVariant(pdl=False), traced]
    if frame_plan(R).run_rows == 16:
        variants.append(FrameVariant(tiles={"wo": {"m_split": 2}, "down": {"a_stages": 2}}))
    loops = [FastLoop(fw, R, Sampler(R, seeds=seeds, device="cuda"), plan=_plan(R, v))
             for v in variants]
    for frame in range(2):
        a, *others = (loop(h, g0) for loop in loops)
        for b in others:
            _assert_same_frame(a, b)
        for loop in loops:
            assert (loop.sampler.offset == (frame + 1) * QWEN3_TTS_1P7B.heads_drawn).all()
        if frame == 0:
            first = _snapshot(a)
    loops[0].sampler.offset.zero_()
    _assert_same_frame(loops[0](h, g0), first)
    for chain in loops[2].part_loops or [loops[2]]:
        stamps = chain.draw_traces[:, :chain.rows]
        assert (stamps > 0).all() and (stamps.diff(dim=2) >= 0).all()
        stamps = chain.attn_traces[:, :, :chain.rows]
        assert (stamps > 0).all() and (stamps.diff(dim=-1) >= 0).all()
    codes = torch.randint(0, QWEN3_TTS_1P7B.vocab, (R, 15),
                          generator=torch.Generator().manual_seed(R)).to("cuda")
    a, b = (FastLoop(fw, R, teacher_forced=True, plan=_plan(R, v))(h, g0, codes=codes)
            for v in (None, FrameVariant(pdl=False)))
    assert torch.equal(a.codes, codes)
    _assert_same_frame(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("R,parts", [(128, None), (100, (64, 36))])
def test_fast_loop_row_parts_equal_their_own_loops_on_h200(R, parts):
    """Row parts (two chains on two streams in one graph; the plan's at 128 rows): each part's
    rows carry the bits a lone loop of that part's rows computes with the part's plan (codes,
    logits, talker sum, KV), and the loop keeps the reference's bar (forced codes equal, logits
    within twice the bf16 noise)."""
    w, fw = _weights_1p7b()
    h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R, device="cuda", dtype=torch.bfloat16)
    seeds = list(range(200, 200 + R))
    variant = None if parts is None else FrameVariant(parts=parts)
    loop = FastLoop(fw, R, Sampler(R, seeds=seeds, device="cuda"), plan=_plan(R, variant))
    assert loop.plan.parts == (64, R - 64)
    out = loop(h, g0)
    assert (loop.sampler.offset == QWEN3_TTS_1P7B.heads_drawn).all()
    for (a, b), part in zip(((0, 64), (64, R)), loop.part_loops):
        p = part.plan  # the parent's mainloops without a lone frame's tiles or input projection
        lone = FrameVariant(mainloops={n: p.projection(n).mainloop for n in PROJECTIONS},
                            tiles={n: p.projection(n).tile_kwargs() for n in PROJECTIONS},
                            input_proj=p.input_proj)
        alone_loop = FastLoop(fw, b - a, Sampler(b - a, seeds=seeds[a:b], device="cuda"),
                              plan=variant_plan(b - a, lone))
        assert alone_loop.plan == p
        alone = alone_loop(h[a:b], g0[a:b])
        assert torch.equal(out.codes[a:b], alone.codes)
        assert torch.equal(out.logits[a:b], alone.logits)
        assert torch.equal(out.talker_sum[a:b], alone.talker_sum)
        for (k, v), (k1, v1) in zip(out.kv, alone.kv):
            assert torch.equal(k[a:b], k1) and torch.equal(v[a:b], v1)
    ref = depth_loop(w, h, g0, codes=out.codes)
    ref32 = depth_loop(w.to(dtype=torch.float32), h.float(), g0, codes=out.codes)
    forced = FastLoop(fw, R, teacher_forced=True, plan=_plan(R, variant))(h, g0,
                                                                          codes=out.codes)
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
@pytest.mark.fast
def test_fast_loop_on_h200_matches_reference_1p7b():
    w, fw = _weights_1p7b()
    # the fused GEMVs (<= 2 rows), the split-K tensor-core path on 5 rows padded to 16, 16, and
    # 64 (its own mainloops and tiles)
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
@pytest.mark.parametrize("knobs", ["sync", "sync+wgmma_down", "rwgmma+wgmma_down",
                                   "rwgmma_tma", "input_proj"])
@pytest.mark.parametrize("R", [16, 64])
def test_fast_loop_variants_on_h200_match_reference_1p7b(R, knobs):
    """The live A/B knobs keep the bf16 loop's bar (sampled codes agree, forced codes equal,
    logits within twice its noise): every projection on mma.sync (at 64 rows with FRAME_TILES),
    the same with down on the shared-memory wgmma (gate/up's mma.sync epilogue writing
    chunk-major), the other four on the register-A wgmma by bulk copies (the norms, attention
    and gate/up writing chunk-major), all five on it by TMA, and the other input projection."""
    variant = {"sync": FrameVariant(mainloops=_all_on("sync")),
               "sync+wgmma_down": FrameVariant(mainloops={**_all_on("sync"), "down": "wgmma"}),
               "rwgmma+wgmma_down": FrameVariant(mainloops={**_all_on("rwgmma"),
                                                            "down": "wgmma"}),
               "rwgmma_tma": FrameVariant(mainloops=_all_on("rwgmma_tma")),
               "input_proj": FrameVariant(input_proj="torch" if frame_plan(R).input_proj ==
                                          "skinny" else "skinny")}[knobs]
    w, fw = _weights_1p7b()
    h, g0 = _inputs(QWEN3_TTS_1P7B, R, seed=R, device="cuda", dtype=torch.bfloat16)
    seeds = list(range(100, 100 + R))
    ref = depth_loop(w, h, g0, sampler=Sampler(R, seeds=seeds, device="cuda"))
    out = FastLoop(fw, R, Sampler(R, seeds=seeds, device="cuda"),
                   plan=variant_plan(R, variant))(h, g0)
    assert float((out.codes == ref.codes).float().mean()) >= 0.8
    ref32 = depth_loop(w.to(dtype=torch.float32), h.float(), g0, codes=ref.codes)
    noise = (ref.logits - ref32.logits).norm()
    forced = FastLoop(fw, R, teacher_forced=True, plan=variant_plan(R, variant))(
        h, g0, codes=ref.codes)
    assert torch.equal(forced.codes, ref.codes)
    assert (forced.logits - ref32.logits).norm() <= 2 * noise


HISTORY_ROWS = (1, 16, 64, 128)


def _history_args(cfg, R, kind, seed):
    """A history frame's arguments (CPU generators: the same in every process): (h, g0), and
    the forced codes for "forced"."""
    h, g0 = _inputs(cfg, R, seed=seed, device="cuda", dtype=torch.bfloat16)
    if kind == "sampled":
        return h, g0
    codes = torch.randint(0, cfg.vocab, (R, cfg.heads_drawn),
                          generator=torch.Generator().manual_seed(seed)).to("cuda")
    return h, g0, codes


def _history_loops(fw, R):
    """The history test's two default loops at R rows with their inputs (fixed seeds):
    sampled, and teacher-forced."""
    cfg = fw.config
    return {"sampled": (FastLoop(fw, R, Sampler(R, seeds=list(range(300, 300 + R)),
                                                device="cuda")),
                        _history_args(cfg, R, "sampled", R + 11)),
            "forced": (FastLoop(fw, R, teacher_forced=True),
                       _history_args(cfg, R, "forced", R + 11))}


def _frame_from_reset(loop, args):
    if loop.sampler is not None:
        loop.sampler.offset.zero_()
    return loop(*args)


def history_fingerprints(rows=HISTORY_ROWS) -> dict:
    """{"<rows>/<sampled|forced>": frame_fingerprint} of one frame of each history loop: what a
    fresh process computes for the test below (``python -c``)."""
    _, fw = _weights_1p7b()
    return {f"{R}/{kind}": frame_fingerprint(_frame_from_reset(*case))
            for R in rows for kind, case in _history_loops(fw, R).items()}


@pytest.mark.gpu
@pytest.mark.after_others
def test_captured_frames_bits_never_depend_on_history_or_a_busy_stream(tmp_path):
    """Per bucket (1, 16, 64, 128 rows) the default sampled and teacher-forced frames of two
    input sets in turn (each frame after one of the other inputs: a read of anything before the
    frame wrote it shows), ten times each from reset offsets, every other time beside an
    unrelated matmul loop on another stream: the same codes, logits, talker sum and KV every
    time (a failure names where they first differ and keeps both fingerprints, also in a file
    under tmp_path); and the first set's fingerprints equal those of the same frames computed in
    a fresh process (the bits depend on neither this process's history nor what else runs on
    the GPU)."""
    _, fw = _weights_1p7b()
    busy = torch.cuda.Stream()
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16,
                      generator=torch.Generator(device="cuda").manual_seed(5))
    here = {}
    for R in HISTORY_ROWS:
        for kind, (loop, args) in _history_loops(fw, R).items():
            other = _history_args(fw.config, R, kind, R + 12)
            first = _snapshot(_frame_from_reset(loop, args))
            first_other = _snapshot(_frame_from_reset(loop, other))
            for frame in range(10):
                if frame % 2:  # ~6 ms of tensor-core work queued beside the frame
                    busy.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(busy):
                        for _ in range(4):
                            torch.mm(big, big)
                for name, want, inputs in (("a", first, args), ("b", first_other, other)):
                    _assert_same_frame(want, _frame_from_reset(loop, inputs),
                                       record=tmp_path / f"{R}-{kind}-{frame}{name}.json")
            torch.cuda.current_stream().wait_stream(busy)
            here[f"{R}/{kind}"] = frame_fingerprint(first)
    code = ("import json; from tests.test_fast_loop import history_fingerprints; "
            "print(json.dumps(history_fingerprints()))")
    fresh = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                           text=True, timeout=600, check=False)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert json.loads(fresh.stdout.strip().splitlines()[-1]) == here

