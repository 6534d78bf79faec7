"""Foundation: results schema and writer, CLI behaviour, compile helper, committed summaries."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from workbench import WorkbenchError
from workbench import results as R
from cli.main import main

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


def test_cli_errors_are_one_line(published, capsys):
    assert main(["results", "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wb: ") and err.count("\n") == 1 and "Traceback" not in err
    (published / "broken.json").write_text("{not json")
    assert main(["results", "show", "broken"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["run", "no-such-experiment"]) == 2
    assert "known:" in capsys.readouterr().err


def test_cli_results_list_show_diff(published, capsys):
    R.write(_summary("a"), published)
    s = _summary("b")
    s["headline"]["gbps"] = 3.0
    R.write(s, published)
    assert main(["results", "list"]) == 0
    assert main(["results", "show", "a"]) == 0
    assert main(["results", "diff", "a", "b"]) == 0
    out = capsys.readouterr().out
    assert "gbps" in out and "2" in out


def test_a_run_writes_into_its_run_folder_never_into_the_published_one(published):
    path = R.write(_summary("fresh"))
    assert path.parent == R.run_dir() and path.parent.parent == published / "runs"
    assert re.fullmatch(r"\d{8}T\d{6}Z-[A-Za-z0-9._-]+", path.parent.name)  # <utc>-<host>
    assert not (published / "fresh.json").exists()
    assert R.write(_summary("again")).parent == path.parent  # one folder per process


def test_wb_results_dir_is_the_run_folder_when_set(published, tmp_path, monkeypatch):
    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path / "out"))
    assert R.write(_summary("gpu")) == tmp_path / "out" / "gpu.json"


def test_run_folders_are_git_ignored():
    rel = "results/runs/20260101T000000Z-host/ladder-numerics.json"
    out = subprocess.run(["git", "check-ignore", "-q", rel], cwd=REPO, check=False)
    assert out.returncode == 0, f"{rel} is not ignored: add /results/runs/ to .gitignore"


def test_verdict_follows_gates_and_not_run_parts():
    ok, bad = R.gate(True, ""), R.gate(False, "")
    assert R.expected_verdict({}) == "not-run"
    assert R.expected_verdict({"a": ok}) == "pass"
    assert R.expected_verdict({"a": ok}, ["rung 3: pending"]) == "incomplete"
    assert R.expected_verdict({"a": ok, "b": bad}, ["rung 3"]) == "partial"
    assert R.expected_verdict({"b": bad}) == "fail"
    s = _summary(not_run=["rung 3 (real projections): needs weights"])
    assert s["verdict"] == "incomplete" and s["notes"]["not_run"] and R.validate(s) == []


# --- quick runs: marked, and their verdict names the subset -------------------------------------
def test_a_quick_run_is_marked_and_its_verdict_names_the_subset():
    s = _summary(quick="3 of 9 variants")
    s["provenance"]["dirty"] = False
    assert s["verdict"] == "pass" and R.validate(s) == []  # the stored verdict stays a VERDICT
    assert s["parameters"]["quick"] is True and R.quick_scope(s) == "3 of 9 variants"
    assert R.verdict_text(s) == "pass (quick: 3 of 9 variants)"
    s["provenance"]["dirty"] = True
    assert R.verdict_text(s) == "pass (quick: 3 of 9 variants; dirty)"
    full = _summary()
    full["provenance"]["dirty"] = False
    assert R.quick_scope(full) is None and R.verdict_text(full) == "pass"
    assert R.weaker_than(s, full) and not R.weaker_than(full, s) and not R.weaker_than(s, s)


def test_an_experiment_run_with_quick_marks_every_summary_it_makes():
    """experiments' run_main: --quick marks the summaries even of an experiment that does not
    record it itself (ceilings, rcp-table, depth-loop), and only while it runs."""
    from experiments._common import run_main

    made = []

    def experiment(argv):
        made.append(R.make_summary("x", parameters={"shapes": 2}, measurements=[],
                                   headline={"a": 1}, gates={"g": R.gate(True, "")}))

    assert run_main(experiment, ["--quick", "--rows", "1"]) == 0
    assert run_main(experiment, ["--rows", "1"]) == 0
    assert made[0]["parameters"] == {"shapes": 2, "quick": True}
    assert R.verdict_text(made[0]).startswith("pass (quick")
    assert "quick" not in made[1]["parameters"] and R.quick_scope(made[1]) is None


@pytest.mark.parametrize("given", ["env", "flag"])
def test_check_results_dir(tmp_path, monkeypatch, given):
    monkeypatch.delenv("WB_RESULTS_DIR", raising=False)
    assert R.check_results_dir() is None  # the run folder: made on the first write

    def check(path):
        if given == "flag":
            return R.check_results_dir(path)
        monkeypatch.setenv("WB_RESULTS_DIR", str(path))
        return R.check_results_dir()

    assert check(tmp_path / "new") == tmp_path / "new" and (tmp_path / "new").is_dir()
    assert check(tmp_path / "new") == tmp_path / "new"  # already there: fine
    with pytest.raises(WorkbenchError, match="no such folder"):
        check(tmp_path / "a" / "b")
    (tmp_path / "f").write_text("")
    with pytest.raises(WorkbenchError, match="not a folder"):
        check(tmp_path / "f")
    assert not list((tmp_path / "new").iterdir())  # the write probe leaves nothing behind


# --- provenance "dirty", on a real temporary git tree ---------------------------------------
def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c",
                    "commit.gpgsign=false", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv("WB_GIT_COMMIT", raising=False)
    r = tmp_path / "repo"
    (r / "results").mkdir(parents=True)
    (r / "code.py").write_text("x = 1\n")
    (r / "results" / "x.json").write_text("{}\n")
    (r / ".gitignore").write_text("/results/runs/\n")
    _git(r, "init", "-q")
    _git(r, "add", "-A")
    _git(r, "commit", "-q", "-m", "init")
    return r


def test_git_state_clean_tree(repo):
    commit, dirty = R.git_state(repo)
    assert len(commit) == 40 and not dirty


def test_git_state_modified_staged_renamed_code_is_dirty(repo):
    (repo / "code.py").write_text("x = 2\n")
    assert R.git_state(repo)[1]
    _git(repo, "add", "code.py")
    assert R.git_state(repo)[1]
    _git(repo, "commit", "-q", "-m", "two")
    assert not R.git_state(repo)[1]
    _git(repo, "mv", "code.py", "moved.py")
    assert R.git_state(repo)[1]


def test_git_state_untracked_counts_unless_ignored(repo):
    (repo / "new.py").write_text("")
    assert R.git_state(repo)[1]
    (repo / "new.py").unlink()
    (repo / "results" / "runs" / "r1").mkdir(parents=True)
    (repo / "results" / "runs" / "r1" / "a.json").write_text("{}")
    assert not R.git_state(repo)[1]


def test_git_state_results_are_outputs_not_code(repo):
    (repo / "results" / "x.json").write_text('{"new": 1}\n')  # porcelain " M results/x.json"
    (repo / "results" / "y.json").write_text("{}\n")
    assert not R.git_state(repo)[1]
    _git(repo, "add", "results")
    assert not R.git_state(repo)[1]
    (repo / "resultsx.py").write_text("")  # a sibling that merely starts alike is code
    assert R.git_state(repo)[1]


def test_git_state_without_git_is_unknown_and_dirty(tmp_path, monkeypatch):
    monkeypatch.delenv("WB_GIT_COMMIT", raising=False)
    assert R.git_state(tmp_path) == ("unknown", True)
    monkeypatch.setenv("WB_GIT_COMMIT", "abc1234")
    assert R.git_state(tmp_path) == ("abc1234", False)


def test_changed_paths_keeps_the_porcelain_columns():
    out = " M results/x.json\0?? new.py\0R  b.py\0a.py\0"
    assert R.changed_paths(out) == ["results/x.json", "new.py", "b.py", "a.py"]


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
