"""GPU timing with the usual discipline (see METHOD.md of the device notes).

* warm-up before timing, so module load and lazy init stay out of the numbers;
* CUDA events around each call, or around a CUDA-graph replay of many calls;
* rotation over enough argument sets that their bytes exceed the L2 several times over, so a
  repeated call does not measure the cache;
* the whole measurement repeated, so the spread between two runs is known;
* every figure reported next to a baseline measured in the same run.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

L2_BYTES_H200 = 60 * 2**20
COPY_CEILING_BPS = 4.24e12  # measured device-to-device copy on the H200 (bytes read + written)


@dataclass
class Timing:
    """Per-call microseconds of one measurement, plus the repeat's median for the spread."""
    samples_us: list[float]
    repeat_median_us: float | None = None
    graph: bool = False
    calls_per_sample: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def min_us(self) -> float:
        return min(self.samples_us)

    @property
    def max_us(self) -> float:
        return max(self.samples_us)

    @property
    def spread(self) -> float | None:
        """Relative difference between this median and the repeat's median."""
        if self.repeat_median_us is None:
            return None
        return abs(self.median_us - self.repeat_median_us) / self.median_us

    def as_dict(self) -> dict:
        return {"median_us": self.median_us, "min_us": self.min_us, "max_us": self.max_us,
                "repeat_median_us": self.repeat_median_us, "spread": self.spread,
                "samples": len(self.samples_us), "graph": self.graph,
                "calls_per_sample": self.calls_per_sample, **self.extra}


def rotation_count(bytes_per_set: int, l2_bytes: int = L2_BYTES_H200, factor: float = 3.0,
                   cap: int = 64) -> int:
    """How many argument sets to rotate through so their bytes exceed ``factor`` x L2."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(cap, math.ceil(factor * l2_bytes / bytes_per_set)))


def _events(torch):
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _measure_once(fn: Callable, arg_sets: Sequence[tuple], warmup_ms: float, rep_ms: float,
                  graph: bool, calls_per_graph: int):
    n = len(arg_sets)
    # warm-up: at least one pass over every argument set, then until warmup_ms has elapsed
    for a in arg_sets:
        fn(*a)
    torch.cuda.synchronize()
    start, end = _events(torch)
    start.record()
    for i in range(max(1, n)):
        fn(*arg_sets[i % n])
    end.record()
    torch.cuda.synchronize()
    est_ms = max(start.elapsed_time(end) / max(1, n), 1e-3)
    for i in range(int(warmup_ms / est_ms)):
        fn(*arg_sets[i % n])
    torch.cuda.synchronize()

    samples = []
    if graph:
        calls = max(calls_per_graph, n)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            fn(*arg_sets[0])  # capture needs a warm call on the capture stream
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=stream):
                for i in range(calls):
                    fn(*arg_sets[i % n])
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        reps = max(3, int(rep_ms / (est_ms * calls)))
        for _ in range(reps):
            s, e = _events(torch)
            s.record()
            g.replay()
            e.record()
            torch.cuda.synchronize()
            samples.append(s.elapsed_time(e) * 1e3 / calls)
        return samples, calls
    reps = max(10, int(rep_ms / est_ms))
    pairs = []
    for i in range(reps):
        s, e = _events(torch)
        s.record()
        fn(*arg_sets[i % n])
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in pairs]
    return samples, 1


def bench(fn: Callable, arg_sets: Sequence[tuple] | None = None, *, warmup_ms: float = 25,
          rep_ms: float = 200, graph: bool = False, calls_per_graph: int = 20,
          repeat: bool = True) -> Timing:
    """Time ``fn(*args)`` rotating over ``arg_sets``; median / min / max per call in µs.

    With ``repeat`` the whole measurement runs twice and the second median is kept for the
    spread, so a difference between variants smaller than that spread reads as noise.
    """
    arg_sets = list(arg_sets) if arg_sets else [()]
    samples, calls = _measure_once(fn, arg_sets, warmup_ms, rep_ms, graph, calls_per_graph)
    rep_med = None
    if repeat:
        again, _ = _measure_once(fn, arg_sets, warmup_ms, rep_ms, graph, calls_per_graph)
        rep_med = statistics.median(again)
    return Timing(samples_us=samples, repeat_median_us=rep_med, graph=graph,
                  calls_per_sample=calls)


def compare(cases: dict[str, Callable], arg_sets: dict[str, Sequence[tuple]] | None = None,
            *, baseline: str, **bench_kwargs) -> dict[str, dict]:
    """Time every case in one run; each row carries ``ratio_vs_baseline`` (>1: faster)."""
    if baseline not in cases:
        raise ValueError(f"baseline '{baseline}' is not one of the cases {list(cases)}")
    arg_sets = arg_sets or {}
    out = {}
    for name, fn in cases.items():
        out[name] = bench(fn, arg_sets.get(name), **bench_kwargs).as_dict()
    base = out[baseline]["median_us"]
    for row in out.values():
        row["ratio_vs_baseline"] = base / row["median_us"]
    return out


def alternating_rounds(cases: dict[str, Callable], rounds: int,
                       **bench_kwargs) -> dict[str, list[float]]:
    """Each case's median µs in each of ``rounds`` rounds (one :func:`bench` each, without its
    repeat), the cases taking turns within a round, so slow drift (clocks, temperature) hits
    them alike: an A/B's arms."""
    bench_kwargs.setdefault("repeat", False)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name].append(bench(fn, **bench_kwargs).median_us)
    return times
