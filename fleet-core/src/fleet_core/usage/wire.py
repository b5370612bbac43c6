"""Wire types of ``GET /api/v1/usage``."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["GroupBy", "UsageRow"]

GroupBy = Literal["hour", "day", "model", "project"]


class UsageRow(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    key: str
    """The hour or day (ISO-8601, UTC), the model, or the project (``tenant/name``)."""
    requests: int
    tokens_input: int
    tokens_output: int
    tokens_cached: int
    tokens_fresh: int
    units: int
    """Micro-units; 0 until model rates exist."""
