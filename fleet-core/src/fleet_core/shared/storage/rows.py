"""Rows as structs, with every timestamp in UTC.

psycopg hands back ``timestamptz`` in the session's time zone; the API promises ISO-8601 UTC, so
the conversion happens once, where rows become structs, instead of in every encoder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from psycopg.rows import BaseRowFactory, RowMaker

__all__ = ["utc_row"]

T = TypeVar("T")


def utc_row(cls: Callable[..., T]) -> BaseRowFactory[T]:
    """Like psycopg's ``class_row``: ``cls(**columns)``, datetimes converted to UTC first."""

    def factory(cursor: Any) -> RowMaker[T]:
        names = [column.name for column in cursor.description or ()]

        def make(values: Sequence[Any]) -> T:
            return cls(**{name: _utc(value) for name, value in zip(names, values, strict=True)})

        return make

    return factory


def _utc(value: object) -> object:
    return value.astimezone(UTC) if isinstance(value, datetime) else value
