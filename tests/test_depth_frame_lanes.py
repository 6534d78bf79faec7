"""Depth-frame schedules for issue #37 item 3 (FrameOptions(lanes=2, register_a=True)): two
consumer lanes a CTA (task i after task i - 2 of its CTA) with combine slots planned per pair of
lanes, and the register-A geometry (every projection 64 weight rows a tile, K split across the
cluster pair, no page ring). The validator models the lanes; with one lane and the ring the
schedules are the ones the kernel runs today. CPU only: no kernel uses these schedules yet."""
import copy
import dataclasses
import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from configs.codepredictor import CodePredictorConfig
from schedules import depth_frame as D
from schedules import frame_sim as F
from schedules.plan import FRAME_RING

VARIANTS = {"plain": {}, "chunk_waits": {"chunk_waits": True}, "norm_once": {"norm_once": True}}
ITEM3 = [(1, False), (1, True), (2, True)]  # (lanes, register_a); two lanes need register_a


def _build(rows, lanes=1, register_a=False, cfg=CFG, **kw):
    return D.build(cfg, D.FrameOptions(rows=rows, lanes=lanes, register_a=register_a,
                                       **FRAME_RING, **kw))


def _signals(s):
    got = [0] * len(s.counter_expect)
    for lst in s.ctas:
        for t in lst:
            if t.signal >= 0:
                got[t.signal] += 1
    return got


def _split(s, c):
    """CTA c's split tasks: (index, task)."""
    return [(i, t) for i, t in enumerate(s.ctas[c]) if t.half >= 0]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lanes,register_a", ITEM3)
@pytest.mark.parametrize("rows", [1, 8, 13, 64])
def test_item3_schedules_validate(rows, lanes, register_a, variant):
    """Every combination validates, every counter gets exactly the signals it expects, a CTA
    allocates combine_slots · lanes² slots, and each slot's uses on a CTA come from one lane,
    numbered 0, 1, ... in order."""
    s = _build(rows, lanes, register_a, **VARIANTS[variant])
    assert D.violations(s) == []
    assert _signals(s) == s.counter_expect
    assert s.slot_count == D.combine_slot_count(s.options) == 2 * lanes * lanes
    for c in range(len(s.ctas)):
        uses = {}
        for i, t in _split(s, c):
            uses.setdefault(t.slot, []).append((i % lanes, t.slot_use))
        for slot, seq in uses.items():
            assert 0 <= slot < s.slot_count
            assert len({lane for lane, _ in seq}) == 1, (c, slot)
            assert [u for _, u in seq] == list(range(len(seq)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_one_lane_tables_are_todays(rows, variant):
    """lanes=1 and register_a=False spelled out build the default's tasks and table, and each
    split task's slot and use are today's: k % S and k // S for the CTA's k-th split task."""
    s = _build(rows, **VARIANTS[variant])
    base = D.build(CFG, D.FrameOptions(rows=rows, **FRAME_RING, **VARIANTS[variant]))
    for a, b in zip(D.encode(s), D.encode(base)):
        assert a.tobytes() == b.tobytes()
    assert (s.counter_expect, s.counter_names) == (base.counter_expect, base.counter_names)
    S = s.options.combine_slots
    for c in range(len(s.ctas)):
        assert [(t.slot, t.slot_use) for _, t in _split(s, c)] == \
            [(k % S, k // S) for k in range(len(_split(s, c)))]


# encode() of schedules built at 78a8089, before lanes and register_a existed (sha256 of the
# table, the counts and the counters' expects and names; first 16 hex digits): the lanes=1
# tables the kernel reads must not change
MAIN_DIGESTS = {
    "default": ({}, "12588dd2202ebab9"),
    "ring1": ({"rows": 1, **FRAME_RING}, "0a6b8cbe722cc370"),
    "ring13": ({"rows": 13, **FRAME_RING}, "cfff8b0afad4dbd2"),
    "ring64": ({"rows": 64, **FRAME_RING}, "c0e33bb32db01e94"),
    "chunk1": ({"rows": 1, "chunk_waits": True, **FRAME_RING}, "b1771ad7b72d3b77"),
    "chunk64": ({"rows": 64, "chunk_waits": True, **FRAME_RING}, "e3de29d5d3449ab6"),
    "norm13": ({"rows": 13, "norm_once": True, **FRAME_RING}, "95570321a101ed9d"),
    "slots3": ({"rows": 16, "combine_slots": 3}, "bb505a505da0462f"),
    "nosplit": ({"rows": 16, "split_o_down": False, "per_head_waits": False},
                "cec8ba5644a411f8"),
    "embed1": ({"rows": 5, "embed_rows": 1, "combine_slots": 1}, "e8c1608640160757"),
}


@pytest.mark.parametrize("case", MAIN_DIGESTS)
def test_one_lane_tables_match_main(case):
    """78a8089's table in every field it had (the two-lane kernel added ``slot_use`` as the
    last column), and one lane's slot_use the walk's own count, k // S."""
    kw, digest = MAIN_DIGESTS[case]
    s = D.build(CFG, D.FrameOptions(**kw))
    table, counts = D.encode(s)
    assert D.FIELDS[-1] == "slot_use"
    h = hashlib.sha256(np.ascontiguousarray(table[..., :-1]).tobytes())
    h.update(counts.tobytes())
    h.update(json.dumps([s.counter_expect, s.counter_names]).encode())
    assert h.hexdigest()[:16] == digest
    S = s.options.combine_slots
    for c, lst in enumerate(s.ctas):
        split = [i for i, t in enumerate(lst) if t.half >= 0]
        assert [int(table[c, i, -1]) for i in split] == [k // S for k in range(len(split))]


def test_register_a_tiles():
    """Every projection in tiles of 64 weight rows (gate/up: 32 gate + 32 up, so 32 act
    features a tile), all split across the pair with rank 0 signalling; weights in registers:
    each half keeps its weight bytes and gets no ring pages. Per-head qkv counters count their
    kv head's 8 tiles."""
    s = D.validate(_build(13, register_a=True))
    want = {D.PROJ: 16, D.QKV: 64, D.O: 16, D.GATEUP: 96, D.DOWN: 16, D.HEAD: 32}
    for ph in s.phases:
        if ph.type in want:
            assert (ph.n_tiles, ph.split) == (want[ph.type], True), ph.name
        else:
            assert not ph.split
        if ph.type == D.QKV:
            assert [s.counter_expect[c] for c in ph.counters] == [8] * CFG.kv_heads
    for lst in s.ctas:
        for t in lst:
            assert (t.n_pages, t.page_first, t.issue_before) == (0, -1, -1)
            ph = s.phases[t.phase]
            if t.type in want:
                assert t.half in (0, 1) and t.weight_bytes == 64 * (ph.k // 2) * 2
                assert (t.signal >= 0) == (t.half == 0)
    # the ring's shared-memory check does not apply: the weights are not in shared memory
    D.validate(D.build(CFG, D.FrameOptions(rows=8, register_a=True, ring_pages=64)))


def test_register_a_chunk_counters_count_rank_0():
    """With chunk waits, gate/up (now split) signals its chunk counters from rank 0 only, each
    counter expecting the tiles that write its K range, and each down half waits on the chunks
    of its own K half."""
    s = D.validate(_build(64, register_a=True, chunk_waits=True))
    ks = 256  # schedules.plan.frame_k_stage(64)
    for ph in s.phases:
        if ph.type == D.GATEUP:
            assert ph.chunk_k == ks
            assert [s.counter_expect[c] for c in ph.counters] == [ks // 32] * (3072 // ks)
    down = [t for lst in s.ctas for t in lst if t.type == D.DOWN]
    assert down and all(t.wait_chunks == 1536 // ks for t in down)


def test_refusals():
    with pytest.raises(D.ScheduleError, match="lanes 3"):
        _build(8, lanes=3, register_a=True)
    with pytest.raises(D.ScheduleError, match="lanes=2 needs register_a"):
        _build(8, lanes=2)
    with pytest.raises(D.ScheduleError, match="split_o_down=False"):
        _build(8, register_a=True, split_o_down=False)
    with pytest.raises(D.ScheduleError, match="head's 2080 weight rows do not divide into tiles "
                                              "of 64"):
        _build(8, register_a=True, cfg=CodePredictorConfig(vocab=2080))
    with pytest.raises(D.ScheduleError, match="gateup's 2080 weight rows"):
        _build(8, register_a=True, cfg=CodePredictorConfig(intermediate=1040))
    with pytest.raises(D.ScheduleError, match="a kv head's qkv's 288 weight rows"):
        _build(8, register_a=True, cfg=CodePredictorConfig(q_heads=2, kv_heads=2, head_dim=96))


# ---- the two lanes' rules, broken by hand ---------------------------------------------------
@pytest.fixture(scope="module")
def two_lanes():
    """(embed_rows=1, the sampled draw: one embedding task a row shifts the lanes of one rank's
    split tasks against the other's, so every pair of lanes occurs; with 8-row embedding tasks
    the 1.7B schedules pair lane 0 with lane 0 and 1 with 1)"""
    return D.validate(_build(13, lanes=2, register_a=True, embed_rows=1))


def test_two_lane_slots_follow_both_lanes(two_lanes):
    """A split tile's slot is pair · S + m % S, pair = (rank-0 lane, rank-1 lane), m counting
    that pair's tiles so far; its use is m // S. Rank 1's later uses wait for rank 0's task
    that consumed the slot's previous use; every pair of lanes occurs."""
    s, S = two_lanes, two_lanes.options.combine_slots
    pairs = set()
    for c in range(len(s.ctas) // 2):
        r0, r1 = _split(s, 2 * c), _split(s, 2 * c + 1)
        seen = {}
        consumed = {}
        for (i0, t0), (i1, t1) in zip(r0, r1):
            pair = (i0 % 2) * 2 + i1 % 2
            pairs.add(pair)
            m = seen.get(pair, 0)
            seen[pair] = m + 1
            assert (t0.slot, t0.slot_use) == (t1.slot, t1.slot_use) == (pair * S + m % S, m // S)
            assert t0.local_dep == (2 * c + 1, i1)
            want = (D.LOCAL_SLOT, (2 * c, consumed[t1.slot])) if t1.slot in consumed else \
                (D.LOCAL_NONE, None)
            assert (t1.local_wait, t1.local_dep) == want
            consumed[t1.slot] = i0
    assert pairs == {0, 1, 2, 3}


def _pair_on_other_lanes(s):
    """A cluster and two of its split tiles k < k2 whose rank-0 tasks are on different lanes."""
    for c in range(len(s.ctas) // 2):
        r0 = _split(s, 2 * c)
        for k2 in range(1, len(r0)):
            if r0[k2][0] % 2 != r0[0][0] % 2:
                return c, 0, k2
    raise AssertionError("no split tiles on both lanes")


def test_a_slot_used_from_both_lanes_is_rejected(two_lanes):
    bad = copy.deepcopy(two_lanes)
    c, k, k2 = _pair_on_other_lanes(bad)
    for rank in (0, 1):  # both ranks agree, so only the lane rule can object
        _split(bad, 2 * c + rank)[k2][1].slot = _split(bad, 2 * c + rank)[k][1].slot
    v = D.violations(bad)
    assert any(f"CTA {2 * c}: slot" in x and "is used from lanes 0 and 1 (an mbarrier parity "
               "wait could pass two phases early)" in x for x in v), v[:5]


def test_broken_slot_protocols_are_rejected(two_lanes):
    def broken(edit, needle):
        bad = copy.deepcopy(two_lanes)
        edit(bad)
        v = D.violations(bad)
        assert any(needle in x for x in v), v[:5]

    def later_uses(bad):
        return [t for c in range(1, len(bad.ctas), 2) for _, t in _split(bad, c)
                if t.slot_use >= 2]

    def drop(bad):  # rank 1 writes its partial without waiting for the slot to be free
        t = later_uses(bad)[0]
        t.local_wait, t.local_dep = D.LOCAL_NONE, None
    broken(drop, "may overwrite slot")

    def too_early(bad):  # ... or waits for the consumer of the use before the previous one
        t = later_uses(bad)[0]
        c, _ = t.local_dep
        prev = [i for i, u in _split(bad, c) if u.slot == t.slot and
                u.slot_use == t.slot_use - 2]
        t.local_dep = (c, prev[0])
    broken(too_early, "may overwrite slot")

    def renumber(bad):  # a use numbered out of order: its parity would be wrong
        t = later_uses(bad)[0]
        t.slot_use += 1
    broken(renumber, "not 0, 1, ... in order")

    def one_rank(bad):  # rank 1 puts a partial in a slot rank 0 does not read
        t = later_uses(bad)[0]
        t.slot = (t.slot + 1) % bad.slot_count
    broken(one_rank, "ranks put partial")

    def no_partial_wait(bad):
        _, t = _split(bad, 0)[0]
        t.local_wait, t.local_dep = D.LOCAL_NONE, None
    broken(no_partial_wait, "adds partial 0 without waiting for it")

    def out_of_range(bad):
        for c in (0, 1):
            _split(bad, c)[0][1].slot = bad.slot_count
    broken(out_of_range, f"is not one of its {two_lanes.slot_count} combine slots")


def test_a_ring_shared_by_two_lanes_is_rejected():
    """A one-lane schedule (page ring, slots k % S) run on two lanes: its pages' and its
    slots' parity waits would come from both lanes."""
    s = _build(13)
    s.options = dataclasses.replace(s.options, lanes=2)
    v = D.violations(s)
    assert any(": page" in x and "is used from lanes 0 and 1" in x for x in v), v[:5]
    assert any(": slot" in x and "is used from lanes 0 and 1" in x for x in v), v[:5]


def test_waiting_on_a_later_task_of_its_own_lane_deadlocks(two_lanes):
    bad = copy.deepcopy(two_lanes)
    lst = bad.ctas[0]
    j = next(j for j in range(2, len(lst), 2) if lst[j].signal >= 0)  # lane 0, after task 0
    lst[0].wait, lst[0].wait_expect = lst[j].signal, bad.counter_expect[lst[j].signal]
    assert any("deadlock" in v for v in D.violations(bad))


def test_program_order_edges_follow_the_lanes():
    """Task i follows task i - lanes of its CTA: with two lanes a task may wait on the next
    task of its CTA (the other lane), which deadlocks one lane. Two attention tasks of one
    phase on one CTA (grid 2: tiles t and t + 2): the first waits for a counter only the
    second signals."""
    cfg = CodePredictorConfig(layers=1, positions=2)
    s = D.build(cfg, D.FrameOptions(rows=8, grid=2, lanes=2, register_a=True,
                                    max_tasks_per_cta=100_000))
    assert D.violations(s) == []
    lst = s.ctas[0]
    i = next(i for i in range(len(lst) - 1) if lst[i].type == lst[i + 1].type == D.ATTN and
             lst[i].phase == lst[i + 1].phase)
    before = {a for a, b in D.dependency_edges(s) if b == (0, i + 1)}
    assert (0, i - 1) in before and (0, i) not in before
    new = len(s.counter_expect)
    s.counter_expect.append(1)
    s.counter_names.append("test")
    lst[i + 1].signal = new
    lst[i].wait, lst[i].wait_expect = new, 1
    assert D.topological_order(s) is not None
    assert D.topological_order(s, lanes=1) is None


# ---- the simulator -----------------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 64])
def test_two_lanes_never_simulate_slower(rows):
    """SimOptions() takes the schedule's lanes: a two-lane schedule simulated as built is never
    slower than the same schedule on one lane (its program order is a subset), and a one-lane
    schedule simulates as before (SimOptions(lanes=1))."""
    s = D.validate(_build(rows, lanes=2, register_a=True))
    two = F.simulate(s)
    one = F.simulate(s, opt=F.SimOptions(lanes=1))
    assert 0 < two.makespan_us <= one.makespan_us
    with pytest.raises(ValueError, match="lane's previous task"):  # a two-lane order, one lane
        F.simulate(s, opt=F.SimOptions(lanes=1), order=D.topological_order(s))
    s1 = _build(rows, register_a=True)
    assert F.simulate(s1).as_dict() == F.simulate(s1, opt=F.SimOptions(lanes=1)).as_dict()


# ---- random configs ------------------------------------------------------------------------
SMALL = st.builds(CodePredictorConfig, layers=st.integers(1, 2), positions=st.integers(2, 4),
                  kv_heads=st.sampled_from([2, 4, 8]), q_heads=st.just(16),
                  intermediate=st.sampled_from([1024, 3072]))


@st.composite
def item3_schedules(draw):
    lanes = draw(st.sampled_from([1, 2]))
    opt = D.FrameOptions(
        rows=draw(st.integers(1, 64)), grid=draw(st.sampled_from([2, 8, 32, 66, 132])),
        lanes=lanes, register_a=lanes == 2 or draw(st.booleans()),
        per_head_waits=draw(st.booleans()), combine_slots=draw(st.sampled_from([1, 2, 3])),
        max_tasks_per_cta=100_000, norm_once=draw(st.booleans()),
        embed_rows=draw(st.sampled_from([1, 8])), chunk_waits=draw(st.booleans()))
    return D.build(draw(SMALL), opt)


@settings(max_examples=20, deadline=None)
@given(item3_schedules())
def test_random_item3_schedules_validate(s):
    assert D.violations(s) == []
    assert _signals(s) == s.counter_expect
    if s.options.lanes == 2:
        assert F.simulate(s).makespan_us <= \
            F.simulate(s, opt=F.SimOptions(lanes=1)).makespan_us + 1e-9
