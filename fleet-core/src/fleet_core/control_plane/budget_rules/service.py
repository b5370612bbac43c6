"""Budget rules: a rule is accepted when its window parses and its scope exists; its limit and
window may change later (PATCH), its scope and dimension may not.

Scopes are looked up through the tenants service (a rule on a missing tenant or project is a 400
naming ``scopeId``); the rule itself is stored with both the window as written and its seconds.
"""

from __future__ import annotations

import re
import secrets

from msgspec import UnsetType
from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.budget_rules.store import RuleStore
from fleet_core.control_plane.budget_rules.windows import parse_window
from fleet_core.control_plane.budget_rules.wire import BudgetRule, RuleCreate, RulePatch
from fleet_core.control_plane.tenants import service as tenants
from fleet_core.shared import paging
from fleet_core.shared.errors import InvalidRequest, NotFound

__all__ = ["BudgetService"]

_RULE_ID = re.compile(r"rule_[0-9a-f]{12}")


class BudgetService:
    def __init__(self, store: RuleStore, *, tenants: tenants.TenantService) -> None:
        self.store = store
        self.tenants = tenants

    @classmethod
    def on_pool(cls, pool: AsyncConnectionPool) -> BudgetService:
        return cls(RuleStore(pool), tenants=tenants.TenantService.on_pool(pool))

    async def create(self, new: RuleCreate) -> BudgetRule:
        window_s = parse_window(new.window)
        await self._require_scope(new)
        rule_id = "rule_" + secrets.token_hex(6)
        return await self.store.insert(rule_id, new, window_s=window_s)

    async def list(
        self, page: paging.Page, *, tenant_id: str | None = None
    ) -> paging.Listing[BudgetRule]:
        rows = await self.store.list(page, tenant_id=tenant_id)
        return paging.listing(rows, page, lambda r: (r.created_at, r.id))

    async def get(self, rule_id: str) -> BudgetRule:
        rule = await self.store.get(rule_id) if _RULE_ID.fullmatch(rule_id) else None
        if rule is None:
            raise NotFound(f"no budget rule {rule_id!r}")
        return rule

    async def patch(self, rule_id: str, patch: RulePatch) -> BudgetRule:
        """A new limit or window for an existing rule; the gateways read it on their next poll."""
        rule = await self.get(rule_id)
        limit = rule.limit if isinstance(patch.limit, UnsetType) else patch.limit
        window = rule.window if isinstance(patch.window, UnsetType) else patch.window
        window_s = parse_window(window)
        updated = await self.store.update(rule_id, limit=limit, window=window, window_s=window_s)
        if updated is None:  # deleted between the read and the write
            raise NotFound(f"no budget rule {rule_id!r}")
        return updated

    async def delete(self, rule_id: str) -> BudgetRule:
        rule = await self.store.delete(rule_id) if _RULE_ID.fullmatch(rule_id) else None
        if rule is None:
            raise NotFound(f"no budget rule {rule_id!r}")
        return rule

    async def _require_scope(self, new: RuleCreate) -> None:
        try:
            if new.scope_kind == "tenant":
                await self.tenants.get_tenant(new.scope_id)
            else:
                await self.tenants.get_project(new.scope_id)
        except NotFound as exc:
            raise InvalidRequest(
                f"no {new.scope_kind} {new.scope_id!r}", param="scopeId", code="unknown_scope"
            ) from exc
