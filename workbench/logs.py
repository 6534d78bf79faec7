"""Logs with provenance: the first line a log starts with, and reading it back.

Every file under results/logs/ says in its first lines which commit ran on which device: a log
starts with ``# provenance {json}`` (:func:`log_header`, ``wb log-header COMMAND``), a record
(.json) carries a ``provenance`` object. Older device scripts wrote free-form comment lines
("# H200 (device call, ...), commit <sha>, ..."), which count when a commit and a device are
both named. Files that name neither live in results/logs/unverified/.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from workbench import WorkbenchError
from workbench import results as R

HEAD_LINES = 3  # a correction note may precede the provenance line
HEADER = "# provenance "
_SHA = r"[0-9a-f]{7,40}"
_FREE_COMMIT = re.compile(rf"\bcommit\s+({_SHA})\b")
_FREE_DEVICE = re.compile(r"\b(NVIDIA [A-Za-z0-9 ]+?|[HB]\d00|A100|L40S?|RTX \d{4})\b")


def log_header(command: str, prov: dict | None = None) -> str:
    """The first line of a log: commit, dirty, device, command and versions of this process
    (or of ``prov``, e.g. a run's summaries), ``command`` naming what wrote the lines below."""
    return R.provenance_line(command=command, prov=prov)


def _from_header_json(line: str) -> dict:
    try:
        block = json.loads(line[len(HEADER):])
    except json.JSONDecodeError:
        return {}
    if not isinstance(block, dict):
        return {}
    found = {}
    if isinstance(block.get("commit"), str) and re.fullmatch(_SHA, block["commit"]):
        found["commit"] = block["commit"]
    if "device" in block or "gpu" in block:
        found["device"] = R.machine_class(block)
    return found


def _from_free_text(line: str) -> dict:
    found = {}
    if m := _FREE_COMMIT.search(line):
        found["commit"] = m.group(1)
    if m := _FREE_DEVICE.search(line):
        found["device"] = m.group(1)
    return found


def text_provenance(text: str) -> dict | None:
    """{"commit", "device"} named by the comment lines among a log's first HEAD_LINES lines
    (the first commit and the first device named win), or None when either is missing."""
    found: dict = {}
    for line in text.splitlines()[:HEAD_LINES]:
        if not line.startswith("#"):
            continue
        named = _from_header_json(line) if line.startswith(HEADER) else _from_free_text(line)
        for k, v in named.items():
            found.setdefault(k, v)
    return found if {"commit", "device"} <= set(found) else None


def record_provenance(data: object) -> dict | None:
    """{"commit", "device"} of a JSON record's provenance object (older records: top-level
    "commit" and "device" keys), or None."""
    if not isinstance(data, dict):
        return None
    prov = data.get("provenance", data)
    if not isinstance(prov, dict):
        return None
    named = _from_header_json(HEADER + json.dumps(prov))
    return named if {"commit", "device"} <= set(named) else None


def read_text(path: Path) -> str:
    """A log's text; WorkbenchError (one line) when it is not a readable UTF-8 file."""
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"{path}: {'not a file' if path.exists() else 'no such file'}")
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as e:
        raise WorkbenchError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise WorkbenchError(f"{path}: not UTF-8 text (byte {e.start})") from None


def file_provenance(path: Path) -> dict | None:
    """What a file under results/logs/ says about its origin: a record's provenance object
    (.json) or its log's first lines; None when it names no commit and device."""
    path = Path(path)
    if path.suffix == ".json":
        try:
            return record_provenance(R.read_json(path))
        except WorkbenchError:
            return None
    try:
        return text_provenance(read_text(path))
    except WorkbenchError:
        return None


def unverified(logs_dir: Path) -> list[Path]:
    """The files directly in ``logs_dir`` that name no commit and device."""
    return sorted(p for p in Path(logs_dir).iterdir()
                  if p.is_file() and p.name != "README.md" and file_provenance(p) is None)
