"""The whole depth frame as one persistent launch (kernels/depth/frame/, issue #26): its
arena layout and phase table (CPU), its compiled kernel (CI), and on the H200 the frame against
the fast loop (models.fast_loop.FastLoop) with given codes and greedy draws.

Tolerances (the issue's): codes and Talker sums exactly equal; KV within 2 % of the largest KV
value, logits within 1.5 % of the largest logit. The frame's tiles are not the loop's (other
sum orders throughout), so nothing else is promised bit-identical to the loop; a second run of
the frame is bit-identical to the first.
"""
from __future__ import annotations

import re

import pytest
import torch

from configs.codepredictor import QWEN3_TTS_1P7B

CFG = QWEN3_TTS_1P7B


def _schedule(rows):
    from schedules import depth_frame as F
    from schedules.plan import FRAME_RING

    return F.build(CFG, F.FrameOptions(rows=rows, **FRAME_RING))


# ---- CPU -------------------------------------------------------------------------------------
def test_qkv_rows_by_kv_head_is_a_permutation_grouping_each_kv_head():
    from kernels.depth.frame.attention import qkv_rows_by_kv_head

    order = qkv_rows_by_kv_head(CFG)
    assert sorted(order) == list(range(CFG.qkv_dim))
    d = CFG.head_dim
    for kv in range(CFG.kv_heads):
        block = order[512 * kv: 512 * (kv + 1)]
        assert block[:2 * d] == list(range(2 * kv * d, (2 * kv + 2) * d))  # q heads 2kv, 2kv+1
        assert block[2 * d] == CFG.q_dim + kv * d  # k head kv
        assert block[3 * d] == CFG.q_dim + CFG.kv_heads * d + kv * d  # v head kv


@pytest.mark.parametrize("rows", [1, 13, 64])
def test_frame_layout_regions_are_disjoint_and_every_phase_points_inside(rows):
    """Regions never overlap, outputs come before constants, and each phase's table row names
    regions of the right kind (its input and output where the schedule's data flow says)."""
    from kernels.depth.frame import frame_layout
    from kernels.depth.frame.table import PHASE_FIELDS, phase_row
    from schedules import depth_frame as F

    a = frame_layout(CFG, rows)
    spans = sorted((a.at[k], a.at[k] + a.size[k], k) for k in a.at)
    for (s0, e0, k0), (s1, _, k1) in zip(spans, spans[1:]):
        assert e0 <= s1, (k0, k1)
        assert s0 % 4 == 0
    assert a.at["sum"] < a.outputs_end <= a.at[("in", 0)]
    assert a.words < 2 ** 31
    col = {n: i for i, n in enumerate(PHASE_FIELDS)}
    starts = {v: k for k, v in a.at.items()}
    s = _schedule(rows)
    for ph in s.phases:
        row = phase_row(ph, a.at, CFG)
        assert len(row) == len(PHASE_FIELDS)
        for name in ("a_word", "y_word", "gamma_word", "kv_word", "rope_word", "code_word",
                     "sum_word", "ssq_in_word", "ssq_out_word", "talker_word"):
            w = row[col[name]]
            assert w == -1 or w in starts, (ph.name, name)
        if ph.type == F.ATTN:
            assert starts[row[col["a_word"]]] == ("qkv", ph.layer, ph.pos)
            assert row[col["slot"]] == ph.pos
        if ph.type == F.EMBED:
            assert row[col["group"]] == ph.pos - 1
            table = row[col["table_word"]]
            assert table == -1 or a.at["embed_proj"] <= table < (a.at["embed_proj"] +
                                                                 a.size["embed_proj"])
            last = ph.pos == CFG.positions
            assert (row[col["table_word"]] == -1) == last == (row[col["sum_word"]] >= 0)
            assert (row[col["a_word"]] == -1) == (ph.pos == 1)


def test_depth_kernel_refusal_runs_the_fast_loop_and_says_why(caplog):
    """depth_kernel=True where the frame kernel cannot run (CPU weights here; a CPU sampler) logs
    the reason, keeps it, and the fast loop gives its usual frame."""
    from models.codepredictor import random_weights
    from configs.codepredictor import CodePredictorConfig
    from models.fast_loop import FastLoop, FastWeights, _depth_frame_or_reason
    from models.sampler import Sampler

    tiny = CodePredictorConfig(hidden=64, intermediate=128, layers=2, q_heads=4, kv_heads=2,
                               head_dim=16, talker_hidden=48, vocab=32)
    fw = FastWeights(random_weights(tiny, seed=3, dtype=torch.float32))
    g = torch.Generator().manual_seed(1)
    h, g0 = torch.randn(2, tiny.talker_hidden, generator=g), torch.tensor([3, 17])
    with caplog.at_level("WARNING"):
        loop = FastLoop(fw, 2, depth_kernel=True)
    assert loop.depth_frame is None and "1.7B" in loop.depth_kernel_refused
    assert "depth_kernel refused" in caplog.text
    assert torch.equal(loop(h, g0).codes, FastLoop(fw, 2)(h, g0).codes)
    frame, why = _depth_frame_or_reason(fw, 2, Sampler(2, seeds=[1, 2]), False, None)
    assert frame is None and "fused_draw_args" in why  # a CPU sampler (test_depth_frame_sample)
    auto = FastLoop(fw, 2, depth_kernel="auto")  # the plan: the loop at every row count
    assert auto.depth_frame is None and "dispatch rule" in auto.depth_kernel_refused
    with pytest.raises(ValueError, match="depth_kernel"):
        FastLoop(fw, 2, depth_kernel="yes")


# ---- compile (CI) ----------------------------------------------------------------------------
@pytest.mark.compile
@pytest.mark.parametrize("rows,draw", [(1, "greedy"), (64, "given")])
def test_frame_kernel_compiles_with_every_body(rows, draw):
    """The whole frame's kernel: wgmma, the bulk copies, the acquire / release counters, the
    cluster handoff (mapa + st.shared::cluster), the attention and embedding bodies' L2 loads,
    no spills and no calls (SwiGLU's and the softmax's divisions are div_newton). One K stage
    of wgmmas a tile width (its stages a runtime loop), and **under 8k SASS instructions**
    (#37 item 4: a task body ran 2-3x slower in the 18.5k-instruction build than in a build of
    its own, notes/depth-frame.md session 28)."""
    from kernels.depth.frame import FrameBuild, FrameKernel, compile_args
    from kernels.depth.frame.projection import TILE_WIDTHS
    from schedules.plan import FRAME_RING, frame_k_stage
    from workbench.compile import compile_report

    r = compile_report(FrameKernel(FrameBuild(512, 2, False, *FRAME_RING.values(), rows=rows,
                                              fused=True, draw=draw, norm_once=rows == 64)),
                       *compile_args())
    ptx = r.ptx
    wgmmas = len(TILE_WIDTHS) * frame_k_stage(rows) // 16  # one K stage a tile width
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n") == wgmmas
    for needle in ("cp.async.bulk.shared::cluster.global", "ld.acquire.gpu.global.b32",
                   "red.release.gpu.global.add.s32", "mapa.shared::cluster.u32",
                   "st.shared::cluster", "ld.relaxed.gpu.global.v4.b32", "rcp.approx.f32",
                   "shfl.sync.bfly"):
        assert needle in ptx, needle
    assert "div.rn.f32" not in ptx
    assert_small_frame_code(r)


def assert_small_frame_code(r) -> None:
    """A frame build's code as #37 item 4 asks: no stack frame, no spills, no calls, under 8k
    SASS instructions (skips where nvdisasm is missing, after the PTX-level checks)."""
    assert r.frame_bytes == 0 and r.spill_bytes == 0
    if r.sass is None:
        pytest.skip("nvdisasm is not installed (pip nvidia-cuda-nvdisasm): SASS not counted")
    assert not re.search(r"^\s*/\*[0-9a-f]+\*/\s+CALL\.", r.sass, re.M)
    assert r.sass_instructions < 8000


# ---- on the H200 -----------------------------------------------------------------------------
def _weights():
    from models.codepredictor import random_weights
    from models.fast_loop import FastWeights

    w = random_weights(CFG, seed=0, dtype=torch.bfloat16).to(device="cuda")
    return w, FastWeights(w)


def _inputs(rows, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(rows, CFG.talker_hidden, generator=g, device="cuda").to(torch.bfloat16)
    g0 = torch.randint(0, CFG.talker_vocab, (rows,), generator=g, device="cuda")  # the Talker's
    return h, g0


def _snapshot(out):
    """A copy of a frame's outputs (experiments._frame_studies.snapshot_outputs)."""
    from experiments._frame_studies import snapshot_outputs

    return snapshot_outputs(out)


def _same(a, b) -> bool:
    """Codes, logits, Talker sum and KV equal bit for bit (experiments._frame_studies.same_bits:
    their bit patterns, so a NaN or a -0.0 counts too)."""
    from experiments._frame_studies import same_bits

    return same_bits(a, b)


def _option_outputs(rows: int, teacher_forced: bool, option: str, codes_seed: int,
                    rerun: bool = False):
    """The frame with DepthFrame keyword ``option`` off and on, each on a poisoned arena, on
    the same weights and inputs (given codes drawn from ``codes_seed``): ({False: outputs,
    True: outputs}, {False: run, True: run}), each first run leaving every counter at its
    count and no combine mismatch. ``rerun``: the option's frame runs again on a poisoned arena
    and must repeat its outputs bit for bit, its counters at their counts again."""
    from kernels.depth.frame import DepthFrame

    _, fw = _weights()
    h, g0 = _inputs(rows, seed=rows)
    g = torch.Generator(device="cuda").manual_seed(codes_seed)
    codes = (torch.randint(0, CFG.vocab, (rows, CFG.heads_drawn), generator=g, device="cuda")
             if teacher_forced else None)
    outs, runs = {}, {}
    for on in (False, True):
        frame = DepthFrame(fw, rows, teacher_forced=teacher_forced, **{option: on})
        frame.poison()
        outs[on] = _snapshot(frame(h, g0, codes))
        frame.run.synchronize()
        assert frame.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}
        if rerun and on:
            frame.poison()
            again = _snapshot(frame(h, g0, codes))
            frame.run.synchronize()
            assert frame.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}
            assert _same(again, outs[on])
        runs[on] = frame.run
        del frame
    return outs, runs


def _close(frame, loop) -> dict:
    """The issue's comparisons: KV within 2 % of the largest KV value, logits within 1.5 % of
    the largest logit (worst ratios reported)."""
    kv = max(float((a.float() - b.float()).abs().max() / b.float().abs().max())
             for (ka, va), (kb, vb) in zip(frame.kv, loop.kv) for a, b in ((ka, kb), (va, vb)))
    lg = float((frame.logits - loop.logits).abs().max() / loop.logits.abs().max())
    return {"kv": kv, "logits": lg}


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_frame_matches_the_fast_loop_with_given_codes(rows):
    """Teacher forcing (the codes of a greedy reference run): codes and Talker sums exactly the
    fast loop's, KV and logits within the issue's tolerances; a second run (outputs poisoned
    first) and a CUDA-graph replay bit-identical to the first."""
    from kernels.depth.frame import DepthFrame
    from models.codepredictor import depth_loop
    from models.fast_loop import FastLoop

    w, fw = _weights()
    h, g0 = _inputs(rows, seed=rows)
    codes = depth_loop(w, h, g0).codes
    loop = _snapshot(FastLoop(fw, rows, teacher_forced=True)(h, g0, codes=codes))
    frame = DepthFrame(fw, rows, teacher_forced=True)
    frame.poison()
    first = _snapshot(frame(h, g0, codes))
    frame.run.synchronize()
    assert frame.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}
    sums_equal = float((first.talker_sum == loop.talker_sum).float().mean())
    assert sums_equal == 1.0, f"Talker sums: {sums_equal:.6f} of elements equal"
    worst = _close(first, loop)
    print(f"rows {rows}: worst KV {worst['kv']:.4f}, logits {worst['logits']:.4f}")
    assert worst["kv"] <= 0.02 and worst["logits"] <= 0.015, worst
    frame.poison()
    assert _same(_snapshot(frame(h, g0, codes)), first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = frame(h, g0, codes)
    frame.poison()
    graph.replay()
    torch.cuda.synchronize()
    assert _same(_snapshot(out), first)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_frame_greedy_codes_match_the_fast_loop_but_near_ties(rows):
    """Greedy: each row's codes equal the fast loop's up to its first difference, and every
    first difference is a near tie (the two codes' logits, in the loop's frame, within the
    logits' tolerance of each other). The rate is printed."""
    from kernels.depth.frame import DepthFrame
    from models.fast_loop import FastLoop

    from models.sampler import argmax_candidates

    w, fw = _weights()
    h, g0 = _inputs(rows, seed=100 + rows)
    loop = _snapshot(FastLoop(fw, rows)(h, g0))
    frame = _snapshot(DepthFrame(fw, rows)(h, g0))
    assert ((frame.codes >= 0) & (frame.codes < CFG.vocab)).all()
    # exact self-consistency: each draw is the greedy rule on the frame's own bf16 logits, and
    # the Talker sum is the fp32 slot-order sum of its own codes' rows, rounded once
    for s in range(CFG.heads_drawn):
        assert torch.equal(frame.codes[:, s], argmax_candidates(frame.logits[:, s]))
    acc = w.talker_embed[g0].float()
    for s in range(CFG.heads_drawn):
        acc = acc + w.embeds[s][frame.codes[:, s]].float()
    assert torch.equal(frame.talker_sum, acc.to(torch.bfloat16))
    scale = float(loop.logits.abs().max())
    differ = 0
    for r in range(rows):
        bad = (frame.codes[r] != loop.codes[r]).nonzero()
        if len(bad) == 0:
            continue
        differ += 1
        s = int(bad[0])
        lg = loop.logits[r, s]
        gap = float(lg[loop.codes[r, s]] - lg[frame.codes[r, s]])
        assert 0 <= gap <= 0.015 * scale, (r, s, gap, scale)
    print(f"rows {rows}: {differ} of {rows} rows differ from the fast loop (near ties)")


@pytest.mark.gpu
def test_frame_takes_g0_from_the_whole_talker_codebook():
    """g0 is a Talker code (3072 entries, the groups' 2048): rows with g0 >= 2048 gather their
    position-1 input and their Talker sum's first slot from the end of the codebook, exactly as
    the fast loop does; g0 or codes outside their codebooks are refused before the launch."""
    from kernels.depth.frame import DepthFrame
    from models.codepredictor import depth_loop
    from models.fast_loop import FastLoop

    w, fw = _weights()
    h, _ = _inputs(8, seed=31)
    g0 = torch.tensor([2048, 3071, 0, 2500, 2047, 3000, 1, 2049], device="cuda")
    codes = depth_loop(w, h, g0).codes
    loop = _snapshot(FastLoop(fw, 8, teacher_forced=True)(h, g0, codes=codes))
    frame = DepthFrame(fw, 8, teacher_forced=True)
    got = _snapshot(frame(h, g0, codes))
    assert torch.equal(got.talker_sum, loop.talker_sum)
    worst = _close(got, loop)
    assert worst["kv"] <= 0.02 and worst["logits"] <= 0.015, worst
    with pytest.raises(ValueError, match="g0 holds codes outside"):
        frame(h, torch.full_like(g0, CFG.talker_vocab), codes)
    with pytest.raises(ValueError, match="codes holds codes outside"):
        frame(h, g0, torch.full_like(codes, -1))


@pytest.mark.gpu
def test_fast_loop_depth_kernel_runs_the_frame_and_replays():
    """FastLoop(depth_kernel=True) on the H200 takes the frame kernel (no refusal), its graph
    replays to the same outputs, and it refuses 65 rows with the reason."""
    from models.fast_loop import FastLoop

    from kernels.depth.frame import DepthFrame

    _, fw = _weights()
    h, g0 = _inputs(8, seed=8)
    h2, g2 = _inputs(8, seed=9)
    loop = FastLoop(fw, 8, depth_kernel=True)
    assert loop.depth_frame is not None and loop.depth_kernel_refused is None
    direct = DepthFrame(fw, 8)
    a = _snapshot(loop(h, g0))
    assert _same(a, _snapshot(direct(h, g0)))  # the replay is the frame on these inputs
    other = _snapshot(loop(h2, g2))
    assert _same(other, _snapshot(direct(h2, g2))) and not _same(other, a)
    assert _same(_snapshot(loop(h, g0)), a)
    assert "64" in FastLoop(fw, 65, depth_kernel=True, graph=False).depth_kernel_refused
