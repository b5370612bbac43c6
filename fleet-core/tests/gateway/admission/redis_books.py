"""Budget books in a real Redis as the hold tests read and drive them.

A rule under each test's key prefix, a book's entries and their sum read straight from Redis, and
what `Admission` does with the book: reserve, ask the store only when the slack does not cover a
request, and send every update of one flush under one batch id.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import msgspec
import redis

from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook, BudgetHold
from fleet_core.gateway.admission.directory import BudgetRule
from fleet_core.gateway.admission.limits import Decision, HoldUpdate, LimitStore

__all__ = ["LIMIT", "admit", "batched", "entries", "held", "rule_for"]

LIMIT = 1000


def rule_for(prefix: str, limit: int = LIMIT) -> BudgetRule:
    # the rule id carries the prefix: book keys are namespaced by the store's own prefix too
    return BudgetRule(f"rule_{prefix.strip(':')}", "tenant", "acme", "tokens_total", limit, 3600)


def held(url: str, key: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.hget(key, "sum") or 0)


def entries(url: str, key: str) -> dict[str, int]:
    with redis.Redis.from_url(url) as client:
        raw = client.hgetall(key)
    return {k.decode(): int(v) for k, v in raw.items() if k != b"sum"}


def batched(updates: Sequence[HoldUpdate]) -> list[HoldUpdate]:
    """As `Admission` sends them: every update of one flush under one batch id."""
    batch = f"b{next(BATCHES)}"
    return [msgspec.structs.replace(u, batch=batch) for u in updates]


BATCHES = itertools.count()


async def admit(
    store: LimitStore, book: BudgetBook, rules: list[BudgetRule], demand: Amounts
) -> tuple[BudgetHold | None, Decision | None]:
    """What `Admission.admit` does with the book: reserve, ask the store only when the slack
    does not cover it, count the grants or give the reservation back."""
    hold, asks = book.hold(rules, demand)
    if not asks:
        return hold, None
    decision = await store.reserve([], asks)
    if decision.admitted:
        assert book.placed(hold)
        return hold, decision
    updates = book.release(hold)
    if updates:
        await store.update_holds(batched(updates))
    return None, decision
