"""Keyset (cursor) pagination for the control plane's lists: lists page on the server.

A list is ordered by a unique key (``id``, or ``created_at, id``); a page is the first ``limit``
rows after the previous page's last key. The cursor (``next`` in a response, ``after`` in the
next request) is that key, base64url-encoded JSON, opaque to clients. Rows inserted while a client
pages never shift it (no offsets), and every row present throughout is seen exactly once.

Anything a client sends is untrusted: ``limit`` is an integer from 1 to ``MAX_LIMIT`` (default
``DEFAULT_LIMIT``); a cursor that does not decode to a key of the list's shape is a 400 envelope
before any SQL runs. A list without ``limit`` and ``after`` answers its first ``DEFAULT_LIMIT``
rows, with ``next`` only when there are more (the shape stays
``{"object": "list", "data": [...]}``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

import msgspec
from starlette.datastructures import QueryParams

from fleet_core.shared.errors import InvalidRequest

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "Kind",
    "Listing",
    "Page",
    "cursor",
    "keyset",
    "listing",
    "page",
    "params",
    "search",
    "window",
]

DEFAULT_LIMIT = 100
MAX_LIMIT = 500
_MAX_CURSOR = 1024
MAX_SEARCH = 64
Kind = Literal["text", "time", "start"]
"""A key column's type: text, a timestamp (ISO-8601 in the cursor, timestamptz in SQL), or a
start that may be ``-infinity`` (a cost rate's ``effective_from``; SQL lists only)."""
_NEVER = "-infinity"
T = TypeVar("T")
_CURSOR = msgspec.json.Decoder(list[str])


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """Which rows a request asked for: the first ``limit`` after ``after`` (None: the start)."""

    limit: int = DEFAULT_LIMIT
    after: tuple[str | datetime, ...] | None = None
    kinds: tuple[Kind, ...] = ()


class Listing(msgspec.Struct, Generic[T], frozen=True, kw_only=True, omit_defaults=True):
    object: Literal["list"]
    data: list[T]
    next: str | None = None
    """The cursor of the next page (pass it as ``after``); absent on the last page, so a list
    that fits one page keeps the shape it had before pagination."""


def page(query: QueryParams, kinds: Sequence[Kind], *, most: int = MAX_LIMIT) -> Page:
    """The page a query asks for, or a 400 naming ``limit`` or ``after``."""
    after = _after(query.get("after"), kinds)
    return Page(limit=_limit(query.get("limit"), most), after=after, kinds=tuple(kinds))


def search(query: QueryParams) -> str | None:
    """``q``, a case-insensitive substring a list's rows are filtered by (its id or name), or a
    400 naming ``q`` when it is longer than ``MAX_SEARCH`` or holds a control character."""
    raw = query.get("q")
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_SEARCH or not raw.isprintable():
        raise InvalidRequest(f"q must be at most {MAX_SEARCH} printable characters", param="q")
    return raw


def _limit(raw: str | None, most: int) -> int:
    if raw is None:  # an empty ``limit=`` is no integer: 400, as the document says
        return min(DEFAULT_LIMIT, most)
    if not raw.isascii() or not raw.isdigit() or len(raw) > 6 or not 0 < int(raw) <= most:
        raise InvalidRequest(f"limit must be an integer from 1 to {most}", param="limit")
    return int(raw)


def _after(raw: str | None, kinds: Sequence[Kind]) -> tuple[str | datetime, ...] | None:
    if raw is None or raw == "":
        return None
    bad = InvalidRequest("after must be a cursor from a previous page's next", param="after")
    if len(raw) > _MAX_CURSOR or not raw.isascii():
        raise bad
    try:
        values = _CURSOR.decode(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        key = tuple(_typed(v, kind) for v, kind in zip(values, kinds, strict=True))
    except (binascii.Error, msgspec.DecodeError, ValueError) as exc:
        raise bad from exc
    return key


def _typed(value: str, kind: Kind) -> str | datetime:
    if "\x00" in value:  # Postgres text cannot hold NUL
        raise ValueError("NUL")
    if kind == "text" or (kind == "start" and value == _NEVER):
        return value
    when = datetime.fromisoformat(value)
    if when.tzinfo is None:
        raise ValueError("a cursor's time has its offset")
    return when


def cursor(key: Sequence[str | datetime]) -> str:
    text = [v.isoformat() if isinstance(v, datetime) else v for v in key]
    return base64.urlsafe_b64encode(msgspec.json.encode(text)).decode().rstrip("=")


def keyset(
    columns: Sequence[str], page: Page | None, *, descending: bool = False
) -> tuple[str, str]:
    """``(condition, order)``: SQL after ``WHERE`` (rows past the cursor) and after ``ORDER BY``
    (with the page's ``LIMIT`` plus one, to learn whether a next page exists; no page: every
    row, for callers inside the control plane). The cursor's values are bound as
    ``%(after_0)s``…, from `params`."""
    order = ", ".join(f"{c} DESC" if descending else c for c in columns)
    if page is None:
        return "TRUE", order
    limit = f" LIMIT {int(page.limit) + 1}"
    if page.after is None:
        return "TRUE", order + limit
    casts = ["::text" if kind == "text" else "::timestamptz" for kind in page.kinds]
    names = ", ".join(f"%(after_{i})s{cast}" for i, cast in enumerate(casts))
    return f"({', '.join(columns)}) {'<' if descending else '>'} ({names})", order + limit


def window(
    rows: Iterable[T], page: Page, key: Callable[[T], Any], *, descending: bool = False
) -> list[T]:
    """`keyset` over rows in memory: sorted by ``key``, those past the cursor, ``limit + 1``."""
    ordered = sorted(rows, key=key, reverse=descending)
    if page.after is not None:
        after = page.after
        ordered = [r for r in ordered if (key(r) < after if descending else key(r) > after)]
    return ordered[: page.limit + 1]


def params(page: Page | None) -> dict[str, Any]:
    return {f"after_{i}": v for i, v in enumerate(page.after or ())} if page else {}


def listing(
    rows: Sequence[T], page: Page, key: Callable[[T], Sequence[str | datetime]]
) -> Listing[T]:
    """The page's rows (fetched with `keyset`'s ``limit + 1``) and the next page's cursor."""
    if len(rows) <= page.limit:
        return Listing(object="list", data=list(rows))
    shown = list(rows[: page.limit])
    return Listing(object="list", data=shown, next=cursor(key(shown[-1])))
