"""Publish a run: the only way the committed results/ change.

``publish([run folder or files...])`` checks everything first and writes nothing when anything
is wrong (one line naming each problem). Then:

* a summary ``<name>.json`` becomes ``results/<name>.json``; the one it replaces moves to
  results/history/. A summary never replaces one measured on another machine class (the GPU's
  name, or "none"): there is no override, the published file must be removed in a commit of
  its own first. Its verdict must be the one its gates and not-run parts imply. A quick run
  never replaces a full one, nor a dirty run (uncommitted code) a clean one, unless forced
  (``--force``); a forced summary says so in ``notes["forced"]`` (what it replaced, and where
  that one was kept), which goes to history/ with it when it is replaced in turn.
* ``<name>.png`` (a plot) and ``<name>.md`` (a report, e.g. the ladder's) beside a summary
  published in the same call go beside it; the ones they replace move to results/history/.
* a record (JSON with provenance that is not a summary) and a log (``.log``/``.txt``) go to
  results/logs/<commit>-<file>. A log must start with a provenance line (commit, device); one
  without gets a header from its run folder's summaries when they agree on commit and device,
  and is refused otherwise. Files already published with the same bytes are skipped; a
  different file under the same name is refused, and so are two sources of one call that
  would land on one name.
"""
from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from workbench import WorkbenchError
from workbench import logs as L
from workbench import results as R

SUMMARY, RECORD, LOG, PLOT, REPORT, SKIP = "summary", "record", "log", "plot", "report", "skip"
SUFFIXES = (".json", ".png", ".md", ".log", ".txt")
BESIDE = (PLOT, REPORT)  # kinds that go beside their summary
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass
class Item:
    src: Path
    kind: str
    dest: Path | None = None
    data: object = None   # the summary (SUMMARY) or the bytes to write (RECORD, LOG, PLOT)
    origin: dict | None = None  # {"commit", "device"} of a record or log
    note: str = ""
    forced: list[str] | None = None  # why a summary needed --force (R.weaker_than)


def _entries(sources: list[Path], problems: list[str]) -> list[tuple[Path, Path | None]]:
    """(entry, its run folder or None) for every source: a file as given, a folder's direct
    entries (its own history/ and dot files left out)."""
    out = []
    for src in map(Path, sources):
        if src.is_dir():
            for p in sorted(src.iterdir()):
                if p.name.startswith(".") or (p.name == "history" and p.is_dir()):
                    continue
                out.append((p, src))
        elif src.exists():
            out.append((src, None))
        else:
            problems.append(f"{src}: no such file or folder")
    return out


def _classify(path: Path, in_folder: bool, problems: list[str]) -> Item | None:
    suffix = path.suffix
    if suffix not in SUFFIXES:
        if in_folder:  # other artifacts of a run (profiles, dumps) stay in the run folder
            return Item(path, SKIP, note="skipped (not a summary, record, log or plot)")
        problems.append(f"{path}: not a summary, record, log or plot ({', '.join(SUFFIXES)})")
        return None
    if not path.is_file():
        problems.append(f"{path}: not a file")
        return None
    try:
        if suffix == ".json":
            data = R.read_json(path)
            if not R.validate(data):
                return Item(path, SUMMARY, data=data)
            if isinstance(data, dict) and "schema" in data:  # meant as a summary
                problems.append(f"{path}: not a valid summary: {'; '.join(R.validate(data))}")
                return None
            origin = L.record_provenance(data)
            if origin is None:
                problems.append(f"{path}: neither a summary nor a record with provenance "
                                "(commit, device)")
                return None
            return Item(path, RECORD, data=path.read_bytes(), origin=origin)
        if suffix == ".png":
            blob = path.read_bytes()
            if not blob.startswith(PNG_MAGIC):
                problems.append(f"{path}: not a PNG image")
                return None
            return Item(path, PLOT, data=blob)
        if suffix == ".md":
            return Item(path, REPORT, data=L.read_text(path).encode())
        return Item(path, LOG, data=L.read_text(path))
    except WorkbenchError as e:
        problems.append(str(e))
    except OSError as e:
        problems.append(f"{path}: cannot be read ({e.strerror or e})")
    return None


def _unforced(summary: dict) -> dict:
    """A summary without the note publish adds when forced: what its source file holds."""
    notes = {k: v for k, v in (summary.get("notes") or {}).items() if k != "forced"}
    out = {k: v for k, v in summary.items() if k != "notes"}
    return {**out, "notes": notes} if notes else out


def _check_summary(item: Item, published: Path, problems: list[str], force: bool) -> None:
    s = item.data
    expected = R.expected_verdict(s["gates"], (s.get("notes") or {}).get("not_run"))
    if s["verdict"] != expected:
        problems.append(f"{item.src}: verdict '{s['verdict']}' contradicts its gates and "
                        f"not-run parts (they give '{expected}')")
        return
    item.dest = published / f"{s['name']}.json"
    if not item.dest.exists():
        return
    try:
        old = R.load(str(item.dest))
    except WorkbenchError as e:
        problems.append(f"published {item.dest.name} cannot be compared: {e}")
        return
    new_class, old_class = R.machine_class(s), R.machine_class(old)
    if new_class != old_class:
        problems.append(f"{item.src}: refusing to replace {item.dest} (measured on {old_class}) "
                        f"with a summary measured on {new_class}")
    elif _unforced(old) == s:
        item.note = "already published"
    elif why := R.weaker_than(s, old):
        if force:
            item.forced = why
        else:
            problems.append(f"{item.src}: refusing to replace {item.dest} with a summary that "
                            f"{' and '.join(why)} (--force publishes it anyway)")


def _check_log(item: Item, run_prov: dict | None, problems: list[str]) -> bool:
    """The log's own provenance, or a header made from its run's summaries; False: refused."""
    item.origin = L.text_provenance(item.data)
    if item.origin is not None:
        item.data = item.data.encode()
        return True
    if run_prov is None:
        problems.append(f"{item.src}: no provenance line (commit, device) in its first "
                        f"{L.HEAD_LINES} lines, and no run summaries that agree on both; "
                        "start it with `wb log-header COMMAND`")
        return False
    header = L.log_header("unknown: header added at publish from the summaries of "
                          f"{item.src.parent.name}", prov=run_prov)
    item.data = (header + "\n" + item.data).encode()
    item.origin = {"commit": run_prov["commit"], "device": R.machine_class(run_prov)}
    return True


def _run_provenance(summaries: list[Item]) -> dict | None:
    """The provenance of a run folder's summaries when they agree on commit and device."""
    provs = [s.data["provenance"] for s in summaries]
    keys = {(p["commit"], R.machine_class(p)) for p in provs}
    return provs[0] if len(keys) == 1 else None


def _logs_dest(item: Item, published: Path, problems: list[str]) -> None:
    commit = item.origin["commit"][:7]
    name = item.src.name if item.src.name.startswith(commit + "-") else f"{commit}-{item.src.name}"
    item.dest = published / "logs" / name
    if item.dest.exists():
        if item.dest.is_file() and item.dest.read_bytes() == item.data:
            item.note = "already published"
        else:
            problems.append(f"{item.src}: {item.dest} exists with other content (rename the log)")


def plan(sources: list[Path], published: Path | None = None, force: bool = False) -> list[Item]:
    """What :func:`publish` would do; WorkbenchError naming every problem when anything is
    wrong. ``force``: a quick or dirty summary may replace a full, clean one."""
    published = Path(published) if published is not None else R.published_dir()
    problems: list[str] = []
    entries = _entries(sources, problems)
    items = [(i, run) for p, run in entries
             if (i := _classify(p, run is not None, problems)) is not None]
    summaries = [i for i, _ in items if i.kind == SUMMARY]
    for s in summaries:
        _check_summary(s, published, problems, force)
    names = [s.data["name"] for s in summaries]
    problems += [f"summary '{n}' given twice" for n in sorted(set(names)) if names.count(n) > 1]
    for item, run in items:
        if item.kind == REPORT and run is not None and item.src.stem not in names:
            item.kind, item.note = SKIP, "skipped (a report without its summary in this call)"
            continue
        if item.kind in BESIDE:
            if item.src.stem not in names:
                problems.append(f"{item.src}: a {item.kind} goes beside a summary published in "
                                f"the same call, and there is no '{item.src.stem}' summary here")
            item.dest = published / item.src.name
            if item.dest.is_file() and item.dest.read_bytes() == item.data:
                item.note = "already published"
        elif item.kind == RECORD:
            _logs_dest(item, published, problems)
        elif item.kind == LOG:
            run_sums = [s for s, r in items if s.kind == SUMMARY and run is not None and r == run]
            if _check_log(item, _run_provenance(run_sums) if run_sums else None, problems):
                _logs_dest(item, published, problems)
    dests = [i.dest for i, _ in items if i.dest is not None]
    problems += [f"two sources would be published as {d.relative_to(published)} (rename one)"
                 for d in sorted(set(dests)) if dests.count(d) > 1]
    if problems:
        raise WorkbenchError("publish refused, nothing written: " + "; ".join(problems))
    if all(i.kind == SKIP for i, _ in items):
        raise WorkbenchError("publish: nothing to publish in " +
                             ", ".join(str(s) for s in sources))
    return [i for i, _ in items]


def _write_bytes(dest: Path, blob: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    os.replace(tmp, dest)


def _publish_summary(item: Item, published: Path) -> str:
    """Write a summary; the one it replaces goes to history/ first. Returns what its output
    line adds: where the replaced one went, and that it was forced."""
    summary, kept = item.data, None
    if item.dest.exists():
        kept = R.keep_in_history(item.dest, published / "history").relative_to(published)
    if item.forced:  # only ever over a published summary, so kept is set
        old = R.read_json(published / kept)["provenance"]
        summary = copy.deepcopy(summary)
        summary.setdefault("notes", {})["forced"] = (
            f"published with --force over the summary of commit {str(old['commit'])[:10]} "
            f"({old['utc']}), kept as {kept}: this one {' and '.join(item.forced)}")
    R.write(summary, published)
    if kept is None:
        return ""
    return f" ({'forced; ' if item.forced else ''}the replaced one kept as {kept})"


def publish(sources: list[Path], published: Path | None = None, force: bool = False) -> list[str]:
    """Publish run folders or files into ``published`` (default results/); one line per
    file saying what happened. ``force``: see :func:`plan`."""
    published = Path(published) if published is not None else R.published_dir()
    done = []
    for item in plan(sources, published, force):
        if item.kind == SKIP:
            done.append(f"{item.src.name}: {item.note}")
            continue
        rel = item.dest.relative_to(published)
        if item.note:
            done.append(f"{item.src.name}: {item.note} as {rel}")
            continue
        extra = ""
        if item.kind == SUMMARY:
            extra = _publish_summary(item, published)
        else:
            if item.kind in BESIDE and item.dest.exists():
                R.keep_in_history(item.dest, published / "history")
            _write_bytes(item.dest, item.data)
        done.append(f"published {item.src} -> {rel}{extra}")
    return done
