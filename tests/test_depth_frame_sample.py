"""The depth frame's sampled draw (issue #37 item 6; notes/depth-frame.md, session 27): the host
side's dispatch and parameter layout (CPU), the sampled build's compiled kernel (CI), and on the
H200 its codes against models.sampler on the frame's own logits.

The frame draws with the fast loop's per-row body (kernels/depth/draw.py RowDraw), so each code
is exactly the one Sampler.sample() picks from the frame's logits (bf16 values in fp32) at the
row's temperature, top-k, seed and offset + group - 1; the offsets advance by 15 a frame. Steps
the fused draw cannot take (fused_draw_args() None, top-p) go to the fast loop.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from configs.codepredictor import QWEN3_TTS_1P7B
from models.sampler import Sampler, SamplerSettings

CFG = QWEN3_TTS_1P7B


def _fusable(sampler: Sampler) -> Sampler:
    """A CPU sampler that answers fused_draw_args() as a CUDA one would (host-side dispatch
    only: nothing here draws)."""
    sampler.device = torch.device("cuda")
    return sampler


# ---- CPU -------------------------------------------------------------------------------------
def test_sampler_refusal_follows_fused_draw_args_and_refuses_top_p():
    """The frame takes a step only where fused_draw_args() returns args (not for an eager step,
    a repetition penalty, min-p, logprobs, a kept last token or a CPU sampler) and no row uses
    top-p (the fused draw has none); logprobs make fused_draw_args() None (the seed's bug)."""
    from kernels.depth.frame import sampler_refusal

    assert sampler_refusal(_fusable(Sampler(3)), 3) is None
    assert "3 rows" in sampler_refusal(_fusable(Sampler(3)), 4)
    assert "fused_draw_args" in sampler_refusal(Sampler(3), 3)  # a CPU sampler
    refused = [dict(eager=True), dict(logprobs=True), dict(keep_last_token=True),
               dict(settings=SamplerSettings(repetition_penalty=1.1)),
               dict(settings=SamplerSettings(min_p=0.05))]
    for kw in refused:
        s = _fusable(Sampler(2, **kw))
        assert s.fused_draw_args() is None, kw
        assert "fused_draw_args" in sampler_refusal(s, 2), kw
    logprobs = _fusable(Sampler(2))
    logprobs.logprobs_enabled = True  # the flag alone, without its buffer
    assert logprobs.fused_draw_args() is None
    mixed = _fusable(Sampler(2, [SamplerSettings(), SamplerSettings(top_p=0.8)]))
    assert mixed.fused_draw_args() is not None and "top-p" in sampler_refusal(mixed, 2)


def test_refused_sampler_step_runs_the_fast_loop(caplog):
    """FastLoop(depth_kernel=True): a sampler the frame refuses never reaches DepthFrame; the
    loop is built instead, and applies its own rule (it refuses what it cannot draw either)."""
    from configs.codepredictor import CodePredictorConfig
    from models.codepredictor import random_weights
    from models.fast_loop import FastLoop, FastWeights, _depth_frame_or_reason

    tiny = CodePredictorConfig(hidden=64, intermediate=128, layers=2, q_heads=4, kv_heads=2,
                               head_dim=16, talker_hidden=48, vocab=32)
    fw = FastWeights(random_weights(tiny, seed=5, dtype=torch.float32))
    for smp, why in ((Sampler(2, seeds=[1, 2]), "fused_draw_args"),
                     (_fusable(Sampler(2, SamplerSettings(top_p=0.5))), "top-p"),
                     (_fusable(Sampler(2, logprobs=True)), "fused_draw_args")):
        frame, reason = _depth_frame_or_reason(fw, 2, smp, False, None)
        assert frame is None and why in reason
        with caplog.at_level("WARNING"), pytest.raises(ValueError, match="T / top-k only"):
            FastLoop(fw, 2, smp, depth_kernel=True)
        assert why in caplog.text
    # a step the frame could draw gets past the sampler rule: refused here for the weights
    frame, reason = _depth_frame_or_reason(fw, 2, _fusable(Sampler(2)), False, None)
    assert frame is None and "1.7B" in reason


@pytest.mark.parametrize("rows", [1, 13, 64])
def test_sampled_layout_puts_the_parameters_after_the_codes(rows):
    """The sampled arena: a ``draw`` region of [R8][8] words at codes + 16 R8 (where the kernel
    looks), disjoint from the others; the greedy / given layout has none and is unchanged."""
    from kernels.depth.frame import frame_layout
    from kernels.depth.frame.embedding import DRAW_WORDS
    from kernels.depth.frame.projection import rows8

    plain, sampled = frame_layout(CFG, rows), frame_layout(CFG, rows, sample=True)
    r8 = rows8(rows)
    assert "draw" not in plain.at
    assert sampled.at["draw"] == sampled.at["codes"] + 16 * r8
    assert sampled.size["draw"] == r8 * DRAW_WORDS
    spans = sorted((sampled.at[k], sampled.at[k] + sampled.size[k], k) for k in sampled.at)
    for (s0, e0, k0), (s1, _, k1) in zip(spans, spans[1:]):
        assert e0 <= s1, (k0, k1)
    assert sampled.at["draw"] + sampled.size["draw"] <= sampled.outputs_end
    shift = r8 * DRAW_WORDS
    assert all(sampled.at[k] == plain.at[k] + (shift if plain.at[k] > plain.at["codes"] else 0)
               for k in plain.at)


def test_draw_params_pack_each_rows_settings_into_words():
    """DepthFrame._put_draw_params: T's fp32 bits, k clamped to 0..vocab (0: off, as the
    sampler reads it), seed and offset as (lo, hi) 32-bit words, int64 round trip (negative
    seeds, offsets past 2^32)."""
    from kernels.depth.frame import DepthFrame, frame_layout
    from kernels.depth.frame.projection import rows8

    rows = 5
    settings = [SamplerSettings(temperature=t, top_k=k) for t, k in
                ((0.9, 50), (0.0, 0), (1.3, 2**40), (0.05, 1), (1.0, 2047))]
    smp = Sampler(rows, settings, seeds=[-1, 2**62 + 7, 0, 12345, -(2**63)])
    smp.offset += torch.tensor([0, 2**32 + 3, 5, 2**40, 1])
    frame = object.__new__(DepthFrame)
    frame.sampler, frame.rows, frame.r8, frame.cfg = smp, rows, rows8(rows), CFG
    frame.regions = frame_layout(CFG, rows, sample=True)
    frame.arena = torch.full((frame.regions.words,), -7, dtype=torch.int32)
    frame._put_draw_params()
    p = frame.draw_params_view()
    assert torch.equal(p[:rows, 0].view(torch.float32), smp.temperature)
    assert p[:rows, 1].tolist() == [50, 0, CFG.vocab, 1, 2047]
    assert torch.equal(p[:rows, 2:4].contiguous().view(torch.int64).view(-1), smp.seed)
    assert torch.equal(p[:rows, 4:6].contiguous().view(torch.int64).view(-1), smp.offset)
    assert (p[rows:] == -7).all() and (p[:rows, 6:] == -7).all()


def test_sampled_schedule_has_one_embedding_task_a_row():
    """FrameOptions(embed_rows=1): every embedding phase has a task a row (the sampled draw
    takes the whole CTA for a row), the schedule still validates; other values are refused."""
    from schedules import depth_frame as F
    from schedules.plan import FRAME_RING

    for rows in (1, 13, 64):
        s = F.build(CFG, F.FrameOptions(rows=rows, embed_rows=1, **FRAME_RING))
        F.validate(s)
        embeds = [ph for ph in s.phases if ph.type == F.EMBED]
        assert len(embeds) == CFG.positions and all(ph.n_tiles == rows for ph in embeds)
        base = F.build(CFG, F.FrameOptions(rows=rows, **FRAME_RING))
        assert [ph.n_tiles for ph in base.phases if ph.type == F.EMBED] == \
            [-(-rows // 8)] * CFG.positions
    with pytest.raises(F.ScheduleError, match="embed_rows"):
        F.build(CFG, F.FrameOptions(rows=8, embed_rows=4, **FRAME_RING))


# ---- compile (CI) ----------------------------------------------------------------------------
@pytest.mark.compile
@pytest.mark.parametrize("rows", [1, 64])
def test_sampled_frame_compiles_without_spills(rows):
    """The sampled build: the loop's draw inlined in the embedding task (Philox, the fp64 logs,
    one ballot a value slot for the survivors, named barrier 1), no local memory; its only
    calls are the IEEE fp32 division's slow path (s = logits / T, as torch divides; the
    greedy and given builds have none). Prints its SASS count against the greedy build's."""
    from kernels.depth.frame import FrameBuild, FrameKernel, compile_args
    from kernels.depth.frame.projection import TILE_WIDTHS
    from schedules.plan import FRAME_RING, frame_k_stage
    from workbench.compile import compile_report

    r = compile_report(FrameKernel(FrameBuild(512, 2, False, *FRAME_RING.values(), rows=rows,
                                              fused=True, draw="sample")), *compile_args())
    ptx = r.ptx
    wgmmas = len(TILE_WIDTHS) * frame_k_stage(rows) // 16  # one K stage a tile width
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n") == wgmmas
    assert r.frame_bytes == 0 and r.spill_bytes == 0
    assert "mul.hi.u32" in ptx and "fma.rn.f64" in ptx and "lg2.approx.f64" not in ptx
    assert ptx.count("vote.sync.ballot") == CFG.vocab // 128  # 16 values a thread
    assert ptx.count("div.rn.f32") == CFG.vocab // 128
    assert "atom.shared" in ptx
    if r.sass:
        calls = set(re.findall(r"CALL\.\S+\s+`\(([^)]*)\)", r.sass))
        assert all("div_rn" in c for c in calls), calls
        greedy = compile_report(FrameKernel(FrameBuild(512, 2, False, *FRAME_RING.values(),
                                                       rows=rows, fused=True, draw="greedy")),
                                *compile_args())
        print(f"rows {rows}: SASS sampled {r.sass_instructions}, greedy "
              f"{greedy.sass_instructions}; registers {r.registers} / {greedy.registers}")


# ---- on the H200 -----------------------------------------------------------------------------
from tests.test_depth_frame import _inputs, _same, _snapshot, _weights  # noqa: E402


# default, greedy, top-k only (T 1), low temperature, top-k off, a near-greedy top-1
MIXED = [SamplerSettings(), SamplerSettings(temperature=0.0),
         SamplerSettings(temperature=1.0, top_k=5), SamplerSettings(temperature=0.05),
         SamplerSettings(temperature=1.3, top_k=0), SamplerSettings(temperature=0.7, top_k=1)]


def _sampler(rows, seed):
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=g).tolist()
    smp = Sampler(rows, [MIXED[(seed + i) % len(MIXED)] for i in range(rows)], seeds=seeds,
                  device="cuda")
    smp.offset += torch.randint(0, 2**40, (rows,), generator=g).to("cuda")
    return smp



def _reference_codes(out, smp, offset0):
    """Each group's codes as models.sampler draws them from the frame's own logits at the
    offsets the frame used (offset0 + group - 1)."""
    from models.sampler import draw, filtered_scores

    return torch.stack([draw(filtered_scores(out.logits[:, s], smp.temperature, smp.top_k),
                             smp.temperature, smp.seed, offset0 + s)
                        for s in range(CFG.heads_drawn)], dim=1)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_sampled_frame_draws_what_sample_draws(rows):
    """A batch of mixed settings (default, greedy, top-k only, low temperature, top-k off,
    top-1), served row by row: every group's codes are models.sampler's draw on the frame's own
    logits at offset + group - 1, group 15's exactly what Sampler.sample() picks at the last
    offset; the offsets move by 15; the Talker sum and the KV equal a teacher-forced frame
    given the drawn codes (bit for bit: the same tiles on the same inputs)."""
    from kernels.depth.frame import DepthFrame

    _, fw = _weights()
    h, g0 = _inputs(rows, seed=300 + rows)
    smp = _sampler(rows, seed=rows)
    offset0 = smp.offset.clone()
    frame = DepthFrame(fw, rows, sampler=smp)
    frame.poison()
    out = _snapshot(frame(h, g0))
    frame.run.synchronize()
    assert frame.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}
    assert torch.equal(smp.offset, offset0 + CFG.heads_drawn)
    assert ((out.codes >= 0) & (out.codes < CFG.vocab)).all()
    assert torch.equal(out.codes, _reference_codes(out, smp, offset0))
    last = Sampler(rows, [MIXED[(rows + i) % len(MIXED)] for i in range(rows)],
                   seeds=smp.seed.tolist(), device="cuda")
    last.offset.copy_(offset0 + CFG.heads_drawn - 1)
    assert torch.equal(out.codes[:, -1], last.sample(out.logits[:, -1]))
    greedy_rows = (smp.temperature == 0).nonzero().view(-1)
    from models.sampler import argmax_candidates
    for s in range(CFG.heads_drawn):
        assert torch.equal(out.codes[greedy_rows, s],
                           argmax_candidates(out.logits[greedy_rows, s]))
    forced = DepthFrame(fw, rows, teacher_forced=True)
    forced.poison()
    given = _snapshot(forced(h, g0, out.codes))
    assert _same(given, out)


@pytest.mark.gpu
def test_sampled_frame_replays_what_it_ran_and_advances_in_the_graph():
    """A CUDA graph of the sampled frame: a replay from the same offsets gives the eager run's
    bits (outputs poisoned first) and moves the offsets by 15; the next replay draws at the new
    offsets, as a second eager frame does."""
    from kernels.depth.frame import DepthFrame

    rows = 8
    _, fw = _weights()
    h, g0 = _inputs(rows, seed=77)
    smp = _sampler(rows, seed=77)
    offset0 = smp.offset.clone()
    frame = DepthFrame(fw, rows, sampler=smp)
    first = _snapshot(frame(h, g0))
    second = _snapshot(frame(h, g0))
    assert not torch.equal(first.codes, second.codes)  # new offsets, new draws
    smp.offset.copy_(offset0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = frame(h, g0)
    assert torch.equal(smp.offset, offset0)  # (capture runs nothing)
    frame.poison()
    graph.replay()
    torch.cuda.synchronize()
    assert _same(_snapshot(out), first) and torch.equal(smp.offset, offset0 + 15)
    frame.poison()
    graph.replay()
    assert _same(_snapshot(out), second) and torch.equal(smp.offset, offset0 + 30)


@pytest.mark.gpu
def test_fast_loop_depth_kernel_takes_a_fusable_sampler_and_refuses_the_rest():
    """FastLoop(depth_kernel=True, sampler): a fusable sampler runs the frame (its graph
    replays the direct frame's draws at the same offsets, and the offsets advance by 15 a
    frame); logprobs make fused_draw_args() None and a top-p row is refused: the loop runs
    (and applies its own rule)."""
    from kernels.depth.frame import DepthFrame
    from models.fast_loop import FastLoop

    rows = 8
    _, fw = _weights()
    h, g0 = _inputs(rows, seed=88)
    smp = _sampler(rows, seed=88)
    offset0 = smp.offset.clone()
    loop = FastLoop(fw, rows, smp, depth_kernel=True)
    assert loop.depth_frame is not None and loop.depth_kernel_refused is None
    assert torch.equal(smp.offset, offset0)  # the warm-up run's advance undone
    a = _snapshot(loop(h, g0))
    assert torch.equal(smp.offset, offset0 + 15)
    twin = _sampler(rows, seed=88)
    b = _snapshot(DepthFrame(fw, rows, sampler=twin)(h, g0))
    assert _same(a, b)
    lp = Sampler(rows, seeds=list(range(rows)), device="cuda", logprobs=True)
    assert lp.fused_draw_args() is None
    with pytest.raises(ValueError, match="T / top-k only"):
        FastLoop(fw, rows, lp, depth_kernel=True)
    top_p = Sampler(rows, [SamplerSettings(top_p=0.9)] * rows, device="cuda")
    with pytest.raises(ValueError, match="T / top-k only"):
        FastLoop(fw, rows, top_p, depth_kernel=True)


_DETERMINISM = """
import hashlib, sys, torch
sys.path.insert(0, {root!r})
from tests.test_depth_frame_sample import _determinism_hashes
print("HASHES", " ".join(_determinism_hashes()))
"""


def _determinism_hashes(runs: int = 20) -> list:
    """sha256 of the codes of ``runs`` sampled frames, each from the same seeds and offsets
    (4 rows of mixed settings, fresh weights and inputs from fixed seeds)."""
    import hashlib

    from kernels.depth.frame import DepthFrame

    rows = 4
    _, fw = _weights()
    h, g0 = _inputs(rows, seed=4242)
    smp = _sampler(rows, seed=4242)
    offset0 = smp.offset.clone()
    frame = DepthFrame(fw, rows, sampler=smp)
    out = []
    for _ in range(runs):
        smp.offset.copy_(offset0)
        frame.poison()
        codes = frame(h, g0).codes.cpu()
        out.append(hashlib.sha256(codes.numpy().tobytes()).hexdigest()[:16])
    return out


@pytest.mark.gpu
def test_sampled_codes_are_deterministic_within_and_across_processes():
    """20 of 20 seeded runs give the same codes in this process, and two fresh processes give
    those codes too (each compiles the frame once: ~1 min a process)."""
    from pathlib import Path

    here = _determinism_hashes()
    assert len(set(here)) == 1, here
    root = str(Path(__file__).resolve().parents[1])
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _DETERMINISM.format(root=root)],
                              capture_output=True, text=True, timeout=600, cwd=root)
        assert done.returncode == 0, done.stderr[-2000:]
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("HASHES"))
        assert line.split()[1:] == here
