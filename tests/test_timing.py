"""workbench.timing's helpers that need no GPU."""
from __future__ import annotations

from types import SimpleNamespace

from workbench import timing


def test_alternating_rounds_takes_turns_and_keeps_each_rounds_median(monkeypatch):
    """Within a round every case runs once, in the given order, one bench without its repeat;
    each case gets its own medians, round by round."""
    calls = []

    def fake_bench(fn, **kwargs):
        calls.append((fn(), kwargs["repeat"], kwargs["rep_ms"]))
        return SimpleNamespace(median_us=float(len(calls)))

    monkeypatch.setattr(timing, "bench", fake_bench)
    got = timing.alternating_rounds({"a": lambda: "a", "b": lambda: "b"}, 3, rep_ms=7)
    assert [c[0] for c in calls] == ["a", "b"] * 3
    assert all(not repeat and rep == 7 for _, repeat, rep in calls)
    assert got == {"a": [1.0, 3.0, 5.0], "b": [2.0, 4.0, 6.0]}
