"""Cost periods are calendar months in UTC, named ``YYYY-MM``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = ["Period", "parse_period"]

_PERIOD = re.compile(r"([0-9]{4})-(0[1-9]|1[0-2])")


class Period:
    """One calendar month in UTC: ``[start, end)``."""

    def __init__(self, year: int, month: int) -> None:
        self.year = year
        self.month = month

    @property
    def name(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        return self.following().start

    @property
    def seconds(self) -> int:
        return int((self.end - self.start).total_seconds())

    def following(self) -> Period:
        return Period(self.year + self.month // 12, self.month % 12 + 1)

    def previous(self) -> Period:
        return Period(self.year - (self.month == 1), (self.month - 2) % 12 + 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Period) and self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"Period({self.name!r})"


def parse_period(name: str) -> Period | None:
    """The month ``name`` denotes (``2026-09``), or None when it is not one."""
    match = _PERIOD.fullmatch(name)
    if match is None or not 1970 <= int(match[1]) <= 9998:
        return None
    return Period(int(match[1]), int(match[2]))
