"""Printing and counting checks: one line each, a summary, stop at the first failure unless told.

A check either passes, fails, or is a *note*: something this deployment cannot show (a console
not built in, load signals not published yet, a credential not given). A note is never counted
as a pass, and the summary says how many there were.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

__all__ = ["Runner", "Stop"]

_OBSERVED_MAX = 160


class Stop(Exception):
    """The first failure, when not ``--keep-going``: the run stops (and still cleans up)."""


@dataclass
class Runner:
    keep_going: bool = False
    out: TextIO = sys.stdout
    passed: int = 0
    failed: int = 0
    notes: int = 0
    interrupted: bool = False
    """SIGINT or SIGTERM ended the run early (exit status 1, like a failure)."""

    def check(self, area: str, what: str, ok: bool, observed: object) -> bool:
        """One line: ``area  what  ok|FAIL  observed``; raises Stop on a failure unless
        ``keep_going``. Returns ``ok`` so callers can skip checks that depend on this one."""
        self._line(area, what, "ok" if ok else "FAIL", observed)
        if ok:
            self.passed += 1
            return True
        self.failed += 1
        if not self.keep_going:
            raise Stop(f"{area}: {what}")
        return False

    def note(self, area: str, what: str, why: str) -> None:
        """Something not checked here, and why; never a pass."""
        self.notes += 1
        self._line(area, what, "note", why)

    def summary(self) -> str:
        total = self.passed + self.failed
        text = f"{self.passed}/{total} checks passed, {self.failed} failed, {self.notes} notes"
        if self.interrupted:
            return f"INTERRUPTED: {text}"
        return text if self.failed == 0 else f"FAILED: {text}"

    def _line(self, area: str, what: str, verdict: str, observed: object) -> None:
        seen = " ".join(str(observed).split())
        if len(seen) > _OBSERVED_MAX:
            seen = seen[: _OBSERVED_MAX - 1] + "…"
        print(f"{area:<16} {what:<58} {verdict:<4} {seen}", file=self.out, flush=True)
