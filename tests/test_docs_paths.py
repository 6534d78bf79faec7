"""The README and notes/ against the tree: every results/ path they cite exists, and what the
README says about the layout, the experiments, CI and the tests is what is there."""
from __future__ import annotations

import glob
import itertools
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "notes").glob("*.md"))]
# a results/ path as the docs write it; globs (*) and brace lists ({json,log}) allowed
RESULTS_PATH = re.compile(r"results/[\w.*{},/<>-]*[\w*}/]")
# cited but made by runs, never committed (git-ignored) or placeholders for any name
NOT_COMMITTED = ("results/runs/",)
# notes another engineer keeps; their stale citations are theirs to fix (strict: once they
# are fixed the xfail fails, and the entry goes)
STALE_ELSEWHERE: dict[str, str] = {}  # doc name -> why its citations may not all exist yet


def _expand(path: str) -> list[str]:
    """``a.{json,log}`` -> [``a.json``, ``a.log``] (any number of brace lists)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def cited_results_paths(text: str) -> list[str]:
    paths = []
    for m in RESULTS_PATH.finditer(text):
        path = m.group(0).rstrip(".")
        if "<" in path or path.startswith(NOT_COMMITTED):
            continue
        paths += _expand(path)
    return paths


def missing_paths(doc: Path) -> list[str]:
    return sorted({p for p in cited_results_paths(doc.read_text())
                   if not (glob.glob(str(REPO / p)) if "*" in p else (REPO / p).exists())})


def test_the_citation_reader_sees_globs_braces_and_placeholders():
    text = ("see `results/logs/5ea022f-p0-v2-ab.{json,log}`, results/logs/ad1357c-* and "
            "`results/<name>.json`; runs go to results/runs/<utc>-<host>/.")
    assert cited_results_paths(text) == ["results/logs/5ea022f-p0-v2-ab.json",
                                         "results/logs/5ea022f-p0-v2-ab.log",
                                         "results/logs/ad1357c-*"]


@pytest.mark.parametrize("doc", [
    pytest.param(d, marks=pytest.mark.xfail(reason=STALE_ELSEWHERE[d.name], strict=True))
    if d.name in STALE_ELSEWHERE else d for d in DOCS], ids=lambda d: d.name)
def test_every_results_path_cited_exists(doc):
    assert missing_paths(doc) == [], f"{doc.name} cites results/ paths that do not exist"


# --- the README against the tree -----------------------------------------------------------
def _readme() -> str:
    return README.read_text()


def _layout_floors() -> dict[str, int]:
    """{folder: floor} from the README's layout block: '# floor N: a/  b/' and '# ground: ...'."""
    floors = {}
    for m in re.finditer(r"^# (floor (\d)|ground): (.+)$", _readme(), re.M):
        for folder in m.group(3).split():
            floors[folder.rstrip("/")] = int(m.group(2) or 1)
    return floors


def test_readme_layout_gives_every_package_its_floor_and_says_the_rule():
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} | {"scripts"}
    floors = _layout_floors()
    assert set(floors) == packages
    assert {"device", "configs", "cli"} <= set(floors) and floors["cli"] > floors["experiments"]
    assert "a folder imports only folders on its own floor or below" in _readme()
    block = _readme().split("## Layout", 1)[1].split("```")[1]
    described = set(re.findall(r"^([a-z_]+)/ {2,}\S", block, re.M))
    assert packages <= described, packages - described
    try:
        from test_layout_floors import FLOORS  # the test that checks the rule on the code
    except ImportError:
        pytest.skip("tests/test_layout_floors.py is not here")
    assert floors == FLOORS


def test_readme_lists_every_experiment_and_each_runs_by_its_names():
    from cli.main import _experiment_names

    table = _readme().split("| experiment | what it measures | GPU |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([\w-]+)` \|", table, re.M)
    assert sorted(listed) == _experiment_names()
    for name in re.findall(r"python3? -m experiments\.([\w<>-]+)", _readme()):
        if name != "<name>":
            assert (REPO / "experiments" / f"{name}.py").is_file(), name
    assert "python3 -m experiments.<name>` with underscores" in _readme()


def test_readme_says_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    setup = _readme().split("## Set up a fresh machine", 1)[1].split("```")[1]
    sentence = next(s for s in _readme().split(". ") if "`.ci/run`" in s)
    assert "bash scripts/bootstrap.sh" in ci and "pytest -q" in ci
    assert "bootstrap.sh" in sentence and "tests" in sentence
    if "wb ladder" in setup and "wb ladder" not in ci:
        assert "does not run `wb ladder`" in sentence


@pytest.mark.parametrize("claim,test", [
    ("validates every committed summary", "test_committed_results_match_the_schema"),
    ("names its", "test_every_committed_log_names_its_commit_and_device"),
    ("cite exists", "test_every_results_path_cited_exists"),
])
def test_readme_names_the_test_file_that_checks_each_claim(claim, test):
    section = _readme().split("## Reading results/", 1)[1].strip()
    text = " ".join(section.split("\n\n", 1)[0].split())
    clause = next(c for c in re.split(r", (?:and )?(?=`tests/)|(?<=\.) ", text) if claim in c)
    cited = re.search(r"`(tests/\w+\.py)`", clause).group(1)
    assert f"def {test}(" in (REPO / cited).read_text(), (claim, cited)


def test_readme_covers_the_depth_frame():
    text = " ".join(_readme().split())  # lines joined: the layout block wraps its text
    assert "| `depth-frame` | `experiments/depth_frame.py`" in text  # the device step
    # the results table names the published summary's commit
    commit = json.loads((REPO / "results" / "depth-frame.json").read_text())["provenance"][
        "commit"][:7]
    assert f"`depth-frame.json` ({commit}), `depth-frame.png`" in text
    assert "frame/ " in text and "host (host side: DepthFrame" in text
    assert (REPO / "kernels" / "depth" / "frame" / "__init__.py").is_file()
    for module in ("kernel", "launch", "host", "table", "projection", "attention", "embedding",
                   "weights"):
        assert (REPO / "kernels" / "depth" / "frame" / f"{module}.py").is_file()
        assert re.search(rf"\b{module}\b(?!\.py)", text), module
