"""The on-disk state of a resumable ladder: ``<run folder>/ladder-<phase>.state/``.

A folder, so that ``wb results publish`` skips it. In it:

* ``state.json``, rewritten atomically after every completed part and at every checkpoint of
  the trajectory pass:
  - ``phase``, ``quick``, ``device``, ``commit``, ``dirty``: what the ladder runs; a resume
    must match them (one ladder is one version of the code on one kind of machine);
  - ``status``: ``running`` (a call holds it, or the last one was killed), ``paused`` (a call
    stopped at its --stop-after budget) or ``interrupted`` (a call raised);
  - ``done``: every completed part's result in order, with its wall time;
  - ``unit_seconds``: recent wall times per kind of unit (a part's id, ``pass-block``), what
    --stop-after estimates the next unit by;
  - ``pass``: the trajectory pass between two blocks (TrajectoryPass.state()) and the file of
    its tensors, or null;
  - ``calls``: each call's start, wall time, commit and how it ended (the summary keeps them).
* ``pass-<step>-<block>.pt``: the pass's tensors. A new one is written before the state.json
  that names it, and the older one removed after: a kill at any moment leaves a pair that
  matches, at worst one checkpoint behind.
* ``lock``: the host and pid of the call working on it; a second call is refused while that
  process lives.

Once the ladder's summary is written the folder is removed (the summary holds everything it
had; on the GPU host $OUT takes 8 files). Nothing is overwritten silently: a fresh ladder
refuses a folder holding a state (resume it instead), and a resume of a finished ladder says so
(:func:`finished_summary`) and changes nothing.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from validators.base import RungResult
from workbench import WorkbenchError
from workbench import results as R

STATE_VERSION = 1
RECENT = 5  # unit times kept per kind


def _utc(fmt: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime(fmt)


def state_dir(run_dir: Path, phase: str) -> Path:
    return Path(run_dir) / f"ladder-{phase}.state"


def phases_in(run_dir: Path) -> list[str]:
    """The phases with a ladder state in ``run_dir``."""
    return sorted(p.name[len("ladder-"):-len(".state")] for p in Path(run_dir).glob(
        "ladder-*.state") if (p / "state.json").is_file())


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


class LadderState:
    """One ladder's state folder. Created lazily: nothing is written until :meth:`save`."""

    def __init__(self, run_dir: Path, data: dict):
        self.run_dir = Path(run_dir)
        self.dir = state_dir(run_dir, data["phase"])
        self.data = data
        self._locked = False

    # --- opening -------------------------------------------------------------------------
    @classmethod
    def fresh(cls, run_dir: Path, phase: str, quick: bool, device: str) -> LadderState:
        """A new ladder in ``run_dir``; refuses one whose state is there (not finished)."""
        d = state_dir(run_dir, phase)
        if (d / "state.json").exists():
            old = cls._read(d)
            raise WorkbenchError(
                f"{run_dir} already holds an unfinished ladder {phase} ({old.get('status')}, "
                f"{len(old.get('done', []))} parts done): resume it with `wb ladder --phase "
                f"{phase} --resume {run_dir}`, or run elsewhere")
        commit, dirty = R.git_state()
        return cls(run_dir, {
            "kind": "ladder-state", "version": STATE_VERSION, "phase": phase, "quick": quick,
            "device": device, "commit": commit, "dirty": dirty, "started_utc": _utc(),
            "status": "running", "done": [], "unit_seconds": {}, "pass": None, "calls": []})

    @classmethod
    def resume(cls, run_dir: Path, phase: str | None, quick: bool | None,
               device: str) -> LadderState:
        """The ladder in ``run_dir`` (``phase`` None: the only one there), checked against
        this call: same quick flag when given, same device, same commit and dirtiness."""
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise WorkbenchError(f"--resume {run_dir}: no such folder")
        found = phases_in(run_dir)
        if phase is None:
            if len(found) != 1:
                raise WorkbenchError(f"--resume {run_dir}: "
                                     + (f"holds ladders {', '.join(found)}; name one with "
                                        "--phase" if found else "holds no ladder state"))
            phase = found[0]
        elif phase not in found:
            raise WorkbenchError(f"--resume {run_dir}: no ladder {phase} state there"
                                 + (f" (it holds: {', '.join(found)})" if found else ""))
        data = cls._read(state_dir(run_dir, phase))
        commit, dirty = R.git_state()
        wrong = [f"{k} {data[k]!r} there, {v!r} here" for k, v in
                 (("quick", quick), ("device", device), ("commit", commit), ("dirty", dirty))
                 if v is not None and data.get(k) != v]
        if wrong:
            raise WorkbenchError(f"--resume {run_dir}: ladder {phase} cannot continue here: "
                                 f"{'; '.join(wrong)} (start a new ladder)")
        return cls(run_dir, data)

    @staticmethod
    def _read(d: Path) -> dict:
        data = R.read_json(d / "state.json")
        if not isinstance(data, dict) or data.get("kind") != "ladder-state":
            raise WorkbenchError(f"{d / 'state.json'}: not a ladder state")
        if data.get("version") != STATE_VERSION:
            raise WorkbenchError(f"{d / 'state.json'}: state version {data.get('version')}, "
                                 f"this code reads {STATE_VERSION}")
        return data

    # --- the lock --------------------------------------------------------------------------
    def acquire(self) -> None:
        """Hold the lock for this call (making the folder first); refuse while another live
        process holds it, take it over from a dead one on this host."""
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = self.dir / "lock"
        me = {"host": platform.node(), "pid": os.getpid()}
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    holder = json.loads(lock.read_text())
                except (OSError, ValueError):
                    holder = {}
                if holder.get("host") == me["host"] and not _alive(int(holder.get("pid", 0))):
                    lock.unlink(missing_ok=True)  # its call was killed: stale
                    continue
                raise WorkbenchError(f"{self.dir} is locked by {holder or 'an unknown call'}: "
                                     "another call is working on this ladder") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._locked = True
            return
        raise WorkbenchError(f"{lock}: could not take the lock")

    def release(self) -> None:
        if self._locked:
            (self.dir / "lock").unlink(missing_ok=True)
            self._locked = False

    # --- contents --------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self.data["phase"]

    @property
    def quick(self) -> bool:
        return self.data["quick"]

    def done(self) -> list[RungResult]:
        return [RungResult.from_json(d) for d in self.data["done"]]

    def seconds(self) -> dict:
        """part label -> wall time of the done parts."""
        return {d["part"]: d.get("seconds", 0.0) for d in self.data["done"]}

    def record(self, r: RungResult, seconds: float) -> None:
        self.data["done"].append({**r.to_json(), "seconds": round(seconds, 3)})

    def unit_time(self, kind: str, seconds: float) -> None:
        recent = self.data["unit_seconds"].setdefault(kind, [])
        recent.append(round(seconds, 3))
        del recent[:-RECENT]

    def estimate(self, kind: str) -> float:
        """The longest recent time of ``kind``, 0 when none was measured."""
        return max(self.data["unit_seconds"].get(kind, [0.0]))

    def begin_call(self) -> None:
        commit, dirty = R.git_state()
        self.data["calls"].append({"started_utc": _utc(), "commit": commit,
                                   "dirty": dirty, "seconds": None, "ended": "killed"})
        self.data["status"] = "running"
        self._t0 = time.monotonic()

    def end_call(self, how: str, status: str) -> None:
        call = self.data["calls"][-1]
        call["seconds"], call["ended"] = round(time.monotonic() - self._t0, 1), how
        self.data["status"] = status

    def calls(self) -> list[dict]:
        return self.data["calls"]

    def save(self) -> None:
        if not self._locked:  # the first save of a fresh ladder takes the lock
            self.acquire()
        self.data["updated_utc"] = _utc()
        _atomic_write(self.dir / "state.json", json.dumps(self.data, indent=1) + "\n")

    # --- the trajectory pass's checkpoint -------------------------------------------------
    def save_pass(self, meta: dict, tensors: dict) -> None:
        """Checkpoint the pass: its tensors, then the state naming them, then drop the old."""
        if not self._locked:
            self.acquire()
        name = f"pass-{meta['step']}-{meta['block']}.pt"
        old = (self.data["pass"] or {}).get("tensors")
        tmp = self.dir / f".{name}.tmp"
        torch.save(tensors, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / name)
        self.data["pass"] = {**meta, "tensors": name}
        self.save()
        if old and old != name:
            (self.dir / old).unlink(missing_ok=True)

    def load_pass(self) -> tuple[dict, dict] | None:
        """(meta, tensors) of the pass's checkpoint, or None. A checkpoint whose tensors are
        gone (a fresh machine: they never travel) restarts the pass, saying so."""
        saved = self.data["pass"]
        if not saved:
            return None
        path = self.dir / saved["tensors"]
        if not path.is_file():
            print(f"ladder: the trajectory pass's tensors ({path.name}) are missing: its rungs "
                  "restart from step 0", file=sys.stderr)
            return None
        meta = {k: v for k, v in saved.items() if k != "tensors"}
        return meta, torch.load(path, map_location="cpu", weights_only=True)

    def drop_pass(self) -> None:
        saved = self.data["pass"]
        self.data["pass"] = None
        self.save()
        if saved:
            (self.dir / saved["tensors"]).unlink(missing_ok=True)

    def remove(self) -> None:
        """The ladder is finished and its summary written: the folder goes."""
        shutil.rmtree(self.dir)
        self._locked = False


def finished_summary(run_dir: Path, phase: str | None) -> tuple[str, dict] | None:
    """(phase, summary) of a finished ladder in ``run_dir``: no state left for ``phase`` (or,
    ``phase`` None, none at all) and exactly one ladder-<phase>.json summary; else None."""
    run_dir = Path(run_dir)
    states = phases_in(run_dir) if run_dir.is_dir() else []
    if (phase in states) if phase else states:
        return None
    names = [f"ladder-{phase}.json"] if phase else sorted(
        p.name for p in run_dir.glob("ladder-*.json"))
    found = [n for n in names if (run_dir / n).is_file()]
    if len(found) != 1:
        return None
    summary = R.load(str(run_dir / found[0]))
    return summary["parameters"]["phase"], summary
