"""The keys API on the wire. ``IssuedKey`` (with the secret) exists in one response only."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["ApiKey", "IssuedKey", "KeyCreate"]

Label = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+(?![\s\S])")]
# (?![\s\S]), not $: in Python (which msgspec uses) $ also matches before a final newline


class KeyCreate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    project_id: Annotated[str, Meta(max_length=129, description="tenant/name")]
    label: Label


class ApiKey(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    project_id: str
    label: str
    prefix: str
    """The secret's first 8 characters, to tell keys apart in a list; not enough to use one."""
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class IssuedKey(ApiKey, frozen=True, kw_only=True, rename="camel"):
    secret: str
    """The bearer credential. Shown in the POST response only; the database keeps its SHA-256."""
