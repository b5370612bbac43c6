"""Bounds on what a client sends before any of it reaches a decoder, the clock or Postgres.

Three kinds of input broke the control plane with a 500 instead of a 400: JSON nested deeper
than Python's recursion limit (msgspec recurses to skip an unknown field), instants at the edge of
``datetime``'s range (one hour added, or a ``+05:00`` offset removed, overflows year 9999), and
NUL characters, which Postgres ``text`` cannot hold. Each check here is cheap and runs once, at
the edge (``auth.guard`` for every control-plane route, ``web.decode`` for every body), so the
code below it may trust that a string has no NUL, a body is shallow and an instant is between
`EARLIEST` and `LATEST`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

from fleet_core.shared.errors import InvalidRequest

__all__ = [
    "EARLIEST",
    "LATEST",
    "MAX_DEPTH",
    "check_json",
    "check_text",
    "json_depth",
    "parse_instant",
]

MAX_DEPTH = 64
"""The deepest JSON any control-plane body may nest (an inventory report needs fewer than 10)."""
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""Instants a client may name lie in ``[EARLIEST, LATEST)``: far from both ends of ``datetime``,
so adding a day, a month, a time zone or a retention window can never overflow."""

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def json_depth(body: bytes) -> int:
    """How deep ``body``'s arrays and objects nest (brackets inside strings do not count)."""
    depth = deepest = 0
    for byte in _STRING.sub(b"", body).translate(None, _BRACKETS):
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def check_json(body: bytes, *, most: int = MAX_DEPTH) -> None:
    """400 for a JSON body nested deeper than ``most`` or holding ``\\u0000`` in a string."""
    if body.count(b"[") + body.count(b"{") > most and json_depth(body) > most:
        raise InvalidRequest(
            f"the body nests arrays and objects deeper than {most} levels", code="too_deep"
        )
    if b"\\u0000" in body and _NUL_ESCAPE.search(body):
        raise InvalidRequest("strings in the body must not contain NUL (\\u0000)", code="nul")


def check_text(pairs: Iterable[tuple[str, str]]) -> None:
    """400 naming the first parameter whose name or value holds a NUL character."""
    for name, value in pairs:
        if "\x00" in name or "\x00" in value:
            raise InvalidRequest(
                f"{name.replace(chr(0), '')[:64]} must not contain NUL characters",
                param=name.replace("\x00", "")[:64] or None,
                code="nul",
            )


def parse_instant(raw: str, *, name: str, naive_utc: bool = True) -> datetime:
    """``raw`` (ISO-8601, ``Z`` allowed) as a UTC instant in ``[EARLIEST, LATEST)``, or a 400
    naming ``name``. A time without an offset is UTC when ``naive_utc``, else refused."""
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        value = None
    if value is not None and value.tzinfo is None and naive_utc:
        value = value.replace(tzinfo=UTC)
    # the year first: converting year 1 at +05:00 (or 9999 at -05:00) to UTC overflows
    if value is None or value.tzinfo is None or not 1970 <= value.year < 9000:
        raise InvalidRequest(
            f"{name} must be an ISO-8601 time with a time zone between "
            f"{EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d} (2026-09-01T00:00:00Z), "
            f"not {raw[:40]!r}",
            param=name,
        )
    value = value.astimezone(UTC)
    if not EARLIEST <= value < LATEST:
        raise InvalidRequest(
            f"{name} must be between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}", param=name
        )
    return value
