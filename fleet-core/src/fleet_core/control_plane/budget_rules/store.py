"""Budget rule rows: `window_spec` (0002) keeps the window as written; `window_s` is enforced."""

from __future__ import annotations

from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from fleet_core.control_plane.budget_rules.windows import render_window
from fleet_core.control_plane.budget_rules.wire import BudgetRule, Dimension, RuleCreate, ScopeKind
from fleet_core.shared import paging
from fleet_core.shared.storage.rows import utc_row

__all__ = ["RuleStore"]

_RULE = 'id, scope_kind, scope_id, dimension, "limit", window_spec, window_s, created_at'


def _rule(
    *,
    id: str,
    scope_kind: ScopeKind,
    scope_id: str,
    dimension: Dimension,
    limit: int,
    window_spec: str | None,
    window_s: int,
    created_at: datetime,
) -> BudgetRule:
    return BudgetRule(
        id=id,
        scope_kind=scope_kind,
        scope_id=scope_id,
        dimension=dimension,
        limit=limit,
        window=window_spec or render_window(window_s),
        window_seconds=window_s,
        created_at=created_at,
    )


class RuleStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def insert(self, rule_id: str, new: RuleCreate, *, window_s: int) -> BudgetRule:
        return _found(
            await self._one(
                'INSERT INTO budget_rules (id, scope_kind, scope_id, dimension, "limit",'
                f" window_spec, window_s) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {_RULE}",
                (
                    rule_id,
                    new.scope_kind,
                    new.scope_id,
                    new.dimension,
                    new.limit,
                    new.window,
                    window_s,
                ),
            )
        )

    async def list(self, page: paging.Page, *, tenant_id: str | None = None) -> list[BudgetRule]:
        """One page in ``(created_at, id)`` order; a tenant's rules (its own and its projects')."""
        past, order = paging.keyset(["created_at", "id"], page)
        mine = "TRUE" if tenant_id is None else "split_part(scope_id, '/', 1) = %(tenant)s"
        query = f"SELECT {_RULE} FROM budget_rules WHERE {past} AND {mine} ORDER BY {order}"
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(_rule))
            await cursor.execute(
                query.encode(),
                {"tenant": tenant_id, **paging.params(page)},
            )
            return await cursor.fetchall()

    async def get(self, rule_id: str) -> BudgetRule | None:
        return await self._one(f"SELECT {_RULE} FROM budget_rules WHERE id = %s", (rule_id,))

    async def update(
        self, rule_id: str, *, limit: int, window: str, window_s: int
    ) -> BudgetRule | None:
        return await self._one(
            'UPDATE budget_rules SET "limit" = %s, window_spec = %s, window_s = %s'
            f" WHERE id = %s RETURNING {_RULE}",
            (limit, window, window_s, rule_id),
        )

    async def delete(self, rule_id: str) -> BudgetRule | None:
        return await self._one(
            f"DELETE FROM budget_rules WHERE id = %s RETURNING {_RULE}", (rule_id,)
        )

    async def _one(self, query: str, params: tuple[object, ...]) -> BudgetRule | None:
        async with self._pool.connection() as conn:
            cursor = conn.cursor(row_factory=utc_row(_rule))
            await cursor.execute(query.encode(), params)
            return await cursor.fetchone()


def _found(rule: BudgetRule | None) -> BudgetRule:
    assert rule is not None, "INSERT … RETURNING returns the row"
    return rule
