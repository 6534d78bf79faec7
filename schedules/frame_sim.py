"""Discrete-event model of a depth-frame schedule: critical path, its split, ring stalls.

Every CTA runs its task list in order. A task starts when
  * the CTA finished its previous task,
  * its global counter is complete (the last signaller's end) plus the handoff latency,
  * its cluster-local dependency finished (plus a DSMEM hop), and
  * its weight tile has landed: issued at the start of task ``issue_before`` (or, with a producer
    warp, as soon as the ring pages are free) and streamed at the per-SM share of bandwidth.
It then runs for a fixed per-type latency plus its MMA/epilogue work. A schedule built with
``FrameOptions(chunk_waits=True)`` has real chunk counters: a chunked task's stage s may start
once chunk s's counter is complete, so the task starts at the latest of (counter s done +
handoff - s · body / stages) over its stages. For schedules without them, ``per_chunk_waits``
approximates the same: a projection starts each of ``chunks`` K chunks as soon as the
producer tiles of that chunk are done.

Costs are per-task constants, calibrated (:func:`calibrate`) from the split of the seed's traced
frame at 64 rows: 470-480 µs of handoffs and 1620-1700 µs of phase-slowest tasks over 432
phases (2218 µs in all). The seed's 1- and 16-row frames (2127, 2192 µs) are not used to fit, so
they test the prediction. :func:`costs_from_stamps` calibrates from the frame kernel's own
timestamps instead (experiments/frame_protocol.py's traced runs), to be simulated with
``SimOptions(cluster_wait_at_end=True)``, the kernel's split-tile handoff.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from schedules.depth_frame import (ATTN, EMBED, LOCAL_NONE, TYPE_NAMES, Schedule,
                                   topological_order)


# a norm task's body (``FrameOptions.norm_once``: one 8-row group's RMSNorm, written once), a
# prediction until the H200 measures it (notes/depth-frame.md, session 21): one round of L2
# loads (the rows' 64 ssq partials, the x words, gamma), the rsqrt, one round of stores
NORM_BODY_US = 3.0


@dataclass(frozen=True)
class Costs:
    # counter signal -> spinning waiter sees it -> task begins (1.15 µs: the frame kernel's
    # protocol alone, 20e5028, measured 1.03 µs per critical task and the sim fits 1.27)
    handoff_us: float = 1.1
    dsmem_us: float = 0.3  # rank 1's partial visible to rank 0
    bytes_per_us_per_sm: float = 4.24e12 / 132 / 1e6  # the copy ceiling shared by 132 SMs
    tma_latency_us: float = 0.6
    fixed_us: dict = field(default_factory=lambda: {
        "proj": 1.75, "qkv": 1.75, "o": 1.75, "gateup": 1.75, "down": 1.75, "head": 1.75,
        "attn": 3.9, "embed": 3.9, "norm": NORM_BODY_US})


SEED_COSTS = Costs()


@dataclass
class SimOptions:
    producer_warp: bool = False  # copies issued as soon as ring pages free, not at task starts
    per_chunk_waits: bool = False
    chunks: int = 4
    # the frame kernel's split tiles (kernels/depth/frame/projection.py): both halves run their
    # mainloops at once and only the handoff waits (rank 0 for the partial, rank 1 for its
    # slot), so a cluster wait bounds the task's end, not its start (the seed's model: start)
    cluster_wait_at_end: bool = False
    # consumer lanes a CTA: task i waits for task i - lanes on its CTA, not i - 1 (#37 item 3's
    # two consumer warpgroups taking alternate tasks), each lane's body as long as alone (no
    # sharing of the SM's tensor cores or copy engines: an upper bound on the gain)
    lanes: int = 1


@dataclass
class SimResult:
    makespan_us: float
    critical_path: dict  # category -> µs along the critical path
    ring_stall_us: float  # summed over tasks: time spent waiting for weights after other waits

    def as_dict(self) -> dict:
        return {"makespan_us": self.makespan_us, "critical_path_us": self.critical_path,
                "ring_stall_us": self.ring_stall_us}


def simulate(s: Schedule, costs: Costs = SEED_COSTS, opt: SimOptions | None = None, *,
             order: list | None = None) -> SimResult:
    """``order``: ``topological_order(s)`` when the caller has it (it is most of a simulation's
    time, and the same for every costs and options: repeated simulations pass it once made)."""
    opt = opt or SimOptions()
    order = topological_order(s) if order is None else order
    if order is None:
        raise ValueError("schedule has a dependency cycle; validate it first")
    ends: dict = {}
    starts: dict = {}
    binding: dict = {}  # node -> (category, predecessor node or None, waited µs)
    counter_done = [0.0] * len(s.counter_expect)
    counter_last = [None] * len(s.counter_expect)
    signal_ends: dict = {}  # counter -> list of (end, tile) for per-chunk waits
    ring_stall = 0.0
    bw = costs.bytes_per_us_per_sm
    for node in order:
        c, i = node
        t = s.ctas[c][i]
        name = TYPE_NAMES[t.type]
        body = costs.fixed_us[name]
        lane_prev = (c, i - opt.lanes) if i >= opt.lanes else None
        cands = [(ends.get(lane_prev, 0.0), "program", lane_prev)]
        if t.wait >= 0 and t.wait_chunks > 1:  # the schedule's own chunk counters
            n = t.wait_chunks
            ready, w = max((counter_done[t.wait + j] + costs.handoff_us - j * body / n,
                            t.wait + j) for j in range(n))
            cands.append((ready, "handoff", counter_last[w]))
        elif t.wait >= 0:
            ready = counter_done[t.wait] + costs.handoff_us
            if opt.per_chunk_waits and t.type not in (ATTN, EMBED) and signal_ends.get(t.wait):
                # chunk j of the K loop needs the producers of chunk j; the task's last chunk
                # can start only after the slowest chunk arrives: shift by the work remaining
                ev = sorted(signal_ends[t.wait])
                n = len(ev)
                per = body / opt.chunks
                ready = max(ev[min(n - 1, (j + 1) * n // opt.chunks - 1)][0] + costs.handoff_us
                            - j * per for j in range(opt.chunks))
            cands.append((ready, "handoff", counter_last[t.wait]))
        if t.wait2 >= 0:
            cands.append((counter_done[t.wait2] + costs.handoff_us, "handoff",
                          counter_last[t.wait2]))
        local_end = None
        if t.local_wait != LOCAL_NONE and t.local_dep is not None:
            if opt.cluster_wait_at_end:
                local_end = ends[t.local_dep] + costs.dsmem_us
            else:
                cands.append((ends[t.local_dep] + costs.dsmem_us, "dsmem", t.local_dep))
        start_wo_weights, cat, pred = max(cands, key=lambda x: x[0])
        if t.n_pages:
            if opt.producer_warp:
                issue = ends.get((c, t.issue_before - 1), 0.0) if t.issue_before > 0 else 0.0
            else:
                issue = starts.get((c, t.issue_before), start_wo_weights) \
                    if t.issue_before < i else start_wo_weights
            landed = issue + costs.tma_latency_us + t.weight_bytes / bw
            if landed > start_wo_weights:
                ring_stall += landed - start_wo_weights
                start, cat = landed, ("weight+" + cat)
            else:
                start = start_wo_weights
        else:
            start = start_wo_weights
        starts[node] = start
        ends[node] = start + body
        binding[node] = (cat, pred, start)
        if local_end is not None and local_end > ends[node]:  # the pair's handoff binds
            starts[node], ends[node] = local_end - body, local_end
            binding[node] = ("dsmem", t.local_dep, local_end - body)
        if t.signal >= 0:
            if ends[node] >= counter_done[t.signal]:
                counter_done[t.signal] = ends[node]
                counter_last[t.signal] = node
            signal_ends.setdefault(t.signal, []).append((ends[node], t.tile))
    last = max(ends, key=ends.get)
    cp = _critical_path(s, last, starts, ends, binding, costs)
    return SimResult(ends[last], cp, ring_stall)


def _critical_path(s, node, starts, ends, binding, costs) -> dict:
    """Walk back along binding constraints; gaps split into handoff / dsmem / weight time."""
    split: dict = {}

    def add(k, v):
        if v > 0:
            split[k] = split.get(k, 0.0) + v

    while node is not None:
        c, i = node
        t = s.ctas[c][i]
        add(TYPE_NAMES[t.type], ends[node] - starts[node])
        cat, pred, start = binding[node]
        gap = start - (ends.get(pred, 0.0) if pred is not None else 0.0)
        base = cat.replace("weight+", "")
        fixed = {"handoff": costs.handoff_us, "dsmem": costs.dsmem_us}.get(base, 0.0)
        add(base if base != "program" else "weight", min(gap, fixed) if fixed else 0.0)
        add("weight", gap - min(gap, fixed) if cat.startswith("weight") else 0.0)
        node = pred
    return {k: round(v, 1) for k, v in sorted(split.items(), key=lambda kv: -kv[1])}


def task_time(cp: dict) -> float:
    """Critical-path time inside tasks (bodies + weight landing), the seed's 'slowest tasks'."""
    return sum(v for k, v in cp.items() if k not in ("handoff", "dsmem"))


def calibrate(s: Schedule, *, handoff_total_us: float = 475.0, task_total_us: float = 1660.0,
              base: Costs = SEED_COSTS, iterations: int = 30, on_step=None,
              order: list | None = None) -> Costs:
    """Costs reproducing a measured split: handoff per phase from the handoff total, and the
    fixed per-task latencies scaled so the critical path's task time matches ``task_total_us``
    (weights stream at the measured copy ceiling's per-SM share). The scale is bisected on
    [0, 4] for ``iterations`` steps (one simulation each): 12 pin it to 0.001.
    ``on_step(step, iterations, lo, hi)`` sees the bracket after each step (progress);
    ``order``: ``topological_order(s)`` where the caller has it (as :func:`simulate`)."""
    handoff = handoff_total_us / len(s.phases)
    order = topological_order(s) if order is None else order
    if order is None:
        raise ValueError("schedule has a dependency cycle; validate it first")
    lo, hi = 0.0, 4.0
    for step in range(iterations):
        mid = (lo + hi) / 2
        c = dataclasses.replace(base, handoff_us=handoff,
                                fixed_us={k: v * mid for k, v in base.fixed_us.items()})
        if task_time(simulate(s, c, order=order).critical_path) > task_total_us:
            hi = mid
        else:
            lo = mid
        if on_step is not None:
            on_step(step + 1, iterations, lo, hi)
    return dataclasses.replace(base, handoff_us=handoff,
                               fixed_us={k: round(v * lo, 4) for k, v in base.fixed_us.items()})


def costs_between(lo: tuple, hi: tuple, rows: int) -> Costs:
    """Costs at ``rows`` from two calibrated row counts ``lo`` = (rows, Costs) and ``hi``: the
    per-type body costs linear in rows between them (the tile bodies' work grows with the
    step's rows: the activation copies, the stage normalisation, the epilogue stores), the rest
    ``lo``'s."""
    (r0, c0), (r1, c1) = lo, hi
    t = (rows - r0) / (r1 - r0)
    fixed = {k: c0.fixed_us[k] + t * (c1.fixed_us[k] - c0.fixed_us[k]) for k in c0.fixed_us}
    return dataclasses.replace(c0, fixed_us=fixed)


def costs_from_stamps(measurement: dict, base: Costs = SEED_COSTS,
                      landing_as: dict | None = None) -> Costs:
    """Costs from one row count of the frame kernel's traced run (a measurement of
    experiments/frame_protocol.py: ``tile_times``, the per-type medians of stage-0 landing,
    compute and epilogue; ``critical_chain``, whose signal time, the output stores included,
    is added to every body: per task that counted it (``signal_tasks``) where the chain says,
    else spread over all its tasks, as the 657793b summary's chain has it). The counter
    handoff keeps ``base``'s figure: the chain's handoff total also holds the acquire of waits
    that did not bind. DSMEM hops are inside the epilogue medians. ``landing_as``: {type:
    other type} whose landing median stands for the type's (a task that waits per chunk is
    stamped "waited" before its chunk waits, so its landing holds the wait for its first
    chunk, which the simulator models itself through the chunk counters)."""
    chain = measurement["critical_chain"]
    signal = chain["signal_us"] / chain.get("signal_tasks", chain["tasks"])
    tiles = measurement["tile_times"]
    landing = {k: tiles[(landing_as or {}).get(k, k)]["landing_us"] for k in tiles}
    fixed = {k: landing[k] + v["compute_us"] + v["epilogue_us"] + signal
             for k, v in tiles.items()}
    fixed.setdefault("norm", base.fixed_us["norm"] + signal)  # no norm tasks measured yet
    return dataclasses.replace(base, fixed_us=fixed, dsmem_us=0.0)


# The in-tile normalisation's cost a task (µs; landing + compute), measured as the whole frame
# (69d87e0, fused) minus the projection study (657793b, unfused) per type, at 1 and 64 rows:
# "high" takes all of the difference (the issue's attribution: +7.8 / +8.2 / +3.1 µs compute
# at 64 rows), "low" first removes what the unnormalised o and down also gained in the whole
# frame (their mean, 1.3 µs at 1 row and 4.2 at 64: the larger code, not the norm).
NORM_SHARE_US = {
    "high": {1: {"qkv": 3.1, "gateup": 3.6, "head": 0.1},
             64: {"qkv": 8.3, "gateup": 8.8, "head": 3.8}},
    "low": {1: {"qkv": 1.8, "gateup": 2.3, "head": 0.0},
            64: {"qkv": 4.1, "gateup": 4.6, "head": 0.0}},
}


def norm_once_costs(costs: Costs, rows: int, share: str = "high",
                    norm_task_us: float | None = None) -> Costs:
    """``costs`` (a calibration of the in-tile build) for a ``FrameOptions(norm_once=True)``
    schedule: the qkv / gate-up / head tasks lose their normalisation (NORM_SHARE_US[share],
    linear in rows between 1 and 64) and a norm task costs ``norm_task_us`` (default: the
    calibration's "norm", NORM_BODY_US plus the chain's signal)."""
    lo, hi = NORM_SHARE_US[share][1], NORM_SHARE_US[share][64]
    t = (rows - 1) / 63
    fixed = dict(costs.fixed_us)
    for k in lo:
        fixed[k] = max(0.0, fixed[k] - (lo[k] + t * (hi[k] - lo[k])))
    if norm_task_us is not None:
        fixed["norm"] = norm_task_us
    return dataclasses.replace(costs, fixed_us=fixed)
