"""One schema and one writer for every results/*.json summary.

A summary is a JSON object::

    {
      "schema": 1,
      "name": "amax",                      # file stem: results/<name>.json
      "provenance": {commit, dirty, utc, command, host, python, torch, cuda, cute_dsl,
                     gpu ("none" or {name, compute_capability, sm_count, driver, ...}),
                     compile_target, seeds},
      "parameters": {...},                 # what was run
      "measurements": [...],               # one row per case, free-form objects
      "headline": {...},                   # the figures that judge the experiment
      "gates": {name: {"pass": bool, "detail": str}},
      "verdict": "pass" | "fail" | "partial" | "not-run",
      "notes": {"prediction": str, "outcome": str, ...}   # optional
    }

Writes are atomic (temp file + rename). An existing summary is never overwritten silently: it is
moved to ``results/history/<name>.<utc>.json`` first, and the writer says so.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from workbench import WorkbenchError

SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent
VERDICTS = ("pass", "fail", "partial", "not-run")
PROVENANCE_KEYS = (
    "commit", "dirty", "utc", "command", "host", "python", "torch", "cuda", "cute_dsl", "gpu",
    "compile_target", "seeds",
)
TOP_KEYS = ("schema", "name", "provenance", "parameters", "measurements", "headline", "gates",
            "verdict")


def results_dir() -> Path:
    """``$WB_RESULTS_DIR`` if set (e.g. $OUT on the GPU host), else the repo's results/."""
    return Path(os.environ.get("WB_RESULTS_DIR", REPO_ROOT / "results"))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> tuple[str, bool]:
    """(commit, dirty). A GPU host without .git gets them from WB_GIT_COMMIT / WB_GIT_DIRTY."""
    env_commit = os.environ.get("WB_GIT_COMMIT")
    if env_commit:
        return env_commit, os.environ.get("WB_GIT_DIRTY", "0") not in ("0", "", "false")
    commit = _git("rev-parse", "HEAD") or "unknown"
    status = _git("status", "--porcelain", "--untracked-files=normal") or ""
    # summaries being written are not code: only changes elsewhere make the run "dirty"
    dirty = [ln for ln in status.splitlines() if not ln[3:].startswith("results/")]
    return commit, bool(dirty)


def provenance(seeds: dict | None = None) -> dict:
    """Provenance block: commit, time, command line, machine and versions, seeds."""
    from workbench.env import environment

    commit, dirty = git_state()
    prov = {
        "commit": commit,
        "dirty": dirty,
        "utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        **environment(),
        "seeds": seeds or {},
    }
    return prov


def provenance_line(seeds: dict | None = None) -> str:
    """:func:`provenance` as one log line ("# provenance {json}"), for scripts whose output is
    a log rather than a summary (scripts/ab_frame.py, trace_skinny.py)."""
    return "# provenance " + json.dumps(provenance(seeds), default=str)


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
    prov = summary["provenance"]
    if not isinstance(prov, dict):
        errs.append("provenance is not an object")
    else:
        for k in PROVENANCE_KEYS:
            if k not in prov:
                errs.append(f"provenance lacks '{k}'")
        gpu = prov.get("gpu")
        if gpu != "none" and not (isinstance(gpu, dict) and "name" in gpu):
            errs.append("provenance.gpu must be 'none' or an object with a name")
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


def make_summary(name: str, *, parameters: dict, measurements: list, headline: dict,
                 gates: dict, seeds: dict | None = None, notes: dict | None = None) -> dict:
    """Assemble a summary; the verdict follows from the gates (no gates: 'not-run')."""
    if not gates:
        verdict = "not-run"
    elif all(g["pass"] for g in gates.values()):
        verdict = "pass"
    elif any(g["pass"] for g in gates.values()):
        verdict = "partial"
    else:
        verdict = "fail"
    summary = {
        "schema": SCHEMA_VERSION,
        "name": name,
        "provenance": provenance(seeds),
        "parameters": parameters,
        "measurements": measurements,
        "headline": headline,
        "gates": gates,
        "verdict": verdict,
    }
    if notes:
        summary["notes"] = notes
    return summary


def gate(passed: bool, detail: str) -> dict:
    return {"pass": bool(passed), "detail": detail}


def write(summary: dict, directory: Path | None = None) -> Path:
    """Validate and atomically write ``<dir>/<name>.json``; an older file moves to history/."""
    errs = validate(summary)
    if errs:
        raise WorkbenchError(f"summary '{summary.get('name')}' is invalid: {'; '.join(errs)}")
    directory = Path(directory) if directory is not None else results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{summary['name']}.json"
    if path.exists():
        hist = directory / "history"
        hist.mkdir(exist_ok=True)
        try:
            old_utc = json.loads(path.read_text())["provenance"]["utc"]
        except Exception:
            old_utc = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        kept = hist / f"{summary['name']}.{old_utc.replace(':', '')}.json"
        os.replace(path, kept)
        print(f"results: previous {path.name} kept as {kept.relative_to(directory)}",
              file=sys.stderr)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{summary['name']}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(summary, f, indent=1, sort_keys=False, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)
    return path


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load(name_or_path: str, directory: Path | None = None) -> dict:
    """Load and validate a summary by name (``amax``) or path; WorkbenchError on any problem."""
    p = Path(name_or_path)
    if not p.suffix:
        p = (Path(directory) if directory else results_dir()) / f"{name_or_path}.json"
    if not p.exists():
        raise WorkbenchError(f"no results summary '{name_or_path}' (looked for {p})")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise WorkbenchError(f"{p} is not valid JSON: {e}") from None
    errs = validate(data)
    if errs:
        raise WorkbenchError(f"{p} does not match the results schema: {'; '.join(errs)}")
    return data


def list_summaries(directory: Path | None = None) -> list[Path]:
    d = Path(directory) if directory else results_dir()
    return sorted(d.glob("*.json")) if d.exists() else []


def _flatten(obj, prefix=""):
    """Nested headline dicts as dotted keys: {"a": {"b": 1}} -> ("a.b", 1)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), obj


def flat_headline(summary: dict) -> dict:
    return dict(_flatten(summary["headline"]))


def format_table(rows: list[list], header: list[str]) -> str:
    """Plain fixed-width table."""
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
