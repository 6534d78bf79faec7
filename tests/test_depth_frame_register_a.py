"""The depth frame's register-A projection tiles (issue #37 item 3; kernels/depth/frame/
projection_ra.py): the weight packing against wgmma's register-A fragment, the epilogue's
lane-to-element maps, and the build's code. The frame against the fast loop with these tiles
runs on the GPU in tests/test_depth_frame.py (``register_a``)."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


def _fragment(packed, rows: int, k: int):
    """Back from pack_tile_register_a's bytes: {(row, k): value} as wgmma reads it, thread
    4g + q of warp w holding a0..a3 = (g, k0), (g + 8, k0), (g, k0 + 8), (g + 8, k0 + 8) of its
    warp's 16 rows at k0 = 16·step + 2q (+ e for the pair's second element)."""
    units = packed.view(torch.bfloat16).reshape(k // 16, rows // 16, 32, 8)
    got = {}
    for step, w, lane in itertools.product(range(k // 16), range(rows // 16), range(32)):
        g, q = divmod(lane, 4)
        for a, (dr, dk) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
            for e in range(2):
                got[(16 * w + g + dr, 16 * step + 2 * q + dk + e)] = units[step, w, lane,
                                                                           2 * a + e]
    return got


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_packed_weights_are_wgmmas_register_fragments(swiglu):
    """Every weight of a 64 x K' tile reaches exactly the register wgmma reads it from; for
    gate/up, warp w's rows g and g + 8 are act feature 8w + g's gate and up rows."""
    from kernels.depth.frame.weights import pack_tile_register_a

    k = 64
    w = torch.randn(64, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    got = _fragment(pack_tile_register_a(w, swiglu), 64, k)
    assert len(got) == 64 * k
    for (r, kk), v in got.items():
        if swiglu:  # fragment row 16w + g (+ 8): gate (up) row of act feature 8w + g
            wg, rest = divmod(r, 16)
            src = (8 * wg + rest) if rest < 8 else (32 + 8 * wg + rest - 8)
        else:
            src = r
        assert v == w[src, kk]


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 64))
def test_epilogue_pairs_cover_every_output_once(rows):
    """After the lane swap every (feature pair, row) of a tile is stored by exactly one lane, and
    each row's 16-feature sums of squares come from the four same-parity lanes the shuffles
    join (8 and 16 apart) and are written by one of lanes g = 0, 1."""
    from kernels.depth.frame.projection_ra import (ra_pair_at, ra_ssq_writer,
                                                   ra_swiglu_pair_at)
    from kernels.depth.frame.projection import rows8

    r8 = rows8(rows)
    plain, swiglu, ssq = {}, {}, {}
    for w, lane, j in itertools.product(range(4), range(32), range(r8 // 8)):
        g, q = divmod(lane, 4)
        feats = []
        for h in range(2):
            f, r = ra_pair_at(w, g, q, j, h)
            plain[(f, r)] = plain.get((f, r), 0) + 1
            feats += [f, f + 1]
        f, r = ra_swiglu_pair_at(w, g, q, j)
        swiglu[(f, r)] = swiglu.get((f, r), 0) + 1
        # the lanes a bfly 8 and 16 join: same q and g's parity
        group = (w, j, q, g % 2)
        ssq.setdefault(group, {"rows": set(), "feats": [], "writers": 0})
        ssq[group]["rows"].add(r)
        ssq[group]["feats"] += feats
        ssq[group]["writers"] += ra_ssq_writer(g)
    assert plain == {(f, r): 1 for f in range(0, 64, 2) for r in range(r8)}
    assert swiglu == {(f, r): 1 for f in range(0, 32, 2) for r in range(r8)}
    for (w, _, _, _), got in ssq.items():
        assert len(got["rows"]) == 1 and got["writers"] == 1
        assert sorted(got["feats"]) == list(range(16 * w, 16 * w + 16))


def test_register_a_task_k_and_weight_bytes():
    """Every register-A task is a K half of a 64-row tile: qkv / gate-up / head 512, o and
    proj 1024, down 1536; whole register stages, an even number of them."""
    from kernels.depth.frame.projection_ra import RA_STAGE, RA_TASK_K, ra_weight_bytes
    from schedules import depth_frame as F

    assert RA_TASK_K == {F.QKV: 512, F.GATEUP: 512, F.HEAD: 512, F.O: 1024, F.PROJ: 1024,
                         F.DOWN: 1536}
    for t, k in RA_TASK_K.items():
        assert k % (2 * RA_STAGE) == 0
        assert ra_weight_bytes(t) == 64 * k * 2


def test_register_a_builds_refuse_a_ring_or_no_rows():
    from kernels.depth.frame import FrameBuild, FrameKernel
    from schedules.plan import FRAME_RING

    with pytest.raises(ValueError, match="register-A"):
        FrameKernel(FrameBuild(512, 2, False, *FRAME_RING.values(), rows=8, fused=True,
                               register_a=True))
    with pytest.raises(ValueError, match="register-A"):
        FrameKernel(FrameBuild(512, 2, False, 0, 0, rows=0, register_a=True))


@pytest.mark.compile
@pytest.mark.parametrize("rows,draw", [(1, "greedy"), (13, "given"), (64, "given")])
def test_register_a_frame_compiles_to_register_wgmma(rows, draw):
    """The register-A frame: wgmma m64nR8k16 with A in registers (R8 the rows rounded up to
    8), one copy of a pair of register stages (32 wgmmas), the weights by non-coherent 16-byte
    loads, the pair's fp32 fragment by st.shared::cluster, no page ring and no loader, no
    spills, under 8k SASS instructions."""
    from kernels.depth.frame import FrameBuild, FrameKernel, compile_args
    from kernels.depth.frame.projection import rows8
    from tests.test_depth_frame import assert_small_frame_code
    from workbench.compile import compile_report

    kernel = FrameKernel(FrameBuild(512, 2, False, 0, 0, rows=rows, fused=True, draw=draw,
                                    register_a=True))
    assert kernel.threads == 128 and kernel.k_stage == 256
    r = compile_report(kernel, *compile_args())
    ptx = r.ptx
    n = rows8(rows)
    assert ptx.count(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16") == 32
    assert ptx.count("wgmma.mma_async") == 32
    assert "ld.global.nc.L1::no_allocate.v4.b32" in ptx
    assert "st.shared::cluster.v2.f32" in ptx
    assert_small_frame_code(r)


@pytest.mark.compile
@pytest.mark.parametrize("rows", [1, 64])
def test_two_lane_frame_compiles_with_a_barrier_a_lane(rows):
    """Two consumer warpgroups (256 threads, #37 item 3's lanes): each meets at its own named
    barrier (the id a register: 1 + lane), the same 32 register-A wgmmas, four combine slots'
    worth of shared memory, no spills, under 8k SASS instructions."""
    import re

    from kernels.depth.frame import FrameBuild, FrameKernel, compile_args
    from tests.test_depth_frame import assert_small_frame_code
    from workbench.compile import compile_report

    kernel = FrameKernel(FrameBuild(512, 4, False, 0, 0, rows=rows, fused=True, draw="given",
                                    register_a=True, lanes=2))
    assert kernel.threads == 256 and kernel.walkers == 256
    r = compile_report(kernel, *compile_args())
    assert r.ptx.count("wgmma.mma_async") == 32
    assert re.search(r"bar\.sync\s+%r\d+, 128;", r.ptx)
    assert not re.search(r"bar\.sync\s+1, 128;", r.ptx)
    assert_small_frame_code(r)


def test_two_lanes_need_register_a_and_no_sampled_draw():
    from kernels.depth.frame import FrameBuild, FrameKernel

    for kw in ({"register_a": False}, {"register_a": True, "draw": "sample"}):
        build = dict(rows=8, fused=True, register_a=True, lanes=2) | kw
        with pytest.raises(ValueError, match="lanes"):
            FrameKernel(FrameBuild(512, 4, False, 0, 0, **build))


@pytest.mark.parametrize("rows", [1, 13, 64])
def test_two_lane_schedule_of_the_frame_validates(rows):
    """The schedule DepthFrame(register_a=True, lanes=2) runs: one combine slot a pair of lanes,
    with the plan's norm-once and chunk-wait rules; the table carries each slot's use."""
    from schedules import depth_frame as F
    from schedules.plan import FRAME_RING, frame_chunk_waits, frame_norm_once

    s = F.validate(F.build(options=F.FrameOptions(
        rows=rows, register_a=True, lanes=2, combine_slots=1, norm_once=frame_norm_once(rows),
        chunk_waits=frame_chunk_waits(rows), **FRAME_RING)))
    assert s.slot_count == 4
    table, counts = F.encode(s)
    rows_ = F.decode(table, counts)
    assert all(r["slot_use"] == t.slot_use for lst, rl in zip(s.ctas, rows_)
               for t, r in zip(lst, rl))
