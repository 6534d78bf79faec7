"""p2-ring-capacity without a GPU: the headline (best capacity and speedup per shape), its gates,
the summary's validity and the latency-vs-capacity plot, on a synthetic measurement table. The
GPU run itself is experiments/p2_ring_capacity.py's."""
import pytest

from experiments import p2_ring_capacity as E
from schedules.p2_ring import CAPACITIES
from workbench import results as R

# complete-path µs and the ring's total per capacity, shaped like notes/p2.md's prediction
TABLE = {"qkv": (17700.0, [28600, 21000, 20900, 19100, 18300]),
         "out": (4700.0, [28400, 7400, 7200, 5500, 5470]),
         "fc1": (11800.0, [28500, 14100, 14000, 11700, 12200])}


def _rows(bad=None):
    rows = []
    for name, (complete, totals) in TABLE.items():
        rows.append({"projection": name, "path": "complete", "complete_us": complete})
        for cap, total in zip(CAPACITIES, totals):
            r = {"projection": name, "path": "ring", "capacity": cap, "total_us": total,
                 "total_eager_us": total + 100, "complete_us": complete,
                 "chunk_us": total * cap / 37810, "bit_identical": (name, cap) != bad,
                 "first_bad_chunk": None if (name, cap) != bad else "chunk 3 rows [384, 512): "
                 "7 elements differ"}
            r.update(E.speedups(r, complete + 50))
            rows.append(r)
    rows.append({"projection": "fc2", "path": "complete", "complete_us": 12000.0,
                 "streamed": False})
    return rows


def test_speedup_is_complete_over_ring():
    s = E.speedups({"complete_us": 100.0, "total_us": 125.0, "total_eager_us": 200.0}, 150.0)
    assert s == {"speedup": 0.8, "speedup_eager": 0.75}


def test_headline_best_capacity_and_speedup_per_shape():
    headline, gates = E.headline_and_gates(_rows())
    assert headline["best_capacity"] == {"qkv": 4096, "out": 4096, "fc1": 2048}
    assert headline["best_speedup"]["qkv"] == pytest.approx(17700 / 18300)
    assert headline["best_speedup"]["fc1"] == pytest.approx(11800 / 11700)
    assert list(headline["speedup_by_capacity"]["out"]) == [str(c) for c in CAPACITIES]
    assert "fc2" not in headline["best_capacity"]  # on P0: no ring rows
    assert gates["ring_bit_identical"]["pass"]
    assert not gates["ring_not_slower_qkv"]["pass"] and not gates["ring_not_slower_out"]["pass"]
    assert gates["ring_not_slower_fc1"]["pass"]
    assert "best capacity 2048" in gates["ring_not_slower_fc1"]["detail"]
    summary = R.make_summary("p2-ring-capacity", parameters={"M": 37810},
                             measurements=_rows(), headline=headline, gates=gates)
    assert not R.validate(summary) and summary["verdict"] == "partial"


def test_a_differing_chunk_fails_the_bits_gate_by_name():
    _, gates = E.headline_and_gates(_rows(bad=("out", 512)))
    g = gates["ring_bit_identical"]
    assert not g["pass"] and g["detail"].startswith("out capacity 512: chunk 3 rows [384, 512)")


def test_no_ring_rows_is_no_pass():
    _, gates = E.headline_and_gates([r for r in _rows() if r["path"] == "complete"])
    assert not gates["ring_bit_identical"]["pass"]


def test_plot_latency_against_capacity(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from workbench import plots

    headline, gates = E.headline_and_gates(_rows())
    summary = R.make_summary("p2-ring-capacity", parameters={"M": 37810},
                             measurements=_rows(), headline=headline, gates=gates)
    series = plots.p2_capacity_series(summary)
    assert list(series["relative"]) == ["fc1", "out", "qkv"]
    assert series["relative"]["qkv"][-1] == (4096, pytest.approx(18300 / 17700))
    assert [c for c, _ in series["chunk_us"]["out"]] == list(CAPACITIES)
    drawn = {}
    save = plots._save

    def keep(fig, out):
        drawn["lines"] = [len(ax.get_lines()) for ax in fig.axes]
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", keep)
    out = plots.summary_png(summary, tmp_path / "p2.png")
    assert out.read_bytes().startswith(b"\x89PNG")
    assert drawn["lines"] == [4, 3]  # three shapes (+ the 1.0 line), three shapes
