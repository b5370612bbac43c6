"""Who may call, under which limits and budgets: the directory admission asks.

Two directories answer the same questions. ``StaticDirectory`` is the environment mode: keys from
FLEET_API_KEYS, limits from FLEET_RATE_*, no budget rules, no unit rates. ``CatalogDirectory`` is
the database mode: a ``Catalog`` snapshot of the control plane's rows (tenants, projects, keys,
budget rules, model rates), swapped whole by ``catalog.CatalogWatcher`` when the rows change, so a
request always sees one consistent snapshot and never waits for the database.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import msgspec

from fleet_core.gateway.admission.key_ring import ANONYMOUS, KeyRing, Principal
from fleet_core.gateway.admission.limits import Bucket
from fleet_core.gateway.admission.rate_policy import Limits, RatePolicy
from fleet_core.shared.credentials import bearer_token, digest
from fleet_core.shared.errors import AuthenticationError, PermissionDenied
from fleet_core.shared.pricing import Rates

__all__ = [
    "BudgetRule",
    "Catalog",
    "CatalogDirectory",
    "Directory",
    "KeyEntry",
    "Rates",
    "Scope",
    "StaticDirectory",
]

BUCKET_CACHE_SIZE = 10_000
RULES_CACHE_SIZE = 10_000
"""Principals whose budget rules are kept per snapshot; beyond this the cache starts again."""
BudgetDimension = Literal[
    "tokens_total", "tokens_input", "tokens_output", "tokens_cached", "tokens_fresh", "units"
]


class BudgetRule(msgspec.Struct, frozen=True):
    id: str
    scope_kind: Literal["tenant", "project"]
    scope_id: str
    """A tenant id, or a project id (``tenant/name``)."""
    dimension: BudgetDimension
    limit: int
    window_s: int


@dataclass(frozen=True, slots=True)
class Scope:
    limits: Limits
    active: bool
    priority: int = 1
    """A tenant's fair-queue weight when endpoints are full (projects keep 1)."""


@dataclass(frozen=True, slots=True)
class KeyEntry:
    principal: Principal
    """``key_id`` is the key's row id (``key_…``), which the control plane shows too."""


@dataclass(frozen=True)
class Catalog:
    """One consistent snapshot of what admission reads from the database."""

    keys: Mapping[bytes, KeyEntry] = field(default_factory=dict)
    """Active (unrevoked) keys by the SHA-256 digest of their secret."""
    tenants: Mapping[str, Scope] = field(default_factory=dict)
    projects: Mapping[str, Scope] = field(default_factory=dict)
    """By project id, ``tenant/name``."""
    rules: Sequence[BudgetRule] = ()
    rates: Mapping[str, Rates] = field(default_factory=dict)

    def policy(self, default_max_tokens: int) -> RatePolicy:
        """Rows' limits as a rate policy: a tenant without limits is unlimited, not a default."""
        return RatePolicy(
            tenants={tid: s.limits for tid, s in self.tenants.items()},
            projects={pid: s.limits for pid, s in self.projects.items()},
            default=Limits(),
            default_max_tokens=default_max_tokens,
        )


class Directory(Protocol):
    @property
    def auth_required(self) -> bool: ...

    @property
    def default_max_tokens(self) -> int: ...

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller, or 401 (no key, unknown key, revoked key)."""

    def lookup(self, secret: str) -> Principal | None: ...

    def check_active(self, principal: Principal) -> None:
        """403 when the caller's tenant or project is inactive."""

    def buckets(self, principal: Principal, *, prefix: str) -> Sequence[Bucket]: ...

    def rules(self, principal: Principal) -> Sequence[BudgetRule]: ...

    @property
    def has_rules(self) -> bool:
        """Whether any budget rule exists (admission then needs the rollups' figures)."""

    def rates(self, model: str) -> Rates | None: ...


class _BucketCache:
    """A policy's buckets per principal, computed once per policy (policies are immutable)."""

    def __init__(self, policy: RatePolicy) -> None:
        self.policy = policy
        self._found: dict[tuple[Principal, str], list[Bucket]] = {}

    def get(self, principal: Principal, prefix: str) -> list[Bucket]:
        found = self._found.get((principal, prefix))
        if found is None:
            if len(self._found) >= BUCKET_CACHE_SIZE:
                self._found.clear()
            found = self.policy.buckets(principal, prefix=prefix)
            self._found[(principal, prefix)] = found
        return found


class StaticDirectory:
    """Environment mode: FLEET_API_KEYS (or no auth) and FLEET_RATE_*."""

    def __init__(self, *, keys: KeyRing | None, policy: RatePolicy) -> None:
        self._keys = keys
        self._buckets = _BucketCache(policy)

    @property
    def auth_required(self) -> bool:
        return self._keys is not None

    @property
    def default_max_tokens(self) -> int:
        return self._buckets.policy.default_max_tokens

    def authenticate(self, authorization: str | None) -> Principal:
        return ANONYMOUS if self._keys is None else self._keys.authenticate(authorization)

    def lookup(self, secret: str) -> Principal | None:
        return None if self._keys is None else self._keys.lookup(secret)

    def check_active(self, principal: Principal) -> None:
        return None

    def buckets(self, principal: Principal, *, prefix: str) -> Sequence[Bucket]:
        return self._buckets.get(principal, prefix)

    def rules(self, principal: Principal) -> Sequence[BudgetRule]:
        return ()

    @property
    def has_rules(self) -> bool:
        return False

    def rates(self, model: str) -> Rates | None:
        return None


class CatalogDirectory:
    """Database mode: every answer comes from the newest ``Catalog`` snapshot."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        default_max_tokens: int = 4096,
        on_seen: Callable[[str], None] | None = None,
    ) -> None:
        self._default_max_tokens = default_max_tokens
        self._on_seen = on_seen
        self.replace(catalog)

    def replace(self, catalog: Catalog) -> None:
        """Swap in a new snapshot; requests already admitted keep what they were admitted on."""
        rules: dict[tuple[str, str], list[BudgetRule]] = {}
        for rule in catalog.rules:
            rules.setdefault((rule.scope_kind, rule.scope_id), []).append(rule)
        self._catalog = catalog
        self._rules = {scope: tuple(found) for scope, found in rules.items()}
        self._rules_of: dict[Principal, tuple[BudgetRule, ...]] = {}
        """Each principal's rules in this snapshot, gathered once (principals are few)."""
        self._inactive: dict[Principal, str] = {}
        """Each principal's inactive scope in this snapshot (``""``: both active), found once."""
        self._buckets = _BucketCache(catalog.policy(self._default_max_tokens))

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @property
    def auth_required(self) -> bool:
        return True

    @property
    def default_max_tokens(self) -> int:
        return self._default_max_tokens

    def authenticate(self, authorization: str | None) -> Principal:
        entry = self._catalog.keys.get(digest(bearer_token(authorization)))  # `lookup`, inline
        if entry is None:
            raise AuthenticationError("Incorrect API key provided.")
        if self._on_seen is not None:
            self._on_seen(entry.principal.key_id)
        return entry.principal

    def lookup(self, secret: str) -> Principal | None:
        entry = self._catalog.keys.get(digest(secret))
        return None if entry is None else entry.principal

    def check_active(self, principal: Principal) -> None:
        inactive = self._inactive.get(principal)
        if inactive is None:
            if len(self._inactive) >= RULES_CACHE_SIZE:
                self._inactive.clear()
            inactive = self._inactive[principal] = self._inactive_scope(principal)
        if inactive:
            raise PermissionDenied(
                f"{inactive} is inactive; its keys are refused until it is set active again",
                code=f"{inactive.partition(' ')[0]}_inactive",
            )

    def _inactive_scope(self, principal: Principal) -> str:
        """``tenant 'id'`` or ``project 'id'`` when inactive (or unknown), else ``""``."""
        tenant = self._catalog.tenants.get(principal.tenant)
        if tenant is None or not tenant.active:
            return f"tenant {principal.tenant!r}"
        project_id = f"{principal.tenant}/{principal.project}"
        project = self._catalog.projects.get(project_id)
        if project is None or not project.active:
            return f"project {project_id!r}"
        return ""

    def buckets(self, principal: Principal, *, prefix: str) -> Sequence[Bucket]:
        return self._buckets.get(principal, prefix)

    def rules(self, principal: Principal) -> Sequence[BudgetRule]:
        found = self._rules_of.get(principal)
        if found is None:
            if len(self._rules_of) >= RULES_CACHE_SIZE:
                self._rules_of.clear()
            project_id = f"{principal.tenant}/{principal.project}"
            found = self._rules.get(("tenant", principal.tenant), ()) + self._rules.get(
                ("project", project_id), ()
            )
            self._rules_of[principal] = found
        return found

    @property
    def has_rules(self) -> bool:
        return bool(self._catalog.rules)

    def rates(self, model: str) -> Rates | None:
        return self._catalog.rates.get(model)
