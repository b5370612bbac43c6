"""Budget rules at admission: rolling-window limits checked against the ledger's rollups (P5).

A rule's usage is three parts, all kept in memory so admission never waits for the database:

- ``used``: the rule's sum over the ledger's per-minute rollups inside its window, refreshed by a
  background query every second (``refresh``); its cost follows the number of minutes in the
  window, never the number of ledger rows.
- ``held``: what requests admitted here and still in flight reserved (their estimate).
- ``recent``: what requests settled here used and the rollups may not show yet — a record is
  counted here from settlement until a refresh that started after the ledger committed it.

A request is admitted only if, for every rule that applies, ``used + held + recent + demand``
stays within the limit; then its demand is held until it settles. Everything is integer
arithmetic on plain dicts: the decision is a pure function of the book and the demand.

Across several gateways a rule can be overshot by what the others admitted in the last second or
two (their holds are not shared; their records reach the rollups within a flush and a refresh).
ADR 0004 says why that trade is made.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet_core.admission.directory import BudgetDimension, BudgetRule
from fleet_core.errors import RateLimited, ReservationTooLarge

__all__ = ["Amounts", "BudgetBook", "BudgetExceeded", "BudgetHold", "free_after"]

RECENT_LIMIT = 200_000
"""Settled records remembered until the rollups show them; beyond this the oldest are dropped."""


@dataclass(frozen=True, slots=True)
class Amounts:
    """What a request reserves or used, in every dimension a rule can limit."""

    tokens_input: int = 0
    tokens_output: int = 0
    tokens_cached: int = 0
    units: int = 0

    def get(self, dimension: BudgetDimension) -> int:
        if dimension == "tokens_total":
            return self.tokens_input + self.tokens_output
        if dimension == "tokens_input":
            return self.tokens_input
        if dimension == "tokens_output":
            return self.tokens_output
        if dimension == "tokens_cached":
            return self.tokens_cached
        if dimension == "tokens_fresh":
            return self.tokens_input - self.tokens_cached
        return self.units


@dataclass(frozen=True, slots=True)
class BudgetHold:
    rules: Sequence[BudgetRule]
    demand: Amounts


class BudgetExceeded(RateLimited):
    default_code = "budget_exceeded"


@dataclass
class _Recent:
    rule_ids: tuple[str, ...]
    amounts: tuple[int, ...]
    committed_at: float | None = None


def free_after(
    minutes: Sequence[tuple[float, int]],
    *,
    over_by: int,
    window_s: int,
    now: float,
    unrolled: int = 0,
) -> float | None:
    """Seconds until enough of the window's minutes have slid out to shed ``over_by``.

    ``minutes`` are (minute start, amount) in time order; ``unrolled`` is usage settled here that
    the rollups may not show yet, which will land in the current minute. A minute leaves the
    window once its end is ``window_s`` old. None when that cannot shed enough (the excess is
    held by requests in flight): the caller retries shortly.
    """
    shed = 0
    current = now - now % 60
    for start, amount in [*minutes, (current, unrolled)]:
        shed += amount
        if shed >= over_by:
            return max(0.0, start + 60.0 + window_s - now)
    return None


class BudgetBook:
    def __init__(self) -> None:
        self._used: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._recent_sum: dict[str, int] = {}
        self._recent: OrderedDict[str, _Recent] = OrderedDict()

    def usage(self, rule_id: str) -> int:
        """What the book counts against a rule now."""
        return (
            self._used.get(rule_id, 0)
            + self._held.get(rule_id, 0)
            + self._recent_sum.get(rule_id, 0)
        )

    def unrolled(self, rule_id: str) -> int:
        """Usage settled here that the last refresh of the rollups did not include."""
        return self._recent_sum.get(rule_id, 0)

    def over(self, rules: Sequence[BudgetRule], demand: Amounts) -> list[tuple[BudgetRule, int]]:
        """Each rule the demand would exceed, with by how much."""
        found = []
        for rule in rules:
            amount = demand.get(rule.dimension)
            if amount > rule.limit:
                raise ReservationTooLarge(
                    f"this request needs {amount} {rule.dimension} but budget rule {rule.id} "
                    f"allows {rule.limit} per {rule.window_s}s; it can never be admitted",
                    param="max_tokens",
                )
            excess = self.usage(rule.id) + amount - rule.limit
            if excess > 0:
                found.append((rule, excess))
        return found

    def hold(self, rules: Sequence[BudgetRule], demand: Amounts) -> BudgetHold:
        for rule in rules:
            self._held[rule.id] = self._held.get(rule.id, 0) + demand.get(rule.dimension)
        return BudgetHold(rules, demand)

    def release(self, hold: BudgetHold) -> None:
        """Give a hold back unused (the request was refused after all)."""
        for rule in hold.rules:
            self._held[rule.id] = self._held.get(rule.id, 0) - hold.demand.get(rule.dimension)

    def settle(self, hold: BudgetHold, used: Amounts, *, request_id: str) -> None:
        """Release the hold; count what was used until the rollups show the record."""
        amounts = []
        for rule in hold.rules:
            self._held[rule.id] = self._held.get(rule.id, 0) - hold.demand.get(rule.dimension)
            amount = used.get(rule.dimension)
            amounts.append(amount)
            self._recent_sum[rule.id] = self._recent_sum.get(rule.id, 0) + amount
        if not hold.rules:
            return
        self._recent[request_id] = _Recent(tuple(r.id for r in hold.rules), tuple(amounts))
        while len(self._recent) > RECENT_LIMIT:
            _, dropped = self._recent.popitem(last=False)
            self._forget(dropped)

    def committed(self, request_ids: Iterable[str], *, at: float | None = None) -> None:
        """The ledger committed these records (called by the ledger writer)."""
        stamp = time.monotonic() if at is None else at
        for request_id in request_ids:
            entry = self._recent.get(request_id)
            if entry is not None and entry.committed_at is None:
                entry.committed_at = stamp

    def refreshed(self, used: Mapping[str, int], *, started_at: float) -> None:
        """New rollup sums from a query that started at ``started_at`` (monotonic clock).

        Records committed before the query started are in its sums, so they stop being
        counted as recent; the ones committed while it ran may be counted twice for one
        refresh, which errs on the side of refusing.
        """
        self._used = dict(used)
        for request_id in [
            rid
            for rid, entry in self._recent.items()
            if entry.committed_at is not None and entry.committed_at < started_at
        ]:
            self._forget(self._recent.pop(request_id))

    def _forget(self, entry: _Recent) -> None:
        for rule_id, amount in zip(entry.rule_ids, entry.amounts, strict=True):
            self._recent_sum[rule_id] = self._recent_sum.get(rule_id, 0) - amount
