"""p2-parity without a GPU: its case list, the chunk plans (a partial last chunk asserted at full
size), the chunk-by-chunk comparison, gates and verdict with a runner made of the exact
reference backend (P0: the whole call; P2: chunk by chunk, rows = the chunk, into the chunk's
slice of out), mutated runners caught, the summary written through the results helpers, the
inputs recorded from a small H3's forward, and the not-run report without a GPU. The GPU run
itself is experiments/p2_parity.py's (device step p2-parity)."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from experiments import p2_parity as E
from models.h3 import FULL, QUICK, H3Config, H3Model, _rmsnorm, block_vectors, initial_latent
from models.nvfp4_linear import Nvfp4Linear
from workbench import WorkbenchError
from workbench import results as R

M = 300  # not a multiple of 128: every ring capacity leaves a partial last chunk
K = 64
N = {"qkv": 64, "out": 32, "fc1": 48}


def test_the_case_list_is_the_issues():
    blocks = E.parity_blocks(FULL)
    caps = E.default_capacities(quick=False)
    cases = E.case_list(blocks, caps)
    assert blocks == (0, 24, 49) and caps == (2048, 512) and len(cases) == 18
    assert {c["projection"] for c in cases} == {"qkv", "out", "fc1"}  # fc2 stays on P0
    assert cases[0] == {"block": 0, "projection": "qkv", "capacity": 2048}
    assert E.parity_blocks(QUICK) == (0, 1, 2)
    assert E.default_capacities(quick=True) == (128, 2048)


def test_full_size_plans_end_in_a_partial_chunk():
    plan, partial = E.check_plan(FULL.tokens, 2048, require_partial=True)
    assert partial and len(plan) == 19 and plan[-1].rows == 946 and plan[-1].stop == 37810
    plan, partial = E.check_plan(FULL.tokens, 512, require_partial=True)
    assert partial and len(plan) == 74 and plan[-1].rows == 434
    # the quick config's 256 tokens: 128 crosses a boundary without a partial chunk, 2048 is one
    assert E.check_plan(QUICK.tokens, 128, require_partial=False)[1] is False
    assert E.check_plan(QUICK.tokens, 2048, require_partial=False)[1] is True
    with pytest.raises(WorkbenchError, match="no partial last chunk"):
        E.check_plan(256, 128, require_partial=True)
    with pytest.raises(WorkbenchError, match="multiple of 128"):
        E.check_plan(FULL.tokens, 1000, require_partial=True)


class RefRunner:
    """P0: the reference linear over all rows; P2: the same linear chunk by chunk (the ring's
    rows, the whole x's tensor scale), each chunk stored into its slice of ``out``."""

    def __init__(self, mutate=None):
        self.lins, self.mutate = {}, mutate

    def lin(self, block, role):
        if (block, role) not in self.lins:
            g = torch.Generator().manual_seed(block * 10 + len(role))
            w = (torch.randn(N[role], K, generator=g) / K**0.5).to(torch.bfloat16)
            self.lins[block, role] = Nvfp4Linear(w, role=role)
        return self.lins[block, role]

    def n(self, block, role):
        return N[role]

    def p0(self, block, role, inp, out):
        return self.lin(block, role)(inp["x"], gate=inp["gate"], residual=inp["residual"],
                                     out=out)

    def p2(self, block, role, inp, capacity, out):
        lin, res = self.lin(block, role), inp["residual"]
        for ch in E.chunk_plan(0, inp["x"].shape[0], capacity):
            if self.mutate == "skip_last" and ch.stop == inp["x"].shape[0]:
                continue
            lin(inp["x"], rows=(ch.start, ch.stop), gate=inp["gate"],
                residual=None if res is None else res[ch.start:ch.stop],
                out=out[ch.start:ch.stop])
        if self.mutate == "flip" and block == 1 and role == "out" and capacity == 128:
            out.view(torch.int16)[200, 3] ^= 1
        return out

    def sync(self):
        pass

    def release(self):
        pass

    def peak_bytes(self):
        return 0


def _inputs(blocks):
    g = torch.Generator().manual_seed(7)
    inputs = {}
    for b in blocks:
        for role in E.PROJECTIONS:
            x = (torch.randn(M, K, generator=g) * 3).to(torch.bfloat16)
            gate = res = None
            if role == "out":
                gate = torch.randn(N[role], generator=g).to(torch.bfloat16)
                res = torch.randn(M, N[role], generator=g).to(torch.bfloat16)
            inputs[b, role] = {"x": x, "gate": gate, "residual": res}
    return inputs


def _run(runner, blocks=(0, 1), caps=(128, 256)):
    inputs = _inputs(blocks)
    said = []
    rows = E.run_cases(runner, inputs, blocks, caps, require_partial=True, say=said.append)
    assert inputs == {}  # every block's activations dropped after its cases
    assert len(said) == len(rows)  # a progress line per case
    head, gates = E.headline_and_gates(rows, E.case_list(blocks, caps))
    return rows, head, gates, said


def test_the_reference_ring_passes_every_gate():
    rows, head, gates, said = _run(RefRunner())
    assert len(rows) == 12 and all(r["bit_identical"] and r["checksums_equal"] for r in rows)
    assert all(r["partial_last_chunk"] and r["p0_unwritten"] == 0 for r in rows)
    assert {r["chunks"] for r in rows} == {3, 2}  # 300 rows: 128+128+44, 256+44
    assert [r["epilogue"] for r in rows if r["projection"] == "out"] == ["gate_residual"] * 4
    assert all(g["pass"] for g in gates.values()), gates
    assert head["cases"] == head["cases_bit_identical"] == 12 and head["all_bit_identical"]
    assert head["first_failure"] is None and len(head["p0_sha256"]) == 6
    assert "every chunk bit-identical" in said[0] and "partial" in said[0]
    s = R.make_summary(E.NAME, parameters={}, measurements=rows, headline=head, gates=gates)
    assert s["verdict"] == "pass" and not R.validate(s)


def test_a_flipped_bit_is_named_by_chunk_and_row():
    rows, head, gates, said = _run(RefRunner(mutate="flip"))
    bad = [r for r in rows if not r["bit_identical"]]
    assert len(bad) == 1 and bad[0]["block"] == 1 and bad[0]["projection"] == "out"
    assert bad[0]["first_bad"] == {"chunk": 1, "rows": [128, 256], "row": 200, "elements": 1,
                                   "last_chunk": False}
    assert bad[0]["bad_chunks"] == 1 and not bad[0]["checksums_equal"]
    assert not gates["bit_identical"]["pass"] and not gates["checksums_equal"]["pass"]
    assert "chunk 1 rows [128, 256), first row 200, 1 elements differ" in head["first_failure"]
    assert gates["every_element_written"]["pass"]
    s = R.make_summary(E.NAME, parameters={}, measurements=rows, headline=head, gates=gates)
    assert s["verdict"] == "partial"


def test_an_unwritten_last_partial_chunk_is_caught():
    rows, head, gates, _ = _run(RefRunner(mutate="skip_last"))
    assert not any(r["bit_identical"] for r in rows)
    for r in rows:  # the poison left there differs from P0's rows
        f = r["first_bad"]
        assert f["last_chunk"] and f["rows"] == [(r["chunks"] - 1) * r["capacity"], 300]
        assert f["row"] == f["rows"][0] and f["elements"] == 44 * r["N"]
    assert "(the last)" in head["first_failure"]


def test_an_output_not_stored_in_out_fails_the_written_gate():
    class Fresh(RefRunner):
        def p0(self, block, role, inp, out):
            return super().p0(block, role, inp, None)

    rows, head, gates, _ = _run(Fresh(), blocks=(0,), caps=(128,))
    assert gates["bit_identical"]["pass"] and not gates["every_element_written"]["pass"]


def test_missing_cases_and_uncovered_chunks_fail_their_gates():
    rows, *_ = _run(RefRunner(), blocks=(0,), caps=(128,))
    head, gates = E.headline_and_gates(rows, E.case_list((0, 24), (128,)))
    assert not gates["cases_complete"]["pass"] and "3 of 6" in gates["cases_complete"]["detail"]
    one = [dict(r, chunks=1, partial_last_chunk=False) for r in rows]
    _, gates = E.headline_and_gates(one, E.case_list((0,), (128,)))
    assert not gates["partial_last_chunk"]["pass"] and not gates["chunk_boundary_crossed"]["pass"]
    _, gates = E.headline_and_gates([], E.case_list((0,), (128,)))
    assert not any(g["pass"] for g in gates.values())


def test_quick_main_writes_the_summary_with_a_mocked_runner(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(E, "need_gpu", lambda name: None)
    monkeypatch.setattr(E, "build_runner", lambda cfg, blocks, seed: (
        RefRunner(), _inputs(blocks), {"weights_pack_s": 0.0, "weight_cache": "unset"}))
    assert E.main(["--quick", "--results-dir", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "p2-parity.json").read_text())
    assert s["verdict"] == "pass" and s["parameters"]["quick"] is True
    assert s["parameters"]["blocks"] == [0, 1, 2] and s["parameters"]["capacities"] == [128, 2048]
    assert s["headline"]["cases"] == 18 and len(s["measurements"]) == 19  # + the setup row
    assert s["provenance"]["commit"] and "p2 sha256" in capsys.readouterr().out
    assert E.main(["--quick", "--results-dir", str(tmp_path)]) == 0  # the first one kept
    assert len(list((tmp_path / "history").glob("p2-parity.*.json"))) == 1


def test_quick_without_a_gpu_is_not_run(tmp_path, capsys):
    from conftest import HAVE_CUDA

    if HAVE_CUDA:
        pytest.skip("a GPU is visible: the run would start")
    assert E.main(["--quick", "--results-dir", str(tmp_path)]) == 2
    assert "'p2-parity' needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no summary, nothing half-written


def test_a_capacity_off_the_scale_tiles_is_refused_before_any_work(tmp_path, capsys):
    assert E.main(["--capacities", "1000", "--results-dir", str(tmp_path)]) == 2
    assert "multiple of 128" in capsys.readouterr().err


def test_inputs_recorded_from_the_forward():
    cfg = H3Config(blocks=3, hidden=64, mlp=64, head_dim=32, video_tokens=100, audio_tokens=30)
    model = H3Model(cfg, seed=3)
    inputs = E.capture_inputs(model, (0, 1), say=lambda m: None)
    assert set(inputs) == {(b, r) for b in (0, 1) for r in E.PROJECTIONS}
    x0 = model.embed(initial_latent(cfg, 3), 0)
    vec = block_vectors(cfg, 3, 0)
    assert torch.equal(inputs[0, "qkv"]["x"], _rmsnorm(x0, vec["norm_attn"]))
    assert torch.equal(inputs[0, "out"]["residual"], x0)
    assert torch.equal(inputs[0, "out"]["gate"], vec["gate_attn"])
    assert inputs[0, "qkv"]["gate"] is None and inputs[1, "fc1"]["residual"] is None
    assert torch.equal(inputs[1, "qkv"]["x"],
                       _rmsnorm(model.block(0, x0), block_vectors(cfg, 3, 1)["norm_attn"]))


def test_weight_cache_noted_where_this_tree_cannot_honour_it(monkeypatch):
    if importlib.util.find_spec("models.weight_cache") is not None:
        pytest.skip("this tree has models.weight_cache: the variable is honoured")
    monkeypatch.delenv("WB_WEIGHT_CACHE", raising=False)
    assert E.weight_cache_kwargs() == ({}, None)
    monkeypatch.setenv("WB_WEIGHT_CACHE", "/tmp/wb-weights")
    kw, note = E.weight_cache_kwargs()
    assert kw == {} and "ignored" in note and "/tmp/wb-weights" in note
