"""experiments/p1_stream_a.py on the CPU: its arithmetic (the best C x G and the ratios, the
headline's worst shapes and gates), its plot, and its refusals before any GPU work."""
from __future__ import annotations

import pytest

from experiments import p1_stream_a as E
from workbench import results as R


def _t(us: float) -> dict:
    return {"median_us": us}


def _row(name, M, p1_c1, p1_c2, unfused, p0, comfy, bits=True):
    t = {"p1_1x1": _t(p1_c1), "unfused": _t(unfused), "p0": _t(p0), "cublas_bf16": _t(p0),
         "comfy_e2e": _t(comfy)}
    if p1_c2 is not None:
        t["p1_2x1"] = _t(p1_c2)
    N, K = E.PROJECTIONS[name]
    return {"projection": name, "M": M, "N": N, "K": K, "pinned_to_p0": name in E.PINNED,
            "bits_equal_p0": {"1x1": bits}, "timings": t, **E.ratios(t)}


def test_ratios_take_the_fastest_sharing_built():
    r = E.ratios({"p1_1x1": _t(300.0), "p1_2x1": _t(250.0), "unfused": _t(200.0),
                  "p0": _t(100.0), "cublas_bf16": _t(120.0), "comfy_e2e": _t(1000.0)})
    assert r["best_cluster_x_group"] == "2x1" and r["p1_us"] == 250.0
    assert r["speedup_vs_unfused"] == pytest.approx(0.8)
    assert r["time_over_p0"] == pytest.approx(2.5) and r["p0_over_p1"] == pytest.approx(0.4)
    assert r["speedup_vs_comfy"] == pytest.approx(4.0) and "p1_over_quack_w4a16" not in r


def test_headline_is_the_worst_streamed_shape_and_gates_follow_the_targets():
    rows = [_row("qkv", 128, 100.0, 90.0, 110.0, 95.0, 400.0),
            _row("out", 128, 50.0, None, 50.0, 30.0, 300.0),
            _row("fc2", 128, 500.0, None, 50.0, 30.0, 300.0),  # pinned: out of the headline
            _row("qkv", 2048, 1000.0, None, 1100.0, 990.0, 1500.0, bits=False)]
    head, gates = E.headline_and_gates(rows, [128, 2048])
    assert head["time_over_p0"]["128"] == pytest.approx(50 / 30)
    assert head["best_cluster_x_group"] == {"128": "1x1", "2048": "1x1"}
    assert head["speedup_vs_unfused"]["128"] == pytest.approx(1.0)
    assert head["speedup_vs_comfy"]["128"] == pytest.approx(400 / 90)  # qkv, on its pair
    assert not gates["speedup_vs_unfused_M128"]["pass"]  # 1.0 < 1.05
    assert gates["speedup_vs_comfy_M128"]["pass"]
    assert gates["p0_over_p1_M2048"]["pass"] == (990 / 1000 >= 1 / 1.03)
    assert not gates["bits_equal_p0"]["pass"] and "qkv M=2048" in gates["bits_equal_p0"]["detail"]


def test_cluster_fits_one_split_and_weight_tiles_the_cluster_divides():
    class C:
        tile_n, splits = 128, 1
    assert E.cluster_fits(C, 21504) and not E.cluster_fits(C, 128 * 3)
    assert E.cluster_fits(C, 21504, 8) and not E.cluster_fits(C, 5376, 4)  # 168 and 42 tiles
    assert E.CLUSTERS == (2, 4, 8)  # bulk DSMEM copies (notes/p1.md, session 26)
    C.splits = 3
    assert not E.cluster_fits(C, 21504)


def test_plot_draws_the_three_panels(tmp_path):
    pytest.importorskip("matplotlib")
    from workbench.plots import OWN_PLOTS
    rows = [_row("qkv", 128, 100.0, 90.0, 110.0, 95.0, 400.0),
            _row("out", 2048, 50.0, None, 50.0, 30.0, 300.0)]
    head, gates = E.headline_and_gates(rows, [128, 2048])
    summary = R.make_summary(E.NAME, parameters={"targets": E.TARGETS}, measurements=rows,
                             headline=head, gates=gates)
    out = OWN_PLOTS[E.NAME](summary, tmp_path / "p.png")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_refuses_bad_arguments_before_any_gpu_work(tmp_path, capsys):
    assert E.main(["--projections", "nope", "--results-dir", str(tmp_path)]) == 2
    assert "choose from" in capsys.readouterr().err
    assert E.main(["--m", "0", "--results-dir", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


def test_g2_is_gated_on_the_oracles_bound_not_on_p0s_bits():
    row = _row("qkv", 128, 100.0, None, 110.0, 95.0, 400.0)
    row["timings"]["p1_1x2"] = _t(70.0)
    row.update(E.ratios(row["timings"]))
    row["bits_equal_p0"]["1x2"] = False  # another wgmma shape: reported, not gated
    row["within_oracle_bound"] = {"1x1": True, "1x2": True}
    head, gates = E.headline_and_gates([row], [128])
    assert head["best_cluster_x_group"]["128"] == "1x2"
    assert gates["bits_equal_p0"]["pass"] and gates["within_oracle_bound"]["pass"]
    row["within_oracle_bound"]["1x2"] = False
    row["rerun_identical"] = {"1x1": True, "1x2": False}
    _, gates = E.headline_and_gates([row], [128])
    assert not gates["within_oracle_bound"]["pass"] and not gates["rerun_identical"]["pass"]
    assert "C x G 1x2" in gates["within_oracle_bound"]["detail"]
    assert E.BITS_CONTRACT == ("1x1", "2x1", "4x1", "8x1")
