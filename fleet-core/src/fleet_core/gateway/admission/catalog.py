"""The gateway's database mode: reading the control plane's rows for admission.

- ``load_catalog``: one snapshot of tenants, projects, unrevoked keys, budget rules and model
  rates, read in one transaction so it is consistent.
- ``CatalogWatcher``: keeps the directory's snapshot current. It LISTENs on ``fleet_admission``
  (migration 0004's triggers announce every change to those tables) and reloads when told, and
  also every ``poll_interval_s`` in case a notification was lost with its connection. A revoked
  key is refused within milliseconds, and within one poll interval at worst.
- ``rule_usage`` / ``rule_minutes``: the budget rules' sums over the ledger's per-minute rollups
  (``usage_minute``), the refresh behind ``budgets.BudgetBook``; never a scan of ledger rows.
- ``RuleMinutes``: a refusing rule's minute series (for Retry-After), read once per rule per
  refresh interval however many requests it refuses.
- ``KeyUsage``: ``last_used_at`` of the keys seen, written in one UPDATE every few seconds.

While the database is away the gateway keeps serving on the last snapshot it loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from fleet_core.gateway.admission.directory import (
    BudgetRule,
    Catalog,
    CatalogDirectory,
    KeyEntry,
    Rates,
    Scope,
)
from fleet_core.gateway.admission.key_ring import Principal
from fleet_core.gateway.admission.rate_policy import Limits
from fleet_core.shared import stopping

__all__ = [
    "CHANNEL",
    "CatalogWatcher",
    "KeyUsage",
    "RuleMinutes",
    "load_catalog",
    "read_budgets",
    "refresh_budgets",
    "rule_minutes",
    "rule_usage",
]

log = logging.getLogger("fleet.admission")
CHANNEL = "fleet_admission"
Connection = psycopg.AsyncConnection[Any]

_DIMENSION_SQL = {
    "tokens_total": "tokens_input + tokens_output",
    "tokens_input": "tokens_input",
    "tokens_output": "tokens_output",
    "tokens_cached": "tokens_cached",
    "tokens_fresh": "tokens_fresh",
    "units": "units",
}
# One row per rule: its dimension summed over the rollup minutes its window reaches, each rule
# its own index scan on usage_minute's primary key (tenant, then project). The window starts at the
# minute holding (now - window), so a boundary minute counts whole (errs on refusing).
_RULE_USAGE = (
    "SELECT r.id, coalesce(s.total, 0)::bigint FROM budget_rules r CROSS JOIN LATERAL ("
    " SELECT sum(CASE r.dimension "
    + " ".join(f"WHEN '{dim}' THEN u.{expr}" for dim, expr in _DIMENSION_SQL.items())
    + """ END) AS total FROM usage_minute u
  WHERE u.tenant = split_part(r.scope_id, '/', 1)
    AND (r.scope_kind = 'tenant' OR u.project = split_part(r.scope_id, '/', 2))
    AND u.minute >= date_trunc('minute', now() - make_interval(secs => r.window_s))) s"""
)


async def load_catalog(conn: Connection) -> Catalog:
    async with conn.transaction():
        cur = conn.cursor()
        await cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        await cur.execute("SELECT id, request_limit, token_limit, active, priority FROM tenants")
        tenants = {r[0]: Scope(Limits(r[1], r[2]), r[3], r[4]) for r in await cur.fetchall()}
        await cur.execute("SELECT id, request_limit, token_limit, active FROM projects")
        projects = {r[0]: Scope(Limits(r[1], r[2]), r[3]) for r in await cur.fetchall()}
        await cur.execute(
            "SELECT k.secret_hash, k.id, p.tenant_id, p.name FROM api_keys k"
            " JOIN projects p ON p.id = k.project_id WHERE k.revoked_at IS NULL"
        )
        keys = {bytes(r[0]): KeyEntry(Principal(r[2], r[3], r[1])) for r in await cur.fetchall()}
        await cur.execute(
            'SELECT id, scope_kind, scope_id, dimension, "limit", window_s FROM budget_rules'
        )
        rules = tuple(BudgetRule(*r) for r in await cur.fetchall())
        await cur.execute(
            "SELECT model, input_fresh_micro_per_1k, input_cached_micro_per_1k,"
            " output_micro_per_1k FROM model_rates"
        )
        rates = {r[0]: Rates(r[1], r[2], r[3]) for r in await cur.fetchall()}
    return Catalog(keys=keys, tenants=tenants, projects=projects, rules=rules, rates=rates)


async def rule_usage(conn: Connection) -> dict[str, int]:
    # JIT compiling this small plan costs more than running it (10x on a month of rollups).
    async with conn.transaction():
        await conn.execute("SET LOCAL jit = off")
        cur = await conn.execute(_RULE_USAGE)
        rows = await cur.fetchall()
    return {rule_id: int(total) for rule_id, total in rows}


async def rule_minutes(conn: Connection, rule: BudgetRule) -> list[tuple[float, int]]:
    """(minute start as epoch seconds, amount) inside the rule's window, oldest first."""
    project_clause = "" if rule.scope_kind == "tenant" else " AND project = %(project)s"
    tenant, _, project = rule.scope_id.partition("/")
    amount = _DIMENSION_SQL[rule.dimension]
    async with conn.transaction():
        await conn.execute("SET LOCAL jit = off")
        cur = await conn.execute(
            f"SELECT extract(epoch FROM minute)::float8, sum({amount})::bigint"
            " FROM usage_minute WHERE tenant = %(tenant)s" + project_clause + " AND minute >="
            " date_trunc('minute', now() - make_interval(secs => %(window)s))"
            " GROUP BY minute ORDER BY minute",
            {"tenant": tenant, "project": project, "window": rule.window_s},
        )
        rows = await cur.fetchall()
    return [(float(m), int(a)) for m, a in rows]


Minutes = list[tuple[float, int]]


class RuleMinutes:
    """Each refusing rule's minute series, read from the database at most once per ``ttl_s``.

    A tenant over budget is refused on every request until its window frees; without this each
    refusal would cost a query. Concurrent refusals of one rule share one read in flight. A read
    that fails is remembered for ``ttl_s`` too (as None: Retry-After falls back to a short
    guess), so a dead database is not asked once per refusal either.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._ttl_s = ttl_s
        self._clock = clock
        self._reads: dict[BudgetRule, tuple[float, asyncio.Task[Minutes | None]]] = {}
        self.queries = 0
        """Reads sent to the database so far."""

    async def get(self, rule: BudgetRule) -> Minutes | None:
        now = self._clock()
        found = self._reads.get(rule)
        if found is None or found[0] <= now:
            self._reads = {r: e for r, e in self._reads.items() if e[0] > now}
            found = (now + self._ttl_s, asyncio.get_running_loop().create_task(self._read(rule)))
            self._reads[rule] = found
        return await asyncio.shield(found[1])

    async def _read(self, rule: BudgetRule) -> Minutes | None:
        self.queries += 1
        try:
            async with self._pool.connection(timeout=2) as conn:
                return await rule_minutes(conn, rule)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("could not read budget rule %s's minutes for Retry-After: %s", rule.id, exc)
            return None


Refreshed = Callable[[dict[str, int], float], object]
"""Told each new set of rule sums and the monotonic time its query started."""


async def read_budgets(
    pool: AsyncConnectionPool, refreshed: Refreshed, *, outage: OutageLog | None = None
) -> bool:
    """One refresh of the rules' sums; False (logged, through ``outage`` when given) when the
    database did not answer: the last figures stay."""
    started = time.monotonic()
    try:
        async with pool.connection(timeout=5) as conn:
            used = await rule_usage(conn)
    except (psycopg.Error, OSError, TimeoutError) as exc:
        if outage is None:
            log.warning("budget usage refresh failed, keeping the last figures: %s", exc)
        else:
            outage.failed(exc)
        return False
    if outage is not None:
        outage.recovered()
    refreshed(used, started)
    return True


async def refresh_budgets(
    pool: AsyncConnectionPool,
    refreshed: Refreshed,
    *,
    interval_s: float = 1.0,
    idle: Callable[[], None] = lambda: None,
    wanted: asyncio.Event | None = None,
) -> None:
    """Forever: refresh the rules' sums every ``interval_s``, or at once when ``wanted`` is set
    (a request met a rule not yet read); ``idle`` runs after each try, answered or not (the
    gateway keeps its budget holds alive there)."""
    wanted = wanted or asyncio.Event()
    outage = OutageLog("budget usage refresh (keeping the last figures)")
    while True:
        started = time.monotonic()
        wanted.clear()
        await read_budgets(pool, refreshed, outage=outage)
        idle()
        stopping.raise_if_cancelled()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, interval_s - (time.monotonic() - started))):
                await wanted.wait()


class OutageLog:
    """One warning when a dependency goes away, then one every ``every_s`` while it stays away
    (with how many tries failed since), and one line when it is back: a loop that retries every
    second must not write a warning every second for as long as Postgres is down."""

    def __init__(
        self, what: str, *, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.what, self.every_s, self._clock = what, every_s, clock
        self._since: float | None = None
        self._logged_at = 0.0
        self._failures = 0

    def failed(self, exc: BaseException) -> None:
        now = self._clock()
        self._failures += 1
        if self._since is None:
            self._since, self._logged_at, self._failures = now, now, 0
            log.warning("%s lost the database, retrying: %s", self.what, exc)
        elif now - self._logged_at >= self.every_s:
            log.warning(
                "%s still cannot reach the database after %.0f s (%d more failures): %s",
                self.what, now - self._since, self._failures, exc,
            )  # fmt: skip
            self._logged_at, self._failures = now, 0

    def recovered(self) -> None:
        if self._since is not None:
            log.warning("%s reached the database again after %.0f s",
                        self.what, self._clock() - self._since)  # fmt: skip
            self._since, self._failures = None, 0


class CatalogWatcher:
    """Keeps a ``CatalogDirectory`` on the newest snapshot of the database's rows."""

    def __init__(
        self,
        url: str,
        directory: CatalogDirectory,
        *,
        poll_interval_s: float = 1.0,
    ) -> None:
        self._url = url
        self._directory = directory
        self._poll_interval_s = poll_interval_s
        self.reloads = 0
        self.outage = OutageLog("catalog watcher")

    async def run(self) -> None:
        """Forever: listen, reload on notification or poll; reconnect after failures."""
        while True:
            try:
                await self._listen()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                self.outage.failed(exc)
                stopping.raise_if_cancelled()
                await asyncio.sleep(self._poll_interval_s)

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=5
        ) as conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            await self._reload(conn)  # what changed while we were not listening
            self.outage.recovered()
            while True:
                stopping.raise_if_cancelled()
                notified = False
                async for _ in conn.notifies(timeout=self._poll_interval_s, stop_after=1):
                    notified = True
                if not notified:
                    await self._reload(conn)
                    continue
                # Coalesce a burst of changes (a transaction touching several tables) into one.
                async for _ in conn.notifies(timeout=0.01):
                    pass
                await self._reload(conn)

    async def _reload(self, conn: Connection) -> None:
        catalog = await load_catalog(conn)
        if catalog != self._directory.catalog:
            self._directory.replace(catalog)
            self.reloads += 1


class KeyUsage:
    """Collects the keys seen and writes their ``last_used_at`` in batches."""

    def __init__(self, pool: AsyncConnectionPool, *, interval_s: float = 5.0) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self._seen: dict[str, float] = {}

    def seen(self, key_id: str) -> None:
        self._seen[key_id] = time.time()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.flush()
            # Cancelled as the pool handed flush() a connection, it may not have noticed.
            stopping.raise_if_cancelled()

    async def flush(self) -> None:
        seen, self._seen = self._seen, {}
        if not seen:
            return
        try:
            async with self._pool.connection(timeout=5) as conn:
                await conn.execute(
                    "UPDATE api_keys k SET last_used_at = greatest(k.last_used_at, s.at)"
                    " FROM unnest(%s::text[], %s::timestamptz[]) AS s(id, at) WHERE k.id = s.id",
                    (list(seen), [_utc(t) for t in seen.values()]),
                )
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning("could not record keys' last use: %s", exc)
            for key_id, at in seen.items():
                self._seen.setdefault(key_id, at)


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)
