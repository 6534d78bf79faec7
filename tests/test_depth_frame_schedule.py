"""Depth-frame schedule: every validate() rule holds for generated schedules, and each rule has a
deliberately broken schedule that validate() rejects. Plus encoding round trip and the simulator's
prediction of seed frames it was not calibrated on."""
import copy

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from configs.codepredictor import CodePredictorConfig
from schedules import depth_frame as D
from schedules import frame_sim as F

SMALL = st.builds(CodePredictorConfig, layers=st.integers(1, 2), positions=st.integers(2, 4),
                  kv_heads=st.sampled_from([2, 4, 8]), q_heads=st.just(16),
                  intermediate=st.sampled_from([1024, 3072]))


@st.composite
def schedules(draw):
    cfg = draw(SMALL)
    rows = draw(st.integers(1, 128))
    opt = D.FrameOptions(rows=rows, grid=draw(st.sampled_from(
        [2, 8, 32, 66, 132])), ring_pages=draw(st.sampled_from([32, 33, 35])),
        per_head_waits=draw(st.booleans()), split_o_down=draw(st.booleans()),
        combine_slots=draw(st.sampled_from([1, 2, 3])), max_tasks_per_cta=100_000,
        norm_once=draw(st.booleans()), embed_rows=draw(st.sampled_from([1, 8])),
        chunk_waits=rows <= 64 and draw(st.booleans()))  # (the frame kernel's rows: 1..64)
    return D.build(cfg, opt)


@settings(max_examples=25, deadline=None)
@given(schedules())
def test_generated_schedules_validate(s):
    assert D.violations(s) == []
    table, counts = D.encode(s)
    back = D.decode(table, counts)
    assert [len(x) for x in back] == [len(x) for x in s.ctas]
    t = s.ctas[0][0]
    assert back[0][0]["type"] == t.type and back[0][0]["signal"] == t.signal
    assert [[(d["wait"], d["wait_expect"], d["wait_chunks"]) for d in x] for x in back] == \
        [[(t.wait, t.wait_expect, t.wait_chunks) for t in x] for x in s.ctas]


def _tasks(s, pred):
    return [(c, i, t) for c, lst in enumerate(s.ctas) for i, t in enumerate(lst) if pred(t)]


@settings(max_examples=15, deadline=None)
@given(schedules(), st.randoms(use_true_random=False))
def test_broken_wait_counts_are_rejected(s, rnd):
    bad = copy.deepcopy(s)
    c, i, t = rnd.choice(_tasks(bad, lambda t: t.wait >= 0))
    t.wait_expect += 1
    assert any("waits for" in v for v in D.violations(bad))
    bad = copy.deepcopy(s)
    c, i, t = rnd.choice(_tasks(bad, lambda t: t.signal >= 0))
    t.signal = -1
    assert any("signals but expects" in v for v in D.violations(bad))


@settings(max_examples=15, deadline=None)
@given(schedules(), st.randoms(use_true_random=False))
def test_weight_copy_over_live_pages_is_rejected(s, rnd):
    bad = copy.deepcopy(s)
    cands = _tasks(bad, lambda t: t.n_pages and t.issue_before > 0)
    assume(cands)  # a schedule with no early-issued copy has nothing to break here
    c, i, t = rnd.choice(cands)
    t.issue_before = 0  # issue the copy before tasks that still read those pages ran
    assert any("overwrites page" in v for v in D.violations(bad))


@settings(max_examples=15, deadline=None)
@given(schedules(), st.randoms(use_true_random=False))
def test_split_halves_off_cluster_are_rejected(s, rnd):
    assume(s.options.grid >= 4 and s.options.split_o_down)  # else no split halves to move
    bad = copy.deepcopy(s)
    c, i, t = rnd.choice(_tasks(bad, lambda t: t.half == 1))
    bad.ctas[c].pop(i)
    other = (c + 2) % bad.options.grid
    bad.ctas[other].append(t)
    assert any("not on ranks 0/1" in v or "different orders" in v for v in D.violations(bad))


@settings(max_examples=15, deadline=None)
@given(schedules(), st.randoms(use_true_random=False))
def test_combine_buffer_overwrite_is_rejected(s, rnd):
    bad = copy.deepcopy(s)
    cands = _tasks(bad, lambda t: t.local_wait == D.LOCAL_SLOT)
    assume(cands)  # no combine-slot wait to drop
    c, i, t = rnd.choice(cands)
    t.local_wait, t.local_dep = D.LOCAL_NONE, None
    assert any("may overwrite slot" in v for v in D.violations(bad))


@settings(max_examples=10, deadline=None)
@given(schedules(), st.randoms(use_true_random=False))
def test_deadlocks_are_rejected(s, rnd):
    bad = copy.deepcopy(s)
    c = rnd.randrange(len(bad.ctas))
    lst = bad.ctas[c]
    later = [j for j, t in enumerate(lst) if t.signal >= 0 and j > 0]
    assume(later)  # a CTA with no later signalling task cannot be made to wait on itself
    j = rnd.choice(later)
    first = lst[0]  # the CTA's first task now waits on a counter its own later task signals
    first.wait, first.wait_expect = lst[j].signal, bad.counter_expect[lst[j].signal]
    assert any("deadlock" in v for v in D.violations(bad))


def test_grids_that_cannot_run_are_refused():
    with pytest.raises(D.ScheduleError, match="co-residency"):
        D.build(options=D.FrameOptions(grid=134))
    with pytest.raises(D.ScheduleError, match="even"):
        D.build(options=D.FrameOptions(grid=63))
    s = D.build(options=D.FrameOptions(grid=32))  # fits in hardware, not in the task table
    assert any("grid too small" in v for v in D.violations(s))
    with pytest.raises(D.ScheduleError):
        D.encode(s)
    with pytest.raises(D.ScheduleError, match="227 KB"):
        D.build(options=D.FrameOptions(ring_pages=40))


def test_seed_design_has_432_phases_and_validates():
    s = D.validate(D.build())
    assert len(s.phases) == 432
    attn = [t for lst in s.ctas for t in lst if t.type == D.ATTN]
    assert all(s.counter_expect[t.wait] == 16 for t in attn)  # its kv head's 16 qkv tiles
    assert max(len(x) for x in s.ctas) <= s.options.max_tasks_per_cta


HELD_OUT_US = {1: 2127.0, 16: 2192.0}  # the seed's frames at 1 and 16 rows (depth-frame-pr.md)


@pytest.mark.slow
def test_simulator_predicts_held_out_frames_within_10pct():
    """calibrate() fits only the split of the seed's 64-row trace (475 µs of handoffs, 1660 µs
    of phase-slowest tasks); the 1- and 16-row frame times are held out, and the prediction must
    land within 10 % of each. (The model has no row term: this checks that the fitted per-phase
    costs carry over to other row counts, as the seed says they do.)"""
    costs = F.calibrate(D.build(), iterations=12)  # the scale to 0.001: far inside 10 %
    for rows, measured in HELD_OUT_US.items():
        s = D.build(options=D.FrameOptions(rows=rows))
        r = F.simulate(s, costs)
        assert abs(r.makespan_us - measured) / measured <= 0.10, (rows, r.makespan_us)
    s = D.build()
    fast = F.simulate(s, costs, F.SimOptions(producer_warp=True))
    assert fast.makespan_us < F.simulate(s, costs).makespan_us


def test_costs_from_stamps_and_the_split_handoff_at_the_end():
    """The frame kernel's calibration: per-type bodies from a traced run's medians plus its
    signal time per task; with cluster_wait_at_end a split tile's halves overlap, so rank 0
    waits for the partial only at its end, and the frame gets shorter than with the seed's
    wait at the start."""
    from schedules import frame_sim as S

    types = ("proj", "qkv", "attn", "o", "gateup", "down", "head", "embed")
    m = {"critical_chain": {"signal_us": 43.2, "tasks": 432},
         "tile_times": {k: {"landing_us": 1.0, "compute_us": 2.0, "epilogue_us": 0.5}
                        for k in types}}
    c = S.costs_from_stamps(m)
    # (a traced run without norm tasks: the norm's predicted body plus the chain's signal)
    assert c.fixed_us == {**{k: 3.6 for k in types}, "norm": F.NORM_BODY_US + 0.1}
    assert c.dsmem_us == 0.0
    # a chunked type's stamped landing holds its first chunk's wait: another type's stands in
    m["tile_times"]["o"] = {"landing_us": 6.0, "compute_us": 2.0, "epilogue_us": 0.5}
    assert S.costs_from_stamps(m).fixed_us["o"] == pytest.approx(8.6)
    assert S.costs_from_stamps(m, landing_as={"o": "down"}).fixed_us["o"] == pytest.approx(3.6)
    s = D.validate(D.build(options=D.FrameOptions(rows=16)))
    start = S.simulate(s, c, S.SimOptions(producer_warp=True))
    end = S.simulate(s, c, S.SimOptions(producer_warp=True, cluster_wait_at_end=True))
    assert end.makespan_us < start.makespan_us
    assert end.makespan_us > 432 * c.handoff_us  # every phase still hands off once


def test_more_lanes_never_lengthen_the_simulated_frame():
    """SimOptions(lanes=n): task i waits for task i - n of its CTA instead of i - 1 (#37 item 3's
    alternating warpgroups), a subset of the one-lane order's edges, so its topological order
    still serves and the frame is never longer."""
    from schedules import frame_sim as S

    s = D.validate(D.build(options=D.FrameOptions(rows=16)))
    order = D.topological_order(s)
    spans = [S.simulate(s, S.SEED_COSTS, S.SimOptions(producer_warp=True, lanes=n),
                        order=order).makespan_us for n in (1, 2, 4)]
    assert spans[0] >= spans[1] >= spans[2] > 0


def test_attention_at_position_1_waits_for_position_0s_kv():
    """Position 1 starts beside position 0 (its embedding has no head to wait for), so each of
    its attention tasks also waits for position 0's attention of the same layer, which
    appends the K and V it reads; without that second wait validate() refuses the schedule."""
    s = D.validate(D.build(options=D.FrameOptions(rows=16)))
    attn0 = {ph.layer: ph.counters[0] for ph in s.phases if ph.type == D.ATTN and ph.pos == 0}
    pos1 = [t for lst in s.ctas for t in lst
            if t.type == D.ATTN and s.phases[t.phase].pos == 1]
    assert pos1 and all(t.wait2 == attn0[s.phases[t.phase].layer] for t in pos1)
    assert all(t.wait2 == -1 for lst in s.ctas for t in lst
               if not (t.type == D.ATTN and s.phases[t.phase].pos == 1))
    pos1[0].wait2 = -1
    with pytest.raises(D.ScheduleError, match="position 0's attention"):
        D.validate(s)


def test_frame_schedule_calibrates_on_the_published_frame_stamps():
    """experiments/frame_schedule.py reads the published frame-protocol summary's stamps (when
    it has them) and predicts the held-out row counts; a summary it cannot read is skipped,
    not a crash."""
    import json
    from pathlib import Path

    from experiments.frame_schedule import _kernel_calibration

    path = Path(__file__).resolve().parents[1] / "results" / "frame-protocol.json"
    has = any("tile_times" in m for m in json.loads(path.read_text())["measurements"])
    k = _kernel_calibration()
    assert (k is not None) == has
    if k is not None:
        assert k["held_out"] and all(abs(x["error"]) < 0.5 for x in k["held_out"].values())


def test_whole_frame_calibration_predicts_the_held_out_row_counts(capsys):
    """The simulator fitted to the whole frame kernel's stamps at 1 and 64 rows (the published
    depth-frame summary) predicts the 8, 16 and 32-row frames within 10 %, saying each grid
    point it tries as it goes; --quick's coarse-to-fine search finds the same handoff from
    fewer grid points."""
    from experiments.frame_schedule import (HANDOFF_GRID, WHOLE_FIT_ROWS,
                                            _whole_frame_calibration)

    built: dict = {}
    k = _whole_frame_calibration(built)
    assert k is not None, "results/depth-frame.json has the traced runs"
    assert sorted(map(int, k["fitted"])) == list(WHOLE_FIT_ROWS)
    assert sorted(map(int, k["held_out"])) == [8, 16, 32]
    assert all(abs(x["error"]) <= 0.10 for x in k["held_out"].values()), k["held_out"]
    full = capsys.readouterr().err
    assert full.count("whole-frame fit: handoff") == len(HANDOFF_GRID)  # progress per point
    quick = _whole_frame_calibration(built, coarse_to_fine=True)
    tried = capsys.readouterr().err.count("whole-frame fit: handoff")
    assert quick["handoff_us"] == k["handoff_us"] and tried < len(HANDOFF_GRID)


def test_quick_frame_schedule_names_what_it_cuts():
    """--quick's subset, as its summary and verdict say it: the gated variants, fewer
    bisection steps, the handoff searched coarse to fine (which finds the exhaustive minimum
    of a unimodal error and tries fewer points)."""
    from experiments import frame_schedule as E

    assert set(E.QUICK_VARIANTS) < set(E.VARIANTS)
    changes = E._quick_changes(E.QUICK_ITERATIONS, E.QUICK_VARIANTS)
    assert f"{len(E.QUICK_VARIANTS)} of {len(E.VARIANTS)} variants" in changes[0]
    assert f"{E.QUICK_ITERATIONS} bisection steps, not {E.FULL_ITERATIONS}" in changes[1]
    grid = E.HANDOFF_GRID
    for best in range(len(grid)):
        tried = []

        def error(v, best=best, tried=tried):
            tried.append(v)
            return abs(v - grid[best])
        assert E._coarse_to_fine(grid, error) == grid[best]
        assert len(set(tried)) < len(grid)


# ---- chunk waits (FrameOptions.chunk_waits, issue #37 item 5) -------------------------------
CHUNK_K = {1: 512, 13: 512, 64: 256}  # schedules.plan.frame_k_stage


def _chunked(rows, **kw):
    from schedules.plan import FRAME_RING

    return D.build(options=D.FrameOptions(rows=rows, chunk_waits=True, **FRAME_RING, **kw))


@pytest.mark.parametrize("rows", [1, 13, 64])
def test_chunk_waits_count_the_producers_of_each_k_stage(rows):
    """Attention (positions >= 1) and gate/up signal one counter a K stage of their consumer
    (attention task of q head hq: chunk hq·128 / ks; gate/up tile t: 32t / ks), each expecting
    its producers (their sum: the phase's tasks); o and down wait per stage from their K
    half's first chunk on (rank 1: K half / ks further), with one expect for all; position 0's
    attention, qkv, gate/up, head and proj keep whole-phase waits. The same tasks, signals
    aside, as the unchunked build, and the encoding carries wait_chunks."""
    from schedules.plan import FRAME_RING, frame_k_stage

    ks = frame_k_stage(rows)
    assert ks == CHUNK_K[rows]
    s = D.validate(_chunked(rows))
    base = D.validate(D.build(options=D.FrameOptions(rows=rows, **FRAME_RING)))
    rg = -(-rows // 8)
    for ph in s.phases:
        exp = [s.counter_expect[c] for c in ph.counters]
        if ph.type == D.ATTN and ph.pos >= 1:
            assert ph.chunk_k == ks and exp == [ks // 128 * rg] * (2048 // ks)
            assert all(s.counter_names[c] == f"{ph.name}.c{j}" for j, c in enumerate(ph.counters))
        elif ph.type == D.GATEUP:
            assert ph.chunk_k == ks and exp == [ks // 32] * (3072 // ks)
        else:
            assert ph.chunk_k == 0
        if ph.chunk_k:
            assert sum(exp) == ph.n_tiles
            assert ph.counters == list(range(ph.counters[0], ph.counters[0] + len(exp)))
    n = 0
    for lst, blst in zip(s.ctas, base.ctas):
        assert [(t.phase, t.tile, t.half) for t in lst] == [(t.phase, t.tile, t.half)
                                                             for t in blst]
        for t in lst:
            ph = s.phases[t.phase]
            chunked = t.type in D.CHUNKED and not (t.type == D.O and ph.pos == 0)
            assert (t.wait_chunks > 0) == chunked, (ph.name, t.half)
            if not chunked:
                continue
            n += 1
            prod = s.phases[t.phase - 1]
            k_half = {D.O: 1024, D.DOWN: 1536}[t.type]
            assert t.wait_chunks == k_half // ks
            assert t.wait == prod.counters[0] + t.half * k_half // ks
            assert all(s.counter_expect[t.wait + j] == t.wait_expect
                       for j in range(t.wait_chunks))
    assert n == 2 * 64 * (5 * 16 + 5 * 15)  # down everywhere, o from position 1 on; two halves
    back = D.decode(*D.encode(s))
    assert D.FIELDS[-1] == "wait_chunks" and D.FIELDS.index("wait2_expect") == 15
    assert [[d["wait_chunks"] for d in x] for x in back] == \
        [[t.wait_chunks for t in x] for x in s.ctas]


def test_chunk_waits_refuse_rows_the_kernel_has_no_stage_for():
    with pytest.raises(D.ScheduleError, match="chunk_waits"):
        _chunked(65)
    assert not any(t.wait_chunks for lst in D.build().ctas for t in lst)  # off by default


def _first(s, pred):
    return next((c, i, t) for c, lst in enumerate(s.ctas) for i, t in enumerate(lst)
                if pred(t, s.phases[t.phase]))


@pytest.mark.parametrize("rows", [1, 64])
def test_broken_chunk_waits_are_rejected(rows):
    """Each chunk rule has a broken schedule validate() refuses: a stage waiting on another
    range's chunk, too few chunk waits, a producer signalling another chunk, a chunked
    normalised projection (its norm needs every partial), a whole-phase wait on one chunk."""
    s = _chunked(rows)
    assert D.violations(s) == []

    def broken(edit, needle):
        bad = copy.deepcopy(s)
        edit(bad)
        v = D.violations(bad)
        assert any(needle in x for x in v), v[:3]

    def shift(bad):  # rank 0 of an o tile waits from rank 1's first chunk on
        _, _, t = _first(bad, lambda t, ph: t.type == D.O and t.half == 0 and t.wait_chunks)
        t.wait += t.wait_chunks
    broken(shift, "not on the chunks of its K range")

    def fewer(bad):
        _, _, t = _first(bad, lambda t, ph: t.type == D.DOWN and t.half == 1)
        t.wait_chunks -= 1
    broken(fewer, "not on the chunks of its K range")

    def resignal(bad):  # a gate/up tile counts in its neighbour chunk
        _, _, t = _first(bad, lambda t, ph: t.type == D.GATEUP and t.tile == 0)
        t.signal += 1
    broken(resignal, "writes features 0..31 but signals")

    def qkv(bad):  # a qkv tile waiting per chunk on the down counter (not a chunk counter)
        _, _, t = _first(bad, lambda t, ph: t.type == D.QKV and t.wait >= 0)
        t.wait_chunks = 4
    broken(qkv, "not a chunk counter")

    def whole(bad):  # an o tile of position 1 waits once, on its first chunk only
        _, _, t = _first(bad, lambda t, ph: t.type == D.O and ph.pos == 1)
        t.wait_chunks = 0
    broken(whole, "not on the chunks of its K range")

    def wait2(bad):  # position 1's attention on one chunk of position 0's attention
        _, _, t = _first(bad, lambda t, ph: t.wait2 >= 0)
        ph = next(p for p in bad.phases if p.type == D.ATTN and p.pos == 2)
        t.wait2 = ph.counters[0]
    broken(wait2, "second wait is one chunk")


def test_chunk_waits_are_edges_of_the_deadlock_check():
    """A chunked task depends on every chunk counter it waits on: the dependency graph has an
    edge from each, and a task whose later chunk is signalled only after it (on its own CTA)
    deadlocks."""
    s = _chunked(1)
    c, i, t = _first(s, lambda t, ph: t.wait_chunks > 1)
    edges = {a for a, b in D.dependency_edges(s) if b == (c, i) and a[0] == "ctr"}
    assert edges == {("ctr", t.wait + j) for j in range(t.wait_chunks)}
    bad = copy.deepcopy(s)
    c, i, t = _first(bad, lambda t, ph: t.wait_chunks > 1 and t.half == 0)
    later = next(j for j in range(i + 1, len(bad.ctas[c])) if bad.ctas[c][j].signal >= 0)
    sig = bad.ctas[c][later].signal
    # make the task's last chunk counter a counter its own later task signals
    bad.counter_expect[t.wait + t.wait_chunks - 1] = bad.counter_expect[sig]
    old = t.wait + t.wait_chunks - 1
    for lst in bad.ctas:
        for u in lst:
            if u.signal == old:
                u.signal = -2  # (dropped from the graph)
    bad.ctas[c][later].signal = old
    assert D.topological_order(bad) is None


def test_simulator_honours_real_chunk_counters():
    """The simulator starts a chunked task's stage s when chunk s completes: with the chunk
    counters' last producers late, the chunked schedule is never slower than the unchunked one,
    and with uniform per-type costs (every producer of a phase ends together) the two agree
    within a few µs: per-chunk waits on o and down alone gain little in the model."""
    from schedules.plan import FRAME_RING

    so = F.SimOptions(producer_warp=True, cluster_wait_at_end=True)
    for rows in (1, 64):
        base = F.simulate(D.build(options=D.FrameOptions(rows=rows, **FRAME_RING)), opt=so)
        ch = F.simulate(_chunked(rows), opt=so)
        assert ch.makespan_us <= base.makespan_us + 1e-6
        assert base.makespan_us - ch.makespan_us < 20
