"""One schema and one writer for every results summary, and where runs write them.

A summary is a JSON object::

    {
      "schema": 1,
      "name": "amax",                      # file stem: <folder>/<name>.json
      "provenance": {commit, dirty, utc, command, host, python, torch, cuda, cute_dsl,
                     gpu ("none" or {name, compute_capability, sm_count, driver, ...}),
                     compile_target, seeds},
      "parameters": {...},                 # what was run
      "measurements": [...],               # one row per case, free-form objects
      "headline": {...},                   # the figures that judge the experiment
      "gates": {name: {"pass": bool, "detail": str}},
      "verdict": "pass" | "fail" | "partial" | "incomplete" | "not-run",
      "notes": {"prediction": str, "outcome": str, "not_run": [str],
                "quick": str, "forced": str, ...}   # optional
    }

A quick run (``--quick``: fewer cases) records ``parameters["quick"] = true`` and, where it
says which subset it ran, ``notes["quick"]`` ("3 of 9 variants"). Its ``verdict`` stays one of
VERDICTS (the gates imply it), but wherever a verdict is shown it is :func:`verdict_text`:
"pass (quick: 3 of 9 variants)", with "dirty" added for a run of uncommitted code.

Where things go: a run writes into its run folder (``results/runs/<utc>-<host>/``, git-ignored),
or into ``$WB_RESULTS_DIR`` when set (``$OUT`` on the GPU host; :func:`check_results_dir`
checks it before a run starts). The committed summaries in ``results/`` (the *published* ones)
change only through :mod:`workbench.publish`.

Writes are atomic (temp file + rename). An existing file is never overwritten silently: it is
moved to ``<folder>/history/<name>.<utc>.json`` first, and the writer says so.
"""
from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from workbench import WorkbenchError

SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent
VERDICTS = ("pass", "fail", "partial", "incomplete", "not-run")
PROVENANCE_KEYS = (
    "commit", "dirty", "utc", "command", "host", "python", "torch", "cuda", "cute_dsl", "gpu",
    "compile_target", "seeds",
)
TOP_KEYS = ("schema", "name", "provenance", "parameters", "measurements", "headline", "gates",
            "verdict")
# changes under results/ are outputs, not code: they never make a run "dirty"
OUTPUT_DIR = "results/"
_RUN_DIRS: dict[Path, Path] = {}
# set while an experiment runs with --quick (quick_run); make_summary reads it
_QUICK_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("wb_quick_run", default=False)


def _utc_now(fmt: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime(fmt)


def published_dir() -> Path:
    """The published summaries: the repo's results/ (``$WB_PUBLISHED_DIR`` overrides, for
    tests and for a second checkout)."""
    return Path(os.environ.get("WB_PUBLISHED_DIR") or REPO_ROOT / "results")


def run_dir() -> Path:
    """This process's run folder, ``<published>/runs/<utc>-<host>/`` (named once, made on the
    first write)."""
    root = published_dir()
    if root not in _RUN_DIRS:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", platform.node()) or "host"
        _RUN_DIRS[root] = root / "runs" / f"{_utc_now('%Y%m%dT%H%M%SZ')}-{host}"
    return _RUN_DIRS[root]


def results_dir() -> Path:
    """Where a run writes: ``$WB_RESULTS_DIR`` if set (e.g. $OUT on the GPU host), else its
    run folder; never the published results/ directly."""
    env = os.environ.get("WB_RESULTS_DIR")
    return Path(env) if env else run_dir()


def check_results_dir(directory: str | Path | None = None) -> Path | None:
    """Check where a run will write before it does any work: ``directory`` (an experiment's
    --results-dir), else ``$WB_RESULTS_DIR``; None when neither is given (the run folder is
    made on the first write). It must be a writable folder; a missing one is created when its
    parent folder exists (``$OUT/run1`` works), and refused otherwise, since a typo two
    levels up is likelier than a wish for a new tree. WorkbenchError names the problem."""
    label = "--results-dir" if directory is not None else "WB_RESULTS_DIR"
    directory = directory if directory is not None else os.environ.get("WB_RESULTS_DIR")
    if not directory:
        return None
    path = Path(directory)
    where = f"{label}={directory}"
    if path.exists() and not path.is_dir():
        raise WorkbenchError(f"{where}: not a folder")
    if not path.exists():
        if not path.parent.is_dir():
            raise WorkbenchError(f"{where}: no such folder, and its parent {path.parent} is "
                                 "not a folder either")
        try:
            path.mkdir()
        except OSError as e:
            raise WorkbenchError(f"{where}: cannot be created ({e.strerror or e})") from None
    try:  # the one honest test of writability (root passes os.access on a read-only mount)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".wb-write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise WorkbenchError(f"{where}: not writable ({e.strerror or e})") from None
    return path


def latest_run() -> Path:
    """``--run latest``: ``$WB_RESULTS_DIR`` when set (where the last run wrote), else the
    newest folder under ``<published>/runs/`` that holds a summary (a folder left with only a
    log or a plot is not a run to read)."""
    env = os.environ.get("WB_RESULTS_DIR")
    if env:
        if not Path(env).is_dir():
            raise WorkbenchError(f"--run latest is WB_RESULTS_DIR={env}, which is not a folder")
        return Path(env)
    runs = published_dir() / "runs"
    found = sorted(p for p in runs.iterdir() if p.is_dir() and list_summaries(p)) \
        if runs.is_dir() else []
    if not found:
        raise WorkbenchError(f"no run folders with a summary under {runs}")
    return found[-1]


def _git(repo: Path, *args: str) -> str | None:
    """Raw stdout of ``git args`` in ``repo`` (not stripped: porcelain columns matter)."""
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def changed_paths(porcelain_z: str) -> list[str]:
    """Paths in ``git status --porcelain -z`` output: 'XY path' entries, NUL-separated; a
    rename or copy is followed by its source path, which is listed too."""
    entries = porcelain_z.split("\0")
    paths, i = [], 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.append(entry[3:])
        if entry[0] in "RC" and i < len(entries):
            paths.append(entries[i])
            i += 1
    return paths


def git_state(repo: Path | None = None) -> tuple[str, bool]:
    """(commit, dirty) of ``repo`` (default: this checkout).

    Dirty means the code that ran may differ from the commit: a tracked file modified, staged,
    deleted or renamed, or an untracked file git does not ignore, anywhere but results/
    (outputs; results/runs/ is ignored anyway). Without git the state is unknown: dirty. A GPU
    host without .git gets both from WB_GIT_COMMIT / WB_GIT_DIRTY.
    """
    env_commit = os.environ.get("WB_GIT_COMMIT")
    if env_commit:
        return env_commit, os.environ.get("WB_GIT_DIRTY", "0") not in ("0", "", "false")
    repo = Path(repo) if repo is not None else REPO_ROOT
    commit = (_git(repo, "rev-parse", "HEAD") or "").strip() or "unknown"
    prefix = (_git(repo, "rev-parse", "--show-prefix") or "").strip()
    status = _git(repo, "status", "--porcelain", "-z", "--untracked-files=normal")
    if status is None:
        return commit, True
    outputs = prefix + OUTPUT_DIR
    return commit, any(not p.startswith(outputs) for p in changed_paths(status))


def provenance(seeds: dict | None = None, command: str | None = None) -> dict:
    """Provenance block: commit, time, command line (default: this process's), machine and
    versions, seeds."""
    from workbench.env import environment  # here: env imports torch, which `wb results` never needs

    commit, dirty = git_state()
    return {
        "commit": commit,
        "dirty": dirty,
        "utc": _utc_now(),
        "command": command if command is not None else shlex.join(sys.argv),
        **environment(),
        "seeds": seeds or {},
    }


def machine_class(prov: dict) -> str:
    """What a summary (or a provenance block) was measured on: the GPU's name, or "none"."""
    prov = prov.get("provenance", prov)
    gpu = prov.get("gpu", prov.get("device", "none"))
    return gpu.get("name", "unknown") if isinstance(gpu, dict) else str(gpu)


def provenance_line(seeds: dict | None = None, command: str | None = None,
                    prov: dict | None = None) -> str:
    """One log line "# provenance {json}": :func:`provenance` (or ``prov``) plus "device" (its
    machine class), ``command`` naming what produced the lines that follow. Every log under
    results/logs/ starts with one (workbench.logs reads it back)."""
    block = dict(prov) if prov is not None else provenance(seeds)
    if command is not None:
        block["command"] = command
    block["device"] = machine_class(block)
    return "# provenance " + json.dumps(block, default=str)


def validate(summary: object) -> list[str]:
    """Problems with a summary against the schema; empty when valid."""
    errs: list[str] = []
    if not isinstance(summary, dict):
        return ["top level is not an object"]
    for k in TOP_KEYS:
        if k not in summary:
            errs.append(f"missing key '{k}'")
    if errs:
        return errs
    if summary["schema"] != SCHEMA_VERSION:
        errs.append(f"schema {summary['schema']!r} is not {SCHEMA_VERSION}")
    if not isinstance(summary["name"], str) or not summary["name"]:
        errs.append("name must be a non-empty string")
    errs += _provenance_problems(summary["provenance"])
    for k, typ in (("parameters", dict), ("measurements", list), ("headline", dict),
                   ("gates", dict)):
        if not isinstance(summary[k], typ):
            errs.append(f"{k} must be a {typ.__name__}")
    if isinstance(summary["headline"], dict) and not summary["headline"]:
        errs.append("headline is empty")
    if isinstance(summary["gates"], dict):
        for g, v in summary["gates"].items():
            if not (isinstance(v, dict) and isinstance(v.get("pass"), bool)):
                errs.append(f"gate '{g}' must be an object with a boolean 'pass'")
    if summary["verdict"] not in VERDICTS:
        errs.append(f"verdict {summary['verdict']!r} not in {VERDICTS}")
    return errs


def _provenance_problems(prov: object) -> list[str]:
    if not isinstance(prov, dict):
        return ["provenance is not an object"]
    errs = [f"provenance lacks '{k}'" for k in PROVENANCE_KEYS if k not in prov]
    gpu = prov.get("gpu")
    if gpu != "none" and not (isinstance(gpu, dict) and "name" in gpu):
        errs.append("provenance.gpu must be 'none' or an object with a name")
    return errs


def validate_record(record: object) -> list[str]:
    """Problems with a record (a trace, sweep or profile a script keeps beside its log): an
    object with a full provenance block; empty when valid."""
    if not isinstance(record, dict):
        return ["top level is not an object"]
    if "provenance" not in record:
        return ["no provenance block"]
    return _provenance_problems(record["provenance"])


def expected_verdict(gates: dict, not_run: list | None = None) -> str:
    """The verdict that follows from the gates: none at all is 'not-run'; any failing gate is
    'fail' (all) or 'partial' (some); all passing beside a part that did not run (``not_run``)
    is 'incomplete', never 'pass'."""
    if not gates:
        return "not-run"
    passed = [g["pass"] for g in gates.values()]
    if not all(passed):
        return "partial" if any(passed) else "fail"
    return "incomplete" if not_run else "pass"


@contextlib.contextmanager
def quick_run(active: bool = True):
    """While active, every summary made is marked quick (experiments' run_main sets it from
    --quick, so an experiment that forgets to record it cannot pass for a full run)."""
    token = _QUICK_RUN.set(bool(active))
    try:
        yield
    finally:
        _QUICK_RUN.reset(token)


def make_summary(name: str, *, parameters: dict, measurements: list, headline: dict,
                 gates: dict, seeds: dict | None = None, notes: dict | None = None,
                 not_run: list[str] | None = None, quick: str | bool | None = None) -> dict:
    """Assemble a summary; the verdict follows from the gates and ``not_run`` (the parts that
    could not run, each with its reason; kept in notes["not_run"]). ``quick``: the subset a
    quick run ran ("3 of 9 variants", kept in notes["quick"]), or True when it says no more;
    inside :func:`quick_run` a summary is quick even without it."""
    notes = dict(notes or {})
    if not_run:
        notes["not_run"] = list(not_run)
    if quick or _QUICK_RUN.get():
        parameters = {**parameters, "quick": True}
        if isinstance(quick, str) and quick:
            notes["quick"] = quick
    summary = {
        "schema": SCHEMA_VERSION,
        "name": name,
        "provenance": provenance(seeds),
        "parameters": parameters,
        "measurements": measurements,
        "headline": headline,
        "gates": gates,
        "verdict": expected_verdict(gates, not_run),
    }
    if notes:
        summary["notes"] = notes
    return summary


def gate(passed: bool, detail: str) -> dict:
    return {"pass": bool(passed), "detail": detail}


def quick_scope(summary: dict) -> str | None:
    """None for a full run; for a quick one the subset it ran ("3 of 9 variants"), or ""
    when it does not say."""
    scope = (summary.get("notes") or {}).get("quick")
    if isinstance(scope, str) and scope:
        return scope
    return "" if (summary.get("parameters") or {}).get("quick") else None


def run_marks(summary: dict) -> list[str]:
    """What keeps a summary from being a full run of committed code: "quick[: subset]",
    "dirty"."""
    marks = []
    scope = quick_scope(summary)
    if scope is not None:
        marks.append(f"quick: {scope}" if scope else "quick")
    if summary.get("provenance", {}).get("dirty"):
        marks.append("dirty")
    return marks


def verdict_text(summary: dict) -> str:
    """The verdict as a person should read it: "pass", or "pass (quick: 3 of 9 variants;
    dirty)" for a quick run of uncommitted code."""
    marks = run_marks(summary)
    return summary["verdict"] + (f" ({'; '.join(marks)})" if marks else "")


def weaker_than(new: dict, old: dict) -> list[str]:
    """Why ``new`` may not silently replace ``old``: it is quick where ``old`` is full, dirty
    where ``old`` is clean (empty: it may)."""
    why = []
    scope = quick_scope(new)
    if scope is not None and quick_scope(old) is None:
        why.append(f"is a quick run ({scope or 'a subset'}) where the published one is full")
    if new["provenance"].get("dirty") and not old["provenance"].get("dirty"):
        why.append("was recorded dirty where the published one is clean")
    return why


def write(summary: dict, directory: Path | None = None) -> Path:
    """Validate and atomically write ``<dir>/<name>.json`` (default: :func:`results_dir`); an
    older file moves to history/."""
    errs = validate(summary)
    if errs:
        raise WorkbenchError(f"summary '{summary.get('name')}' is invalid: {'; '.join(errs)}")
    return write_json(summary["name"], summary, directory)


def write_record(name: str, payload: dict, directory: Path | None = None,
                 seeds: dict | None = None) -> Path:
    """Write a record (trace, sweep, profile: not a summary) as ``<dir>/<name>.json`` with a
    provenance block, through the same writer (atomic, older file kept in history/)."""
    clash = {"provenance", "record"} & set(payload)
    if clash:
        raise WorkbenchError(f"record '{name}': payload may not use the keys {sorted(clash)}")
    return write_json(name, {"record": name, "provenance": provenance(seeds), **payload},
                      directory)


def write_json(name: str, obj: dict, directory: Path | None = None) -> Path:
    """Atomically write ``obj`` to ``<dir>/<name>.json``; an existing file first moves to
    ``<dir>/history/<name>.<its utc>.json``."""
    directory = Path(directory) if directory is not None else results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    if path.exists():
        kept = keep_in_history(path, directory / "history")
        print(f"results: previous {path.name} kept as {kept.relative_to(directory)}",
              file=sys.stderr)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)
    return path


def keep_in_history(path: Path, history: Path) -> Path:
    """Move ``path`` to ``history/<stem>.<its provenance utc, or now><suffix>``; never over
    an older kept file."""
    history.mkdir(parents=True, exist_ok=True)
    try:
        utc = json.loads(path.read_text())["provenance"]["utc"]
    except (OSError, ValueError, KeyError, TypeError):  # binary or not ours: named by now
        utc = _utc_now()
    stem = f"{path.stem}.{str(utc).replace(':', '')}"
    kept, n = history / f"{stem}{path.suffix}", 1
    while kept.exists():
        kept, n = history / f"{stem}.{n}{path.suffix}", n + 1
    os.replace(path, kept)
    return kept


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: Path) -> object:
    """Parsed JSON of a file; WorkbenchError (one line) when it is missing, not a file,
    unreadable, not UTF-8 or not JSON."""
    path = Path(path)
    if not path.exists():
        raise WorkbenchError(f"{path}: no such file")
    if not path.is_file():
        raise WorkbenchError(f"{path}: not a file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise WorkbenchError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise WorkbenchError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkbenchError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def summary_path(name_or_path: str, directory: Path | None = None) -> Path:
    """A path (it names a .json file or a folder) as given; a bare name as
    ``<directory or published>/<name>.json``."""
    if name_or_path.endswith(".json") or os.sep in name_or_path or "/" in name_or_path:
        return Path(name_or_path)
    return (Path(directory) if directory else published_dir()) / f"{name_or_path}.json"


def load(name_or_path: str, directory: Path | None = None) -> dict:
    """Load and validate a summary by name (``amax``: the published one, or the one in
    ``directory``) or by path; WorkbenchError on any problem."""
    p = summary_path(str(name_or_path), directory)
    if not p.exists():
        raise WorkbenchError(f"no results summary '{name_or_path}' (looked for {p})")
    data = read_json(p)
    errs = validate(data)
    if errs:
        raise WorkbenchError(f"{p} does not match the results schema: {'; '.join(errs)}")
    return data


def list_summaries(directory: Path | None = None) -> list[Path]:
    """Every ``*.json`` entry of a folder (default: the published one), files or not: callers
    report the ones that are not readable summaries."""
    d = Path(directory) if directory else published_dir()
    return sorted(p for p in d.glob("*.json") if not p.name.startswith(".")) if d.is_dir() \
        else []


def _flatten(obj, prefix=""):
    """Nested headline dicts as dotted keys: {"a": {"b": 1}} -> ("a.b", 1)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), obj


def flat_headline(summary: dict) -> dict:
    return dict(_flatten(summary["headline"]))


TABLE_WIDTH = 120  # columns a table may take: fits a terminal beside an editor
MIN_LAST = 16  # the last column never shrinks below this


def clip(text: str, width: int, middle: bool = False) -> str:
    """``text`` cut to ``width`` characters, '…' marking the cut (in the middle: keeps a dotted
    key's start and its distinguishing end)."""
    if len(text) <= width:
        return text
    if middle and width > 8:
        head = (width - 1) // 2
        return text[:head] + "…" + text[len(text) - (width - 1 - head):]
    return text[:max(width - 1, 0)] + "…"


def format_table(rows: list[list], header: list[str], *, width: int = TABLE_WIDTH,
                 max_cell: int | list[int] = 48, wrap_last: bool = False) -> str:
    """Fixed-width table at most ``width`` columns, no trailing spaces. Every column but the
    last is at most ``max_cell`` wide (one value, or one per column; the first column is cut
    in the middle, the others at the end); the last takes what is left, cut, or with
    ``wrap_last`` continued on lines indented to it."""
    cells = [[fmt(c).replace("\n", " ") for c in r] for r in rows]
    n = len(header)
    caps = max_cell if isinstance(max_cell, list) else [max_cell] * n
    widths = [min(max([len(header[i])] + [len(r[i]) for r in cells]), caps[i])
              for i in range(n - 1)]
    while widths and sum(widths) + 2 * len(widths) + MIN_LAST > width and max(widths) > 8:
        widths[widths.index(max(widths))] -= 1  # the widest leading column gives way first
    lead = sum(widths) + 2 * len(widths)
    last = max(width - lead, MIN_LAST)

    def line(row: list[str]) -> list[str]:
        parts = [clip(c, w, middle=(i == 0)).ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        tail = row[-1]
        if not wrap_last or len(tail) <= last:
            return ["  ".join(parts + [clip(tail, last)]).rstrip()]
        pieces = textwrap.wrap(tail, last) or [""]
        return ["  ".join(parts + [pieces[0]]).rstrip()] + [" " * lead + p for p in pieces[1:]]

    out = line(list(header)) + ["  ".join("-" * w for w in widths + [min(
        last, max([len(header[-1])] + [len(r[-1]) for r in cells]))])]
    for r in cells:
        out += line(r)
    return "\n".join(out)


def wrap(text: str, width: int = TABLE_WIDTH, indent: str = "  ") -> str:
    """A paragraph within ``width`` columns, continuation lines indented."""
    return "\n".join(textwrap.wrap(text, width, subsequent_indent=indent,  # paths stay whole
                                   break_long_words=False, break_on_hyphens=False)) or text


def fmt(v) -> str:
    """A table cell: floats to 4 significant digits."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
