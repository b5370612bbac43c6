"""The tenants API on the wire: camelCase structs, value limits the database also enforces.

Limits mirror the columns (``request_limit integer``, ``token_limit bigint``), so a value the
database would refuse is a 400 naming the field here, never a 500 from the INSERT.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

__all__ = [
    "Deleted",
    "Id",
    "Name",
    "Project",
    "ProjectCreate",
    "ProjectPatch",
    "Tenant",
    "TenantCreate",
    "TenantPatch",
]

Id = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]
Name = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+(?![\s\S])")]
# (?![\s\S]), not $: in Python (which msgspec uses) $ also matches before a final newline
RequestLimit = Annotated[int, Meta(ge=1, le=2**31 - 1, description="requests per minute")]
TokenLimit = Annotated[int, Meta(ge=1, le=2**53 - 1, description="tokens per minute")]
Priority = Annotated[
    int,
    Meta(ge=1, le=100, description="weight in the gateway's fair queue when endpoints are full"),
]


class TenantCreate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: Id
    name: Name
    request_limit: RequestLimit | None = None
    token_limit: TokenLimit | None = None
    active: bool = True
    priority: Priority = 1


class TenantPatch(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: Name | UnsetType = UNSET
    request_limit: RequestLimit | UnsetType | None = UNSET
    token_limit: TokenLimit | UnsetType | None = UNSET
    active: bool | UnsetType = UNSET
    priority: Priority | UnsetType = UNSET


class Tenant(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    name: str
    request_limit: int | None
    token_limit: int | None
    active: bool
    created_at: datetime
    updated_at: datetime
    priority: int = 1


class ProjectCreate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    tenant_id: Id
    name: Id
    request_limit: RequestLimit | None = None
    token_limit: TokenLimit | None = None
    active: bool = True


class ProjectPatch(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    request_limit: RequestLimit | UnsetType | None = UNSET
    token_limit: TokenLimit | UnsetType | None = UNSET
    active: bool | UnsetType = UNSET


class Project(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    tenant_id: str
    name: str
    request_limit: int | None
    token_limit: int | None
    active: bool
    created_at: datetime
    updated_at: datetime


class Deleted(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    object: Literal["tenant", "project"]
    deleted: bool = True
