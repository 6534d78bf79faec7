"""Rung results and helpers shared by every ladder rung."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RungResult:
    """Outcome of one rung: ``status`` is 'pass', 'fail' or 'not-run' (with the reason)."""
    rung: int
    name: str
    status: str
    detail: str
    checks: dict = field(default_factory=dict)  # check name -> {"pass": bool, "detail": str}
    elements: int = 0
    headline: dict = field(default_factory=dict)  # values the ladder's headline reports
    part: str = ""  # the ladder's name for this step of its rung ("1a", "2b", "5"); "" = str(rung)

    @property
    def label(self) -> str:
        return self.part or str(self.rung)

    def to_json(self) -> dict:
        return {"part": self.label, "rung": self.rung, "name": self.name, "status": self.status,
                "detail": self.detail, "elements": self.elements, "checks": self.checks,
                "headline": self.headline}

    @classmethod
    def from_json(cls, d: dict) -> RungResult:
        return cls(d["rung"], d["name"], d["status"], d["detail"], d["checks"], d["elements"],
                   d["headline"], d["part"])

    @classmethod
    def from_checks(cls, rung: int, name: str, checks: dict, elements: int = 0,
                    headline: dict | None = None) -> RungResult:
        failed = [k for k, v in checks.items() if not v["pass"]]
        status = "fail" if failed else "pass"
        detail = f"{len(checks) - len(failed)}/{len(checks)} checks pass" + (
            f"; failing: {', '.join(failed)}" if failed else "")
        if failed:
            detail += f" (first: {checks[failed[0]]['detail']})"
        return cls(rung, name, status, detail, checks, elements, dict(headline or {}))


def check(ok: bool, detail: str) -> dict:
    return {"pass": bool(ok), "detail": detail}


def mismatch_detail(a, b, what: str) -> str:
    diff = (a.view(torch.uint8) != b.view(torch.uint8))
    n = int(diff.sum())
    if n == 0:
        return f"{what}: 0 of {a.numel()} bytes differ"
    idx = diff.reshape(-1).nonzero()[0].item()
    return (f"{what}: {n} of {a.numel()} bytes differ (first at flat index {idx}: "
            f"{int(a.reshape(-1).view(torch.uint8)[idx]):#04x} vs "
            f"{int(b.reshape(-1).view(torch.uint8)[idx]):#04x})")
