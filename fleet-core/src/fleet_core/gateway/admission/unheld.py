"""What requests admitted under no budget rule used, counted until the rollups show it.

A request admitted while no rule applied to it (a rule created a moment ago, not yet in this
gateway's catalog) reserves nothing, so its usage is invisible to a new rule until the rollups
show it. The budget book therefore also keeps what such **unheld** requests used, from their
settlement until the rollups show them (a refresh that started ``grace_s`` after the ledger
committed them, as for held requests), and adds it to the rollups' figure for any rule of their
tenant or project. Most requests of a deployment meet no rule, so each costs one entry here (and
one per ledger batch once committed); a scope's sum is made from the entries when a rule first
asks about it, and kept from then on.

Kept apart from `budget_book`, whose allowances are per rule: these requests belong to no rule,
so what is kept here is per request and per scope (tenant or project).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fleet_core.gateway.admission.directory import BudgetRule

if TYPE_CHECKING:
    from fleet_core.gateway.admission.budget_book import Amounts

__all__ = ["UnheldUsage"]

RECENT_LIMIT = 200_000
"""Unheld requests tracked until the rollups show them (settled, and committed apart); beyond
this the oldest leaves at once, as if rolled up."""

SCOPES_KEPT = 10_000
"""Tenants and projects whose sums are kept; beyond this they are summed again when next asked."""

_Unheld = tuple[str, str, "Amounts"]
"""An unheld request's tenant, project and what it used."""


class UnheldUsage:
    """What unheld requests used, per request until the rollups show it, and summed per scope.

    ``counting``: whether to count at all (only when a ledger commits this gateway's records,
    since only then does anything say when the rollups show them). ``nothing``: the zero of
    `budget_book.Amounts` (`budget_book.NOTHING`) a scope's sum starts from, passed in because
    that module builds this one.
    """

    def __init__(self, *, counting: bool, nothing: Amounts) -> None:
        self._counting = counting
        self._nothing = nothing
        self._unheld: dict[str, _Unheld] = {}
        """Request id -> tenant, project and what an unheld request used, from its settlement
        until the ledger commits its record, oldest first."""
        self._committed: deque[tuple[float, list[_Unheld]]] = deque()
        """(commit time, the unheld requests of one ledger batch), in commit order, until a
        refresh past the grace drops them."""
        self._committed_count = 0
        """The requests in `_committed`."""
        self._watched_tenants: dict[str, Amounts] = {}
        """Tenant -> what its unheld requests tracked here used: only for the scopes a rule was
        asked about (`usage`), summed from the requests when first asked, then kept as
        requests come and go. Most requests meet no rule: they add nothing to any sum."""
        self._watched_projects: dict[tuple[str, str], Amounts] = {}
        """(tenant, project) -> the same, per project."""

    def usage(self, rule: BudgetRule) -> int:
        """What unheld requests of ``rule``'s scope used that the rollups may not show yet."""
        if not self._unheld and not self._committed:  # every request here was held
            return 0
        if rule.scope_kind == "tenant":
            found = self._watched_tenants.get(rule.scope_id)
            if found is None:
                found = self._watch(rule.scope_id, None)
        else:
            tenant, _, project = rule.scope_id.partition("/")
            found = self._watched_projects.get((tenant, project))
            if found is None:
                found = self._watch(tenant, project)
        return found.get(rule.dimension)

    def _watch(self, tenant: str, project: str | None) -> Amounts:
        """Start keeping the unheld sum of ``tenant`` (``project`` None) or of one of its
        projects: summed once from the requests tracked now, kept from then on."""
        if len(self._watched_tenants) + len(self._watched_projects) >= SCOPES_KEPT:
            self._watched_tenants.clear()  # (summed again when next asked)
            self._watched_projects.clear()
        total = self._nothing
        batches = (batch for _, batch in self._committed)
        for t, p, used in itertools.chain(self._unheld.values(), *batches):
            if t == tenant and (project is None or p == project):
                total = total + used
        if project is None:
            self._watched_tenants[tenant] = total
        else:
            self._watched_projects[(tenant, project)] = total
        return total

    def _rewatch(self, tenant: str, project: str, used: Amounts, *, out: bool = False) -> None:
        """Count ``used`` in (``out``: take it out of) the sums of its scopes kept here."""
        tenants, projects = self._watched_tenants, self._watched_projects
        found = tenants.get(tenant)
        if found is not None:
            tenants[tenant] = found - used if out else found + used
        pair = (tenant, project)
        found = projects.get(pair)
        if found is not None:
            projects[pair] = found - used if out else found + used

    def settle(self, tenant: str, project: str, used: Amounts, *, request_id: str) -> None:
        """Count what a request admitted under no rule used, until the rollups show it.
        Written for few operations: most requests pass here (a scope with no rule), and add
        to a sum only where a rule was asked about its scope."""
        unheld = self._unheld
        if not self._counting or used == self._nothing or request_id in unheld:
            return
        unheld[request_id] = (tenant, project, used)
        if self._watched_tenants or self._watched_projects:
            self._rewatch(tenant, project, used)
        if len(unheld) > RECENT_LIMIT:  # the oldest leaves at once, as if rolled up
            self._uncount([unheld.pop(next(iter(unheld)))])

    def committed(self, request_ids: Iterable[str], stamp: float) -> None:
        """The ledger committed these records at ``stamp`` (those of unheld requests leave once
        a refresh past the grace returns: `drop`)."""
        unheld = self._unheld
        if not unheld:
            return
        moved = []
        for request_id in request_ids:
            gone = unheld.pop(request_id, None)
            if gone is not None:
                moved.append(gone)
        if moved:  # one entry per batch: a refresh drops it whole, with no work per request
            self._committed.append((stamp, moved))
            self._committed_count += len(moved)

    def drop(self, cutoff: float) -> None:
        """Unheld requests committed before ``cutoff`` leave: the rollups show them now."""
        committed = self._committed
        while committed and committed[0][0] < cutoff:  # commit times only grow
            self._uncount(committed.popleft()[1], committed=True)
        while self._committed_count > RECENT_LIMIT:  # (refreshes failing meanwhile)
            stamp, batch = committed.popleft()  # the oldest leave, as if rolled up
            excess = self._committed_count - RECENT_LIMIT
            if len(batch) > excess:
                committed.appendleft((stamp, batch[excess:]))
                batch = batch[:excess]
            self._uncount(batch, committed=True)

    def _uncount(self, gone: list[_Unheld], *, committed: bool = False) -> None:
        """Unheld requests leave: their use out of the sums kept for rules' scopes."""
        if committed:
            self._committed_count -= len(gone)
        if self._watched_tenants or self._watched_projects:
            for tenant, project, used in gone:
                self._rewatch(tenant, project, used, out=True)
