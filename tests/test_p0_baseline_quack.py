"""p0-baseline's quack W4A16 column without a GPU (and without quack): the ratio convention, the
headline and its gates, the not-run path, the target, the weight conversion into quack's
format and the three-panel plot. The GPU run itself is experiments/p0_baseline.py's."""
import sys

import pytest
import torch

from experiments import p0_baseline as B
from numerics import nvfp4
from numerics.formats import e2m1_decode
from workbench import results as R

MS = (128, 2048, 37810)


def _timings(p0=10.0, quack=20.0, cublas=8.0, e2e=14.0, e2e_eager=16.0, comfy=None):
    t = {"p0": p0, "cublas_bf16": cublas, "ours_e2e": e2e, "ours_e2e_eager": e2e_eager}
    if quack is not None:
        t["quack_w4a16"] = quack
    if comfy is not None:
        t["comfy_e2e"], t["comfy_e2e_eager"] = comfy, comfy * 1.5
    return {k: {"median_us": v} for k, v in t.items()}


def _row(projection, M, quack_ratio=None, rel_err=1e-3, not_run=None):
    r = {"projection": projection, "M": M, "N": 5376, "K": 5376,
         "p0_within_fp32_bound_on_32_rows": True, "p0_over_cublas_bf16": 0.7}
    if quack_ratio is not None:
        r["p0_over_quack_w4a16"] = quack_ratio
        r["quack_w4a16_max_rel_err"] = rel_err
    if not_run:
        r["quack_w4a16_not_run"] = not_run
    return r


def test_ratios_are_the_other_time_over_ours():
    """Same convention as p0_over_cublas_bf16: X's time / P0's, so >= 1 means P0 is at least as
    fast; no quack timing, no quack ratio."""
    r = B.speed_ratios(_timings(p0=10.0, quack=25.0, cublas=8.0, e2e=20.0, comfy=40.0))
    assert r["p0_over_quack_w4a16"] == pytest.approx(2.5)
    assert r["p0_over_cublas_bf16"] == pytest.approx(0.8)
    assert r["ours_e2e_over_quack_w4a16"] == pytest.approx(25.0 / 20.0)
    assert r["e2e_speedup_vs_comfy_graph"] == pytest.approx(2.0)
    r = B.speed_ratios(_timings(quack=None))
    assert "p0_over_quack_w4a16" not in r and "ours_e2e_over_quack_w4a16" not in r


def test_target_and_headline_key():
    assert B.TARGETS["p0_over_quack_w4a16"] == {128: 1.0, 2048: 1.0, 37810: 1.0}
    for key in ("e2e_speedup_vs_comfy", "e2e_speedup_vs_comfy_graph"):  # issue #34's figures
        assert B.TARGETS[key] == {128: 3.0, 2048: 1.3, 37810: 1.05}
    assert set(B.TARGETS) == set(B.HEADLINE_KEYS)
    for key in ("p0_over_cublas_bf16", "e2e_speedup_vs_comfy", "e2e_speedup_vs_comfy_graph"):
        assert key in B.HEADLINE_KEYS


def test_headline_is_the_worst_shape_per_m_with_gates():
    rows = [_row("qkv", 128, 0.40), _row("out", 128, 0.30), _row("qkv", 2048, 1.20),
            _row("out", 2048, 1.05, rel_err=4e-3)]
    headline, gates = B.headline_and_gates(rows, [128, 2048])
    assert headline["p0_over_quack_w4a16"] == {"128": 0.30, "2048": 1.05}
    assert headline["p0_over_cublas_bf16"] == {"128": 0.7, "2048": 0.7}
    assert gates["p0_over_quack_w4a16_M128"]["pass"] is False
    assert gates["p0_over_quack_w4a16_M2048"]["pass"] is True
    assert gates["quack_w4a16_same_weights"]["pass"] is True
    assert "4.00e-03" in gates["quack_w4a16_same_weights"]["detail"]
    # other weights than P0's would show as an O(1) error: the gate fails
    rows[0]["quack_w4a16_max_rel_err"] = 0.5
    assert B.headline_and_gates(rows, [128, 2048])[1]["quack_w4a16_same_weights"]["pass"] is False


def test_without_quack_the_column_is_not_run_and_the_verdict_incomplete(monkeypatch):
    monkeypatch.setitem(sys.modules, "quack", None)  # import quack -> ImportError, here or not
    qk, version, why = B._quack()
    assert qk is None and version is None
    assert why.startswith("quack-kernels not importable: ")
    rows = [_row(p, M) for M in MS for p in ("qkv", "out")]
    headline, gates = B.headline_and_gates(rows, list(MS))
    assert headline["p0_over_quack_w4a16"] == {}
    assert not any(k.startswith(("p0_over_quack", "quack_")) for k in gates)
    not_run = B.not_run_parts(rows, None, why)
    assert not_run == [f"quack_w4a16: {why}"]
    passing = {k: R.gate(True, "ok") for k in gates}
    s = R.make_summary("p0-baseline", parameters={}, measurements=rows, headline=headline,
                       gates=passing, not_run=not_run)
    assert s["verdict"] == "incomplete" and s["notes"]["not_run"] == not_run


def test_a_case_quack_could_not_run_is_named():
    rows = [_row("qkv", 128, 0.5), _row("out", 128, not_run="AssertionError: K mismatch")]
    assert B.not_run_parts(rows, "comfy_kitchen not importable: x", None) == [
        "comfy_e2e: comfy_kitchen not importable: x",
        "quack_w4a16 out M=128: AssertionError: K mismatch"]
    headline, gates = B.headline_and_gates(rows, [128])
    assert headline["p0_over_quack_w4a16"] == {"128": 0.5}
    assert "1 of 2 cases" in gates["quack_w4a16_same_weights"]["detail"]


@pytest.mark.parametrize("N,K", [(256, 128), (200, 96)])  # 200 x 96: padded buffers, cropped
def test_weight_conversion_keeps_every_value(N, K):
    """quack_nvfp4_weight reorders our weight (hi-first nibbles, swizzled scales) into quack's
    nvfp4 input format (lo-first, row-major (N, K/16) e4m3); decoded that way it gives exactly
    our operand values e2m1 * s (quack's own prepare then repacks it on the GPU host)."""
    w = (torch.randn(N, K, generator=torch.Generator().manual_seed(N + K)) * 0.02).to(
        torch.bfloat16)
    g = nvfp4.global_scale(w)
    bq, bs = nvfp4.quantize(w, g, pad_16x=True)
    q, sf = B.quack_nvfp4_weight(bq, bs, N, K)
    assert q.dtype == torch.uint8 and q.shape == (N, K // 2) and q.is_contiguous()
    assert sf.dtype == torch.float8_e4m3fn and sf.shape == (N, K // 16) and sf.is_contiguous()
    codes = nvfp4.unpack_codes(q, hi_first=False)  # element 2i in the low nibble
    values = e2m1_decode(codes, torch.float32) * sf.float().repeat_interleave(16, dim=1)
    assert torch.equal(values, nvfp4.dequantize_operand(bq, bs, (N, K)).float())


def _summary(quack: bool, not_run=None):
    rows = []
    for M in MS:
        for i, p in enumerate(("qkv", "out", "fc1", "fc2", "wide")):
            r = _row(p, M, 0.3 + 0.1 * i if quack else None)
            r["e2e_speedup_vs_comfy"], r["e2e_speedup_vs_comfy_graph"] = 2.0 - 0.1 * i, 2.2
            rows.append(r)
    headline, gates = B.headline_and_gates(rows, list(MS))
    targets = {k: {str(m): v for m, v in per_m.items()} for k, per_m in B.TARGETS.items()}
    return R.make_summary("p0-baseline", parameters={"targets": targets}, measurements=rows,
                          headline=headline, gates=gates, not_run=not_run)


@pytest.mark.parametrize("quack", [True, False])
def test_plot_draws_three_columns(tmp_path, monkeypatch, quack):
    pytest.importorskip("matplotlib")
    from workbench import plots

    drawn = {}
    save = plots._save

    def keep(fig, out):
        drawn["axes"] = [(ax.get_title(loc="left"), len(ax.patches),
                          [t.get_text() for t in ax.texts]) for ax in fig.axes]
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", keep)
    why = "quack_w4a16: quack-kernels not importable: ModuleNotFoundError: No module named 'x'"
    out = plots.p0_ratio_png(_summary(quack, None if quack else [why]), tmp_path / "p0.png")
    assert out.read_bytes().startswith(b"\x89PNG")
    titles = [t for t, _, _ in drawn["axes"]]
    assert len(titles) == 3
    assert "cuBLAS bf16" in titles[0] and "quack W4A16" in titles[1] and "Comfy" in titles[2]
    bars = [n for _, n, _ in drawn["axes"]]
    assert bars[0] == bars[2] == 15  # 5 projections x 3 M
    assert bars[1] == (15 if quack else 0)
    if not quack:
        assert drawn["axes"][1][2] == [why]


def test_config_label_names_the_build():
    assert B.config_label({"design": "swap_ab", "tile": [256, 128, 64], "splits": 1,
                           "stream_k": False}) == "swap_ab 256t"
    assert B.config_label({"design": "swap_ab", "tile": [128, 128, 64], "splits": 1,
                           "stream_k": True}) == "swap_ab 128t sk"
    assert B.config_label({"design": "p0", "tile": [128, 128, 64], "splits": 3,
                           "stream_k": False}) == "p0 128t s3"
