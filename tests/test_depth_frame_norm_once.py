"""The depth frame's norm phase (FrameOptions(norm_once=True), issue #37 item 1,
notes/depth-frame.md session 21): the schedule and its validator, the simulator's model, the
arena and phase table, the norm task's unit mapping (CPU); the kernel with the norm body
(compile); the frame's bits with the switch on equal to the switch off (H200)."""
import copy
import re

import pytest
import torch

from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from schedules import depth_frame as D
from schedules import frame_sim as S
from schedules.plan import FRAME_RING


def _schedule(rows, norm_once=True):
    return D.build(CFG, D.FrameOptions(rows=rows, norm_once=norm_once, **FRAME_RING))


# ---- CPU -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sched13():
    return _schedule(13)


def test_norm_phases_precede_every_normalised_projection(sched13):
    """175 norm phases (80 qkv, 80 gate/up, 15 head), one task an 8-row group; each waits on
    the writer of h its projection waited on without the switch, and every projection task on
    its norm phase; the schedule validates."""
    s = D.validate(sched13)
    off = _schedule(13, norm_once=False)
    assert len(s.phases) == len(off.phases) + 175 == 607
    norms = [ph for ph in s.phases if ph.type == D.NORM]
    assert sorted(D.TYPE_NAMES[ph.feeds] for ph in norms).count("qkv") == 80
    assert sum(ph.feeds == D.HEAD for ph in norms) == 15
    assert all(ph.n_tiles == 2 for ph in norms)  # 13 rows: two 8-row groups
    assert len(set(s.counter_names)) == len(s.counter_names)
    waits = {}  # phase name -> counter names its tasks wait on
    for lst in s.ctas:
        for t in lst:
            waits.setdefault(s.phases[t.phase].name, set()).add(
                s.counter_names[t.wait] if t.wait >= 0 else None)
    waits_off = {}
    for lst in off.ctas:
        for t in lst:
            waits_off.setdefault(off.phases[t.phase].name, set()).add(
                off.counter_names[t.wait] if t.wait >= 0 else None)
    for ph in s.phases:
        if ph.type == D.NORM:
            proj = s.phases[ph.index + 1]
            assert proj.type == ph.feeds and (proj.layer, proj.pos) == (ph.layer, ph.pos)
            assert waits[ph.name] == waits_off[proj.name], ph.name
            assert waits[proj.name] == {ph.name}
            assert all(t.n_pages == 0 for lst in s.ctas for t in lst if t.phase == ph.index)
        elif ph.type not in D.NORMALISED:
            assert waits[ph.name] == waits_off[ph.name], ph.name


def test_validate_refuses_a_projection_that_skips_its_norm_phase(sched13):
    s = copy.deepcopy(sched13)
    qkv = next(ph for ph in s.phases if ph.type == D.QKV and ph.layer == 2)
    down = s.phases[qkv.index - 2]
    assert down.type == D.DOWN
    t = next(t for lst in s.ctas for t in lst if t.phase == qkv.index)
    t.wait = down.counters[0]
    t.wait_expect = s.counter_expect[t.wait]
    with pytest.raises(D.ScheduleError, match="does not wait for norm>qkv"):
        D.validate(s)
    s2 = copy.deepcopy(_schedule(1, norm_once=False))
    s2.phases[3].type = D.NORM
    assert any("without norm_once" in v for v in D.violations(s2))


def test_simulator_models_the_norm_phase(sched13):
    """The norm tasks are on the critical chain; removing the in-tile norm from qkv / gate-up /
    head and charging a norm task of 0 µs makes the frame faster than today's calibration, and
    an expensive norm task slower."""
    costs = S.Costs(handoff_us=1.0)
    so = S.SimOptions(producer_warp=True, cluster_wait_at_end=True)
    base = S.simulate(_schedule(13, norm_once=False), costs, so)
    order = D.topological_order(sched13)
    fast = S.simulate(sched13, S.norm_once_costs(costs, 13, "high", norm_task_us=0.0), so,
                      order=order)
    slow = S.simulate(sched13, S.norm_once_costs(costs, 13, "low", norm_task_us=20.0), so,
                      order=order)
    assert "norm" in slow.critical_path and slow.critical_path["norm"] > 175 * 15
    assert fast.makespan_us < base.makespan_us < slow.makespan_us
    c = S.norm_once_costs(costs, 64, "high")
    assert c.fixed_us["qkv"] == pytest.approx(max(0.0, costs.fixed_us["qkv"] - 8.3))
    assert c.fixed_us["norm"] == costs.fixed_us["norm"] == S.NORM_BODY_US
    fitted = S.costs_from_stamps({"critical_chain": {"signal_us": 10.0, "tasks": 10},
                                  "tile_times": {"qkv": {"landing_us": 1, "compute_us": 2,
                                                         "epilogue_us": 0}}})
    assert fitted.fixed_us["norm"] == pytest.approx(S.NORM_BODY_US + 1.0)


@pytest.mark.parametrize("rows", [1, 13, 64])
def test_norm_once_layout_and_phase_rows(rows):
    """Each norm phase reads h_p with its projection's gamma and ssq and writes its own xn
    region (disjoint, among the outputs); the projection reads that xn with no norm of its
    own and writes where it did without the switch; other phases' rows are unchanged."""
    from kernels.depth.frame import frame_layout
    from kernels.depth.frame.table import PHASE_FIELDS, phase_row

    a = frame_layout(CFG, rows, norm_once=True)
    off = frame_layout(CFG, rows)
    spans = sorted((a.at[k], a.at[k] + a.size[k], k) for k in a.at)
    for (s0, e0, k0), (s1, _, k1) in zip(spans, spans[1:]):
        assert e0 <= s1, (k0, k1)
    xn = [k for k in a.at if k[0] == "xn"]
    assert len(xn) == 175 and all(a.at[k] < a.outputs_end for k in xn)
    col = {n: i for i, n in enumerate(PHASE_FIELDS)}
    starts = {v: k for k, v in a.at.items()}
    starts_off = {v: k for k, v in off.at.items()}
    s = _schedule(rows)
    gamma = {D.QKV: "in", D.GATEUP: "post"}
    seen = set()
    for ph in s.phases:
        row = phase_row(ph, a.at, CFG, norm_once=True)
        named = {n: starts.get(row[col[n]]) for n in PHASE_FIELDS if row[col[n]] >= 0
                 and row[col[n]] in starts}
        if ph.type == D.NORM:
            key = ("xn", ph.feeds, ph.layer, ph.pos)
            assert key not in seen
            seen.add(key)
            assert named["a_word"] == ("h", ph.pos) and named["y_word"] == key
            assert named["ssq_in_word"] == ("ssq", ph.pos)
            assert named["gamma_word"] == (gamma[ph.feeds], ph.layer) if ph.feeds in gamma \
                else named["gamma_word"] == "final"
            ref = phase_row(s.phases[ph.index + 1], off.at, CFG)  # the projection, switch off
            assert starts_off[ref[col["gamma_word"]]] == named["gamma_word"]
        elif ph.type in D.NORMALISED:
            assert named["a_word"] == ("xn", ph.type, ph.layer, ph.pos)
            assert row[col["gamma_word"]] == row[col["ssq_in_word"]] == -1
            ref = phase_row(ph, off.at, CFG)
            assert starts[row[col["y_word"]]] == starts_off[ref[col["y_word"]]]
        else:
            ref = phase_row(ph, off.at, CFG)
            assert [_where(a, w) for w in row] == [_where(off, w) for w in ref], ph.name
    assert seen == set(xn)


def _where(regions, w):
    """(region, offset into it) of arena word ``w`` (small values, -1 and fields: themselves)."""
    if w < 0:
        return w
    key = max((k for k in regions.at if regions.at[k] <= w), key=lambda k: regions.at[k],
              default=None)
    if key is None or w >= regions.at[key] + regions.size[key]:
        return w
    return key, w - regions.at[key]


def test_norm_task_units_cover_its_rows_once():
    """kernels.depth.frame.projection's _norm_task: mapping: thread t, unit n -> row t % 8 of the
    group, chunk n·16 + t / 8: the 128 threads' 8 units are the group's 8 rows x 128 chunks,
    each once, and each thread's row is the factor it reads (sR[t % 8])."""
    from kernels.depth.frame.projection import CONSUMERS, NORM_K

    units = NORM_K // 8 * 8 // CONSUMERS
    got = [(n * (CONSUMERS // 8) + t // 8, t % 8) for t in range(CONSUMERS) for n in range(units)]
    assert sorted(got) == [(c, r) for c in range(NORM_K // 8) for r in range(8)]


# ---- compile (CI) ----------------------------------------------------------------------------
@pytest.mark.compile
def test_frame_kernel_compiles_with_the_norm_body():
    """The norm_once build at 64 rows: the projections' wgmmas as before (a K stage of 256 a
    tile width: 48), the norm body's
    16-byte relaxed loads of h and gamma and its 64 relaxed ssq loads a row beside the in-tile
    path's, no spills, no calls."""
    from kernels.depth.frame import FrameBuild, FrameKernel, compile_args
    from workbench.compile import compile_report

    r = compile_report(FrameKernel(FrameBuild(512, 2, False, *FRAME_RING.values(), rows=64,
                                              fused=True, draw="given", norm_once=True)),
                       *compile_args())
    ptx = r.ptx
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n") == 48
    assert ptx.count("ld.relaxed.gpu.global.f32") >= 2 * 64  # _row_factors' and the norm's
    assert "rsqrt.approx" in ptx or "rcp.approx.f32" in ptx
    assert r.frame_bytes == 0 and r.spill_bytes == 0
    assert not re.search(r"^\s*/\*[0-9a-f]+\*/\s+CALL\.", r.sass or "", re.M)


# ---- on the H200 -----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("teacher_forced", [True, False], ids=["given", "greedy"])
@pytest.mark.parametrize("rows", [1, 16, 64])
def test_norm_once_frame_bits_equal_the_in_tile_frame(rows, teacher_forced):
    """The frame with its inputs normalised once by norm phases gives the same bits as the
    in-tile build (codes, Talker sum, KV, logits; greedy draws and given codes), every
    counter at its count; a rerun of the norm_once frame is bit-identical too."""
    from tests.test_depth_frame import _option_outputs, _same

    outs, runs = _option_outputs(rows, teacher_forced, "norm_once", 200 + rows, rerun=True)
    for on, run in runs.items():
        assert sum(ph.type == D.NORM for ph in run.schedule.phases) == (175 if on else 0)
    assert torch.isfinite(outs[True].logits).all()
    assert _same(outs[False], outs[True])
