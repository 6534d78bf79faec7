"""Foundation: results schema and writer, CLI behaviour, compile helper, committed summaries."""
import json
from pathlib import Path

import pytest

from workbench import WorkbenchError
from workbench import results as R
from workbench.cli import main

REPO = Path(__file__).resolve().parent.parent


def _summary(name="demo", **kw):
    return R.make_summary(name, parameters={"a": 1}, measurements=[{"x": 1.0}],
                          headline={"gbps": 1.5}, gates={"g": R.gate(True, "ok")}, **kw)


def test_writer_validates_and_keeps_history(tmp_path, capsys):
    p = R.write(_summary(), tmp_path)
    assert R.load("demo", tmp_path)["verdict"] == "pass"
    R.write(_summary(), tmp_path)
    assert len(list((tmp_path / "history").glob("demo.*.json"))) == 1
    assert "kept as" in capsys.readouterr().err
    bad = _summary()
    del bad["headline"]
    with pytest.raises(WorkbenchError):
        R.write(bad, tmp_path)
    assert p.exists() and not list(tmp_path.glob(".*.tmp"))


def test_provenance_has_everything():
    prov = _summary()["provenance"]
    for k in R.PROVENANCE_KEYS:
        assert k in prov
    assert prov["gpu"] == "none" or "name" in prov["gpu"]


def test_provenance_line_is_one_parsable_line():
    line = R.provenance_line({"weights": 3})
    assert line.startswith("# provenance ") and "\n" not in line
    prov = json.loads(line[len("# provenance "):])
    assert all(k in prov for k in R.PROVENANCE_KEYS) and prov["seeds"] == {"weights": 3}


@pytest.mark.parametrize("path", sorted((REPO / "results").glob("*.json")), ids=lambda p: p.name)
def test_committed_results_match_the_schema(path):
    assert R.validate(json.loads(path.read_text())) == []


def test_cli_errors_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path))
    assert main(["results", "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wb: ") and err.count("\n") == 1 and "Traceback" not in err
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["results", "show", "broken"]) == 2
    assert main(["run", "no-such-experiment"]) == 2
    assert "known:" in capsys.readouterr().err


def test_cli_results_list_show_diff(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path))
    R.write(_summary("a"), tmp_path)
    s = _summary("b")
    s["headline"]["gbps"] = 3.0
    R.write(s, tmp_path)
    assert main(["results", "list"]) == 0
    assert main(["results", "show", "a"]) == 0
    assert main(["results", "diff", "a", "b"]) == 0
    out = capsys.readouterr().out
    assert "gbps" in out and "2" in out


def test_cli_env_and_gpu_only_commands_without_gpu(capsys):
    from conftest import HAVE_CUDA

    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "compile target" in out
    if not HAVE_CUDA:
        assert "none visible" in out
        assert main(["run", "amax", "--quick"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.compile
def test_compile_helper_reports_resources_and_census():
    from kernels.nvfp4 import amax
    from workbench.compile import compile_report

    r = compile_report(amax.TensorAbsMax(), *amax.compile_args())
    s = r.summary()
    assert s["registers"] > 0 and s["spill_bytes"] == 0
    assert s["census"]["atom"] >= 1 and s["census"]["wgmma.mma_async"] == 0
    with pytest.raises(WorkbenchError):
        compile_report(amax.TensorAbsMax(), *amax.compile_args(), arch="sm_80")
