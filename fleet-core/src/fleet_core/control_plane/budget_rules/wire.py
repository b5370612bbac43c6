"""The budget-rules API on the wire."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

__all__ = ["BudgetRule", "Dimension", "RuleCreate", "RulePatch", "ScopeKind"]

ScopeKind = Literal["tenant", "project"]
Dimension = Literal[
    "tokens_total", "tokens_input", "tokens_output", "tokens_cached", "tokens_fresh", "units"
]
Limit = Annotated[int, Meta(ge=1, le=2**53 - 1)]  # exact in a JavaScript client
Window = Annotated[
    str,
    Meta(
        pattern=r"^[1-9][0-9]{0,9}(s|m|h|d|w|mo)$",
        description="N + s|m|h|d|w|mo (minutes are m, months mo = 30 days), e.g. 5h, 7d, 1mo",
    ),
]


class RuleCreate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    scope_kind: ScopeKind
    scope_id: Annotated[str, Meta(max_length=129)]
    dimension: Dimension
    limit: Limit
    window: Window


class RulePatch(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A rule's limit or window changed in place; its scope and dimension are what it is."""

    limit: Limit | UnsetType = UNSET
    window: Window | UnsetType = UNSET


class BudgetRule(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    scope_kind: ScopeKind
    scope_id: str
    dimension: Dimension
    limit: int
    window: str
    """As the client wrote it."""
    window_seconds: int
    created_at: datetime
