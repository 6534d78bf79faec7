"""wb results / publish / plot / ladder / log-header: what stays true, and one-line errors.

Every test runs on a published results/ and run folders of its own (WB_PUBLISHED_DIR), CPU only.
"""
import json
import pathlib
import sys
from pathlib import Path

import pytest

from workbench import WorkbenchError
from workbench import logs as L
from workbench import results as R
from cli.main import main

REPO = Path(__file__).resolve().parent.parent
H200 = {"name": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132}
SHA = "0123456789abcdef0123456789abcdef01234567"


def _summary(name="demo", gpu="none", gbps=1.5, commit=SHA, dirty=False, **kw):
    s = R.make_summary(name, parameters={"a": 1}, measurements=[{"case": "x", "gbps": gbps}],
                       headline={"gbps": gbps, "per_m": {"128": 0.5, "2048": 0.9}},
                       gates={"g": R.gate(True, "ok")}, **kw)
    s["provenance"].update(gpu=gpu, commit=commit, dirty=dirty)  # not this checkout's state
    return s


def _run(tmp_path, *summaries, name="run1") -> Path:
    run = tmp_path / "runs" / name
    for s in summaries:
        R.write(s, run)
    return run


def _one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err
    assert err.startswith("wb: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


# --- bad entries: one line on stderr, non-zero, for every command ------------------------------
def _bad_entry(folder: Path, kind: str, monkeypatch) -> str:
    """Make one unusable entry ``<kind>.json`` in ``folder``; returns its name."""
    path = folder / f"{kind}.json"
    if kind == "not-utf8":
        path.write_bytes(b'{"schema": 1, "name": "\xff\xfe"}')
    elif kind == "not-json":
        path.write_text("{not json")
    elif kind == "directory":
        path.mkdir()
    elif kind == "not-a-summary":
        path.write_text(json.dumps({"schema": 1, "name": "x"}))
    elif kind == "unreadable":  # root reads through chmod 000: fail the read itself
        path.write_text("{}")
        real = pathlib.Path.read_bytes

        def read_bytes(self):
            if self.name == path.name:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)

        monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    return kind


BAD = ["not-utf8", "not-json", "directory", "not-a-summary", "unreadable"]


@pytest.mark.parametrize("kind", BAD)
def test_list_reports_bad_entries_in_one_line_and_fails(published, kind, monkeypatch, capsys):
    R.write(_summary("good"), published)
    _bad_entry(published, kind, monkeypatch)
    assert main(["results", "list"]) == 2
    cap = capsys.readouterr()
    assert "good" in cap.out  # the readable ones are still listed
    assert cap.err.startswith("wb: 1 unusable entry") and cap.err.count("\n") == 1
    assert f"{kind}.json" in cap.err and "Traceback" not in cap.err


@pytest.mark.parametrize("kind", BAD)
def test_show_diff_plot_refuse_bad_entries(published, kind, monkeypatch, capsys):
    R.write(_summary("good"), published)
    name = _bad_entry(published, kind, monkeypatch)
    for argv in (["results", "show", name], ["results", "diff", "good", name],
                 ["results", "diff", str(published / f"{name}.json"), "good"],
                 ["results", "plot", name, "--out", str(published / "x.png")]):
        assert main(argv) == 2, argv
        _one_line_error(capsys, f"{name}.json")


@pytest.mark.parametrize("kind", BAD)
def test_publish_refuses_bad_entries_and_writes_nothing(published, tmp_path, kind,
                                                        monkeypatch, capsys):
    run = _run(tmp_path, _summary("good"))
    _bad_entry(run, kind, monkeypatch)
    assert main(["results", "publish", str(run)]) == 2
    _one_line_error(capsys, "nothing written", f"{kind}.json")
    assert not (published / "good.json").exists()


def test_show_and_list_read_a_run_folder_with_run(published, tmp_path, capsys):
    run = _run(tmp_path, _summary("only-in-run"))
    assert main(["results", "show", "only-in-run"]) == 2
    _one_line_error(capsys, "no results summary")
    assert main(["results", "show", "only-in-run", "--run", str(run)]) == 0
    assert main(["results", "list", "--run", str(run)]) == 0
    assert "only-in-run" in capsys.readouterr().out
    assert main(["results", "list", "--run", str(tmp_path / "nope")]) == 2
    _one_line_error(capsys, "not found")


def test_latest_run_is_the_newest_run_folder(published, capsys):
    assert main(["results", "list", "--run", "latest"]) == 2
    _one_line_error(capsys, "no run folders")
    R.write(_summary("older"), published / "runs" / "20260101T000000Z-a")
    R.write(_summary("newer"), published / "runs" / "20260102T000000Z-a")
    assert main(["results", "list", "--run", "latest"]) == 0
    out = capsys.readouterr().out
    assert "newer" in out and "older" not in out


def test_latest_run_skips_folders_without_a_summary_and_follows_wb_results_dir(
        published, tmp_path, monkeypatch, capsys):
    R.write(_summary("with-summary"), published / "runs" / "20260101T000000Z-a")
    only_png = published / "runs" / "20260102T000000Z-a"
    only_png.mkdir()
    (only_png / "amax.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert main(["results", "list", "--run", "latest"]) == 0
    assert "with-summary" in capsys.readouterr().out
    out_dir = tmp_path / "out"
    R.write(_summary("on-the-gpu-host"), out_dir)
    monkeypatch.setenv("WB_RESULTS_DIR", str(out_dir))
    assert main(["results", "show", "on-the-gpu-host", "--run", "latest"]) == 0
    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path / "missing"))
    assert main(["results", "list", "--run", "latest"]) == 2
    _one_line_error(capsys, "WB_RESULTS_DIR", "not a folder")


def test_diff_a_run_against_the_published_summary(published, tmp_path, capsys):
    R.write(_summary("amax", gbps=2.0), published)
    run = _run(tmp_path, _summary("amax", gbps=3.0))
    assert main(["results", "diff", "amax", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "published" in out and "1.5" in out  # 3.0 / 2.0
    assert main(["results", "diff", "amax", str(run / "amax.json")]) == 0
    assert "1.5" in capsys.readouterr().out
    assert main(["results", "diff", "amax"]) == 2
    _one_line_error(capsys, "usage")


# --- what a person reads: tables within TABLE_WIDTH columns, no trailing spaces ----------------
def _readable(out: str) -> list[str]:
    lines = out.splitlines()
    assert lines and max(map(len, lines)) <= R.TABLE_WIDTH, max(lines, key=len)
    assert all(line == line.rstrip() for line in lines)
    return lines


def test_list_show_diff_fit_the_table_width(published, capsys):
    """The published summaries with the longest keys and values (frame-schedule: ~150 nested
    headline figures, a variant name of 70 characters, a calibration source of 200)."""
    for name in ("frame-schedule", "p0-baseline", "depth-frame", "ladder-p0", "amax"):
        (published / f"{name}.json").write_bytes((REPO / "results" / f"{name}.json").read_bytes())
    assert main(["results", "list"]) == 0
    lines = _readable(capsys.readouterr().out)
    assert len(lines) == 2 + 5
    for name in ("frame-schedule", "p0-baseline", "depth-frame"):
        assert main(["results", "show", name]) == 0
        _readable(capsys.readouterr().out)
    older = _summary("frame-schedule", gbps=2.0)
    older["headline"] = {**R.load("frame-schedule")["headline"], "phases": 431}
    run = _run(published.parent, older)
    assert main(["results", "diff", "frame-schedule", "--run", str(run)]) == 0
    lines = _readable(capsys.readouterr().out)
    assert any(line.startswith("phases") for line in lines) and len(lines) < 20
    assert "equal in both (--all lists them)" in lines[-1]
    assert main(["results", "diff", "frame-schedule", "--run", str(run), "--all"]) == 0
    assert len(_readable(capsys.readouterr().out)) > 100


def test_format_table_cuts_and_wraps_within_its_width():
    key = "frame_kernel_calibration.held_out.16.critical_path_us.gateup"
    table = R.format_table([[key, "x" * 300], ["short", 1.23456]], ["headline", "value"],
                           width=60, max_cell=30)
    lines = table.splitlines()
    assert max(map(len, lines)) <= 60 and all(line == line.rstrip() for line in lines)
    assert lines[2].startswith("frame_kernel_c…") and "_path_us.gateup  xxx" in lines[2]
    wrapped = R.format_table([["k", "word " * 40]], ["key", "text"], width=40, wrap_last=True)
    assert len(wrapped.splitlines()) > 3 and max(map(len, wrapped.splitlines())) <= 40


# --- publish ---------------------------------------------------------------------------------
def test_publish_copies_a_run_and_keeps_the_replaced_summary(published, tmp_path, capsys):
    assert main(["results", "publish", str(_run(tmp_path, _summary("amax", gpu=H200)))]) == 0
    assert R.load("amax")["provenance"]["gpu"] == H200
    newer = _summary("amax", gpu=H200, gbps=9.0)
    newer["provenance"]["utc"] = "2099-01-01T00:00:00Z"
    assert main(["results", "publish", str(_run(tmp_path, newer, name="run2"))]) == 0
    assert R.load("amax")["headline"]["gbps"] == 9.0
    kept = list((published / "history").glob("amax.*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["headline"]["gbps"] == 1.5
    assert main(["results", "publish", str(tmp_path / "runs" / "run2")]) == 0
    assert "already published" in capsys.readouterr().out


@pytest.mark.parametrize("weaker,needle", [
    (dict(quick="3 of 9 variants"), "is a quick run (3 of 9 variants) where the published one "
                                    "is full"),
    (dict(dirty=True), "was recorded dirty where the published one is clean")])
def test_publish_refuses_a_quick_or_dirty_summary_over_a_full_clean_one(
        published, tmp_path, weaker, needle, capsys):
    full = _summary("p0-compile")
    assert main(["results", "publish", str(_run(tmp_path, full))]) == 0
    before = (published / "p0-compile.json").read_bytes()
    run = _run(tmp_path, _summary("p0-compile", gbps=9.0, commit="f" * 40, **weaker), name="r2")
    assert main(["results", "publish", str(run)]) == 2
    _one_line_error(capsys, "refusing to replace", needle, "--force")
    assert (published / "p0-compile.json").read_bytes() == before
    assert not (published / "history").exists()

    assert main(["results", "publish", "--force", str(run)]) == 0
    out = capsys.readouterr().out
    kept = list((published / "history").glob("p0-compile.*.json"))
    assert len(kept) == 1 and R.read_json(kept[0]) == full
    assert f"forced; the replaced one kept as history/{kept[0].name}" in out
    forced = R.load("p0-compile")
    assert forced["headline"]["gbps"] == 9.0
    note = forced["notes"]["forced"]
    assert "--force" in note and SHA[:10] in note and kept[0].name in note and needle in note
    assert main(["results", "publish", str(run)]) == 0  # its own source again: nothing to do
    assert "already published" in capsys.readouterr().out
    assert main(["results", "show", "p0-compile"]) == 0
    assert "forced: published with --force" in capsys.readouterr().out


def test_publish_lets_a_quick_run_replace_a_quick_one_and_a_full_one_replace_both(
        published, tmp_path, capsys):
    quick = dict(quick="3 of 9 variants")
    for i, (kw, dirty) in enumerate([(quick, True), (quick, True), ({}, True), ({}, False)]):
        s = _summary("frame-schedule", gbps=float(i), dirty=dirty, **kw)
        assert main(["results", "publish", str(_run(tmp_path, s, name=f"r{i}"))]) == 0, i
    assert R.verdict_text(R.load("frame-schedule")) == "pass"
    assert len(list((published / "history").glob("frame-schedule.*.json"))) == 3


def test_list_and_show_mark_quick_and_dirty_summaries(published, capsys):
    R.write(_summary("full"), published)
    R.write(_summary("subset", quick="3 of 9 variants"), published)
    R.write(_summary("draft", dirty=True), published)
    ladder = _summary("ladder-p0")
    ladder["parameters"]["quick"] = True  # how the ladder records it: no subset named
    R.write(ladder, published)
    assert main(["results", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "pass (quick: 3 of 9 variants)" in rows["subset"]
    assert "pass (dirty)" in rows["draft"] and "pass (quick)" in rows["ladder-p0"]
    assert "(" not in rows["full"].split("none")[0]
    assert main(["results", "show", "subset"]) == 0
    assert "subset: verdict pass (quick: 3 of 9 variants)" in capsys.readouterr().out


@pytest.mark.parametrize("old,new", [(H200, "none"), ("none", H200),
                                     (H200, {**H200, "name": "NVIDIA H100"})])
def test_publish_never_replaces_another_machine_class(published, tmp_path, old, new, capsys):
    R.write(_summary("ladder-numerics", gpu=old), published)
    before = (published / "ladder-numerics.json").read_bytes()
    run = _run(tmp_path, _summary("ladder-numerics", gpu=new))
    assert main(["results", "publish", str(run)]) == 2
    _one_line_error(capsys, "refusing to replace", "measured on")
    assert (published / "ladder-numerics.json").read_bytes() == before
    assert not (published / "history").exists()


def test_publish_refuses_a_verdict_its_gates_contradict(published, tmp_path, capsys):
    s = _summary("ladder-p0", not_run=["rung 3 (real projections): needs the model"])
    s["verdict"] = "pass"  # what ladder-p0 said beside a not-run rung
    assert main(["results", "publish", str(_run(tmp_path, s))]) == 2
    _one_line_error(capsys, "contradicts", "'incomplete'")


def test_publish_is_all_or_nothing(published, tmp_path, capsys):
    run = _run(tmp_path, _summary("good"), _summary("also-good"))
    (run / "orphan.png").write_bytes(b"\x89PNG\r\n\x1a\n....")
    assert main(["results", "publish", str(run)]) == 2
    _one_line_error(capsys, "orphan.png")
    assert list(published.iterdir()) == []


def test_publish_logs_records_and_plots(published, tmp_path, capsys):
    run = _run(tmp_path, _summary("amax", gpu=H200))
    (run / "amax.png").write_bytes(b"\x89PNG\r\n\x1a\nimage")
    header = L.log_header("pytest -q -m gpu", prov={**R.provenance(), "commit": SHA,
                                                     "gpu": H200})
    (run / "tests.log").write_text(header + "\n....  [100%]\n")
    (run / "bare.log").write_text("round 0 defaults: 1374 µs\n")
    R.write_record("draw-trace-64", {"rows": 64}, run)
    rec = json.loads((run / "draw-trace-64.json").read_text())
    rec["provenance"].update(commit=SHA, gpu=H200)
    (run / "draw-trace-64.json").write_text(json.dumps(rec))
    (run / "profile.ncu-rep").write_bytes(b"\0")
    assert main(["results", "publish", str(run)]) == 0
    out = capsys.readouterr().out
    assert "profile.ncu-rep: skipped" in out
    logs = published / "logs"
    assert (published / "amax.png").read_bytes().endswith(b"image")
    assert (logs / "0123456-tests.log").read_text().startswith(header)
    bare = (logs / "0123456-bare.log").read_text()  # header from the run's summaries
    assert L.text_provenance(bare) == {"commit": SHA, "device": "NVIDIA H200"}
    assert bare.endswith("round 0 defaults: 1374 µs\n")
    assert L.record_provenance(R.read_json(logs / "0123456-draw-trace-64.json"))
    (run / "tests.log").write_text(header + "\nother output\n")
    assert main(["results", "publish", str(run / "tests.log")]) == 2
    _one_line_error(capsys, "exists with other content")


def test_publish_puts_a_report_beside_its_summary_and_refuses_two_sources_one_name(
        published, tmp_path, capsys):
    run = _run(tmp_path, _summary("ladder-p0", gpu=H200))
    (run / "ladder-p0.md").write_text("# Ladder p0: pass\n")
    (run / "scratch.md").write_text("# notes of the run, no summary of that name\n")
    assert main(["results", "publish", str(run)]) == 0
    assert "scratch.md: skipped" in capsys.readouterr().out
    assert (published / "ladder-p0.md").read_text() == "# Ladder p0: pass\n"
    assert main(["results", "publish", str(run)]) == 0  # the same bytes again: not archived
    assert not (published / "history").exists() or not any(
        p.name.startswith("ladder-p0.md") for p in (published / "history").iterdir())
    header = L.log_header("pytest", prov={**R.provenance(), "commit": SHA, "gpu": H200})
    a, b = tmp_path / "a", tmp_path / "b"
    for d, text in ((a, "1 passed"), (b, "2 passed")):
        d.mkdir()
        (d / "tests.log").write_text(header + "\n" + text + "\n")
    assert main(["results", "publish", str(a), str(b)]) == 2
    _one_line_error(capsys, "two sources would be published as logs/0123456-tests.log")
    assert not (published / "logs").exists()


def test_publish_refuses_a_log_without_provenance(published, tmp_path, capsys):
    log = tmp_path / "lonely.log"
    log.write_text("8 passed in 23.40s\n")
    assert main(["results", "publish", str(log)]) == 2
    _one_line_error(capsys, "no provenance line", "wb log-header")
    (tmp_path / "x.cubin").write_bytes(b"\0")
    assert main(["results", "publish", str(tmp_path / "x.cubin")]) == 2
    _one_line_error(capsys, "not a summary, record, log or plot")
    assert main(["results", "publish", str(tmp_path / "missing")]) == 2
    _one_line_error(capsys, "no such file or folder")


def test_import_results_is_publish(published, tmp_path, capsys):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import import_results
    finally:
        sys.path.remove(str(REPO / "scripts"))
    run = _run(tmp_path, _summary("amax", gpu=H200))
    assert import_results.main([str(run)]) == 0 and R.load("amax")
    assert import_results.main([str(_run(tmp_path, _summary("amax"), name="cpu"))]) == 2
    assert "refusing to replace" in capsys.readouterr().err


# --- log provenance ------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    L.log_header("python3 -m experiments.depth_loop") + "\n[01:04:32] 1 rows: ...\n",
    ('# provenance {"commit": "05628d8", "device": "NVIDIA H200 (device tool)", "utc": '
     '"2026-11-29", "command": "pytest"}\n....\n'),
    ("# H200 (device call, session 8, 2026-11-29), commit 19b49000c533ec7d0b1d58e9dbf8fd9a491a2f05"
     ", CuTe DSL 4.8.1, torch 2.11.0+cu130; command: pytest -q -m gpu\n....\n"),
    ("# note: run at commit 3eb98c5bc5655a02a88fe6b1e5bcedb484c154f3 (branch wip)\n"
     f'# provenance {{"commit": "{SHA}", "gpu": {{"name": "NVIDIA H200"}}}}\nround 0\n'),
])
def test_logs_with_provenance(text):
    found = L.text_provenance(text)
    assert found and found["device"] and len(found["commit"]) >= 7


@pytest.mark.parametrize("text", [
    "round 0 defaults: 4589 µs\n",
    "# note: run at commit 3eb98c5bc5655a02a88fe6b1e5bcedb484c154f3 (wrong WB_GIT_COMMIT)\n....\n",
    "gpu:            NVIDIA H200 (sm_90, 132 SMs)\ncompile target: sm_90a\n",
    "a\nb\nc\n" + L.log_header("late"),  # a header below the first lines does not count
    '# provenance {"commit": "not-a-sha", "device": "NVIDIA H200"}\n',
    "# provenance {broken json\n",
])
def test_logs_without_provenance(text):
    assert L.text_provenance(text) is None


def test_log_header_command_prints_a_parsable_first_line(capsys):
    assert main(["log-header", "python3", "-m", "pytest", "-k", "a or b"]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and line.startswith(L.HEADER)
    block = json.loads(line[len(L.HEADER):])
    assert block["command"] == "python3 -m pytest -k 'a or b'" and "device" in block
    assert main(["log-header"]) == 2
    _one_line_error(capsys, "usage: wb log-header")


def test_every_committed_log_names_its_commit_and_device():
    logs = REPO / "results" / "logs"
    assert L.unverified(logs) == []
    assert (logs / "unverified" / "README.md").is_file()


# --- plots ---------------------------------------------------------------------------------
def test_plot_writes_a_png_of_the_headline(published, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    R.write(_summary("amax"), published)
    out = tmp_path / "amax.png"
    assert main(["results", "plot", "amax", "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_plot_of_a_published_summary_leaves_a_run_folder_that_is_a_run(published, capsys):
    """Without --out the PNG goes into this process's run folder beside a copy of the summary:
    `--run latest` reads it and publishing the folder publishes the plot."""
    pytest.importorskip("matplotlib")
    R.write(_summary("amax"), published)
    assert main(["results", "plot", "amax"]) == 0
    run = R.run_dir()
    assert (run / "amax.png").is_file() and R.load("amax", run) == R.load("amax")
    assert main(["results", "show", "amax", "--run", "latest"]) == 0
    capsys.readouterr()
    assert main(["results", "publish", str(run)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # long paths wrap
    assert "amax.json: already published" in out and "-> amax.png" in out
    assert (published / "amax.png").read_bytes() == (run / "amax.png").read_bytes()
    assert main(["results", "plot", "amax", "--run", str(run)]) == 0  # beside the run's own


def test_plot_never_writes_beside_another_summary_of_its_name(published, capsys):
    R.write(_summary("amax"), published)
    R.write(_summary("amax", gbps=7.0), R.run_dir())  # this run measured its own amax
    assert main(["results", "plot", "amax"]) == 2
    _one_line_error(capsys, "another 'amax' summary", "--run", "--out")
    assert not (R.run_dir() / "amax.png").exists()


def test_headline_plot_panels_keep_units_apart_and_stay_small():
    """frame-schedule's ~150 headline figures in µs, ratios and counts: one panel a unit, at
    most MAX_PANELS of MAX_BARS, the top-level figures first, the rest counted."""
    from workbench.plots import MAX_BARS, MAX_PANELS, headline_panels, unit_of

    assert unit_of("predicted_us.seed at 1 row") == "µs"
    assert unit_of("whole_frame_calibration.held_out.8.critical_path_us.down") == "µs"
    assert unit_of("frame_kernel_held_out_error.16") == "ratio"
    assert unit_of("p0_over_cublas_bf16.128") == "ratio" and unit_of("gbps") == "GB/s"
    assert unit_of("costs.bytes_per_us_per_sm") == "bytes/µs/sm"
    assert unit_of("phases") == "no unit"
    s = R.load(str(REPO / "results" / "frame-schedule.json"))
    panels, dropped = headline_panels(s)
    assert len(panels) <= MAX_PANELS and all(len(p.cases) <= MAX_BARS for p in panels)
    units = [p.unit for p in panels]
    assert len(set(units)) == len(units) and "µs" in units and "ratio" in units
    us = next(p for p in panels if p.unit == "µs")
    assert all(k.startswith("predicted_us.") for k in list(us.cases)[:9]) and us.left_out > 0
    shown = sum(len(p.cases) + p.left_out for p in panels) + dropped
    assert shown == sum(1 for v in R.flat_headline(s).values()
                        if isinstance(v, (int, float)) and not isinstance(v, bool))


def test_headline_plot_of_frame_schedule_is_a_readable_size(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    from workbench.plots import headline_png

    s = R.load(str(REPO / "results" / "frame-schedule.json"))
    with Image.open(headline_png(s, tmp_path / "fs.png")) as img:
        width, height = img.size
    assert width <= 1400 and height <= 2000, (width, height)


def test_p0_ratio_plot_from_the_committed_summary(tmp_path):
    pytest.importorskip("matplotlib")
    from workbench.plots import p0_ratio_png

    s = R.load(str(REPO / "results" / "p0-baseline.json"))
    assert p0_ratio_png(s, tmp_path / "p0.png").read_bytes().startswith(b"\x89PNG")
    assert main(["results", "plot", "p0-baseline", "--out", str(tmp_path / "own.png")]) == 0
    assert (tmp_path / "own.png").read_bytes() == (tmp_path / "p0.png").read_bytes()
    with pytest.raises(WorkbenchError, match="no p0_over_cublas_bf16"):
        p0_ratio_png(_summary("amax"), tmp_path / "x.png")


def test_frame_timeline_plot_draws_every_cta(tmp_path):
    """The depth frame's timeline (experiments/frame_protocol.py): per CTA, its tasks as
    (type, start µs, end µs); a zero-length task still draws."""
    pytest.importorskip("matplotlib")
    from workbench.plots import frame_timeline_png

    timeline = [[("qkv", 0.0, 2.5), ("attn", 3.0, 3.0), ("o", 4.0, 6.0)],
                [("gateup", 1.0, 4.0)], []]
    out = frame_timeline_png(timeline, "synthetic", tmp_path / "t.png")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_plot_without_matplotlib_is_one_line(published, monkeypatch, capsys):
    R.write(_summary("amax"), published)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    assert main(["results", "plot", "amax", "--out", str(published / "a.png")]) == 2
    _one_line_error(capsys, "matplotlib", "[plots]")


def test_plot_needs_a_numeric_headline(published, capsys):
    pytest.importorskip("matplotlib")
    s = _summary("words")
    s["headline"] = {"status": "pass"}
    R.write(s, published)
    assert main(["results", "plot", "words", "--out", str(published / "w.png")]) == 2
    _one_line_error(capsys, "no numeric headline")


# --- wb run and wb ladder ------------------------------------------------------------------
def test_run_without_an_experiment_names_the_choices(capsys):
    assert main(["run"]) == 2
    err = _one_line_error(capsys, "usage: wb run EXPERIMENT", "amax", "p0-baseline")
    assert "rest" not in err


@pytest.mark.parametrize("name", ["p0-compile", "p0_compile"])
def test_run_takes_an_experiment_by_either_spelling(name, monkeypatch):
    import experiments.p0_compile as exp

    seen = []
    monkeypatch.setattr(exp, "main", lambda argv: seen.append(argv) or 0)
    assert main(["run", name, "--quick"]) == 0 and seen == [["--quick"]]


def _bad_results_dir(tmp_path, kind, monkeypatch) -> Path:
    if kind == "missing-parent":
        return tmp_path / "no" / "such" / "out"
    if kind == "a-file":
        (tmp_path / "out").write_text("")
        return tmp_path / "out"
    out = tmp_path / "out"  # not writable: root writes through chmod, so fail the probe itself
    out.mkdir()
    real = R.tempfile.mkstemp

    def mkstemp(*a, dir=None, **kw):
        if Path(dir) == out:
            raise PermissionError(13, "Permission denied", str(out))
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(R.tempfile, "mkstemp", mkstemp)
    return out


@pytest.mark.parametrize("kind,needle", [("missing-parent", "no such folder"),
                                         ("a-file", "not a folder"),
                                         ("not-writable", "not writable")])
def test_a_bad_results_dir_fails_before_any_work(published, tmp_path, kind, needle,
                                                   monkeypatch, capsys):
    import experiments.p0_compile as exp
    from experiments._common import run_main
    from validators import runner

    work = []
    monkeypatch.setattr(exp, "_main", lambda argv: work.append(argv) or 0)
    monkeypatch.setattr(runner, "run_ladder", lambda **kw: work.append(kw) or 0)
    bad = _bad_results_dir(tmp_path, kind, monkeypatch)
    monkeypatch.setenv("WB_RESULTS_DIR", str(bad))
    for argv in (["run", "p0-compile"], ["ladder", "--phase", "p0"]):
        assert main(argv) == 2, argv
        _one_line_error(capsys, f"WB_RESULTS_DIR={bad}", needle)
    monkeypatch.delenv("WB_RESULTS_DIR")
    assert run_main(exp._main, ["--results-dir", str(bad)]) == 2
    assert needle in capsys.readouterr().err
    assert work == []


def test_a_missing_results_dir_is_made_when_its_parent_exists(published, tmp_path, monkeypatch):
    import experiments.p0_compile as exp

    work = []
    monkeypatch.setattr(exp, "_main", lambda argv: work.append(argv) or 0)
    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path / "out"))
    assert main(["run", "p0-compile"]) == 0 and work == [[]]
    assert (tmp_path / "out").is_dir() and not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("phase", ["frame"])
def test_ladder_phase_that_runs_no_rung_fails_with_its_reason(phase, published, capsys):
    assert main(["ladder", "--phase", phase]) == 2
    _one_line_error(capsys, f"ladder {phase} ran no rung", "not built yet")
    assert not list(published.rglob("*.json"))


def _fake_ladder(monkeypatch, statuses, gpu_steps_missing=()):
    from validators import runner
    from validators.base import RungResult

    steps = [lambda r=r, st=st, i=i: RungResult(r, f"step{i}", st, f"{st} detail")
             for i, (r, st) in enumerate(statuses)]
    monkeypatch.setattr(runner, "_rungs", lambda phase, quick, device: iter(steps))
    monkeypatch.setattr(runner, "_device_steps_not_run", lambda device: list(gpu_steps_missing))
    return runner


def test_ladder_with_a_not_run_rung_is_incomplete_never_pass(monkeypatch, published):
    runner = _fake_ladder(monkeypatch, [(1, "pass"), (2, "pass"), (3, "not-run")])
    assert runner.run_ladder("p0") == 0
    s = R.load("ladder-p0", R.run_dir())
    assert s["verdict"] == "incomplete" and s["headline"]["status"] == "incomplete"
    assert s["headline"]["highest_rung_passed"] == 2
    assert s["notes"]["not_run"] == ["rung 3 (step2): not-run detail"]


def test_ladder_without_gpu_steps_is_incomplete(monkeypatch, published):
    runner = _fake_ladder(monkeypatch, [(1, "pass"), (2, "pass")], ["rungs 1-2 on CUDA"])
    assert runner.run_ladder("numerics") == 0
    s = R.load("ladder-numerics", R.run_dir())
    assert s["verdict"] == "incomplete" and s["headline"]["highest_rung_passed"] == 2
    _fake_ladder(monkeypatch, [(1, "pass"), (2, "pass")])
    assert runner.run_ladder("numerics") == 0
    assert R.load("ladder-numerics", R.run_dir())["verdict"] == "pass"


def test_ladder_failure_and_highest_rung_passed(monkeypatch, published, capsys):
    runner = _fake_ladder(monkeypatch, [(1, "pass"), (1, "fail")])  # rung 1 on CUDA fails
    assert runner.run_ladder("numerics") == 1
    s = R.load("ladder-numerics", R.run_dir())
    assert s["verdict"] == "partial" and s["headline"]["highest_rung_passed"] == 0
    assert "FAILED at rung 1" in capsys.readouterr().err


# --- the one writer ------------------------------------------------------------------------
def test_sweep_skinny_writes_a_summary_through_the_writer(published, capsys):
    import argparse

    sweep = pytest.importorskip("scripts.sweep_skinny")
    args = argparse.Namespace(rows=[16], splits=[0, 8], warps=[0], m_split=[0], no_pdl=False)
    rows = [{"proj": "qkv", "rows": 16, "splits": sp, "warps": 0, "m_split": 0, "us": us,
             "cublas_us": 6.0, "tbps": 1.0} for sp, us in ((0, 4.0), (8, 3.0))]
    sweep.write_summary(args, rows)
    s = R.load("skinny-sweep", R.run_dir())
    assert s["headline"] == {"best_us": {"qkv@16": 3.0}, "cublas_over_best": {"qkv@16": 2.0}}
    assert s["verdict"] == "not-run" and s["provenance"]["commit"]
    sweep.write_summary(args, rows)  # never overwritten silently
    assert len(list((R.run_dir() / "history").glob("skinny-sweep.*.json"))) == 1
    assert not (published / "skinny-sweep.json").exists()
    with pytest.raises(SystemExit, match="nothing measured"):
        sweep.write_summary(args, [])


def test_records_carry_provenance_and_keep_history(published):
    path = R.write_record("draw-trace-64", {"rows": 64, "launches": [1, 2]})
    rec = json.loads(path.read_text())
    assert R.validate_record(rec) == [] and rec["record"] == "draw-trace-64"
    R.write_record("draw-trace-64", {"rows": 64})
    assert len(list((path.parent / "history").glob("draw-trace-64.*.json"))) == 1
    with pytest.raises(WorkbenchError, match="may not use"):
        R.write_record("x", {"provenance": {}})
