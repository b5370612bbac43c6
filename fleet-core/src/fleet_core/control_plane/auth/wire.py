"""Credentials, principals and audit events on the wire.

``IssuedCredential`` (with the secret) exists in one response only, like ``IssuedKey``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "AuditEvent",
    "Credential",
    "CredentialCreate",
    "IssuedCredential",
    "Principal",
    "Role",
    "ServiceRole",
]

ServiceRole = Literal["admin", "finance", "operator", "engine", "gateway", "metrics"]
"""Roles a service credential can hold (docs/security.md says what each may call)."""
Role = Literal["admin", "finance", "operator", "engine", "gateway", "metrics", "tenant"]
"""Every role a caller can have: a tenant's API key is ``tenant``."""

Label = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+(?![\s\S])")]
# (?![\s\S]), not $: in Python (which msgspec uses) $ also matches before a final newline
ClusterId = Annotated[
    str, Meta(min_length=1, max_length=253, pattern=r"^[^\x00-\x1f\x7f/]+(?![\s\S])")
]


class Principal(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Who is calling: a credential's (or API key's) id, never its secret."""

    id: str
    role: Role
    cluster_id: str | None = None
    """An operator's cluster: the only inventory it may report."""
    tenant_id: str | None = None
    """A tenant key's tenant: the only one whose data it may read."""
    project_id: str | None = None


class CredentialCreate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    role: ServiceRole
    label: Label
    cluster_id: ClusterId | None = None
    """Required for an ``operator`` credential, refused for any other role."""


class Credential(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: str
    role: ServiceRole
    cluster_id: str | None
    label: str
    prefix: str
    """The secret's first 8 characters, to tell credentials apart; not enough to use one."""
    created_by: str
    created_at: datetime
    revoked_at: datetime | None


class IssuedCredential(Credential, frozen=True, kw_only=True, rename="camel"):
    secret: str
    """The bearer token. Shown in the POST response only; the database keeps its SHA-256."""


class AuditEvent(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    id: int
    at: datetime
    actor: str
    """The credential or API key id that acted; never a secret."""
    actor_role: str
    action: str
    """create, update, replace, delete, revoke, close, pull, cancel …"""
    method: str
    target: str
    """The request path: what was acted on."""
    status: int
    request_id: str | None
    detail: dict[str, Any] | None = None
    """What the change set and, where it replaced something, what was there before
    (``{"before": …, "after": …}``); null for events that record none."""
