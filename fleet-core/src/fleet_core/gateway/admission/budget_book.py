"""Budget rules at admission: rolling-window limits checked against the ledger's rollups (P5).

A rule's usage is two parts:

- ``used``: the rule's sum over the ledger's per-minute rollups inside its window, refreshed by a
  background query every second (``refreshed``); its cost follows the number of minutes in the
  window, never the number of ledger rows. Every gateway reads it for itself.
- every gateway's **allowance** in the rule's book, kept in the limit store beside the token
  buckets (Redis when there is one, so every gateway sees every other's; `limits.Hold`): one
  entry per gateway process per rule, holding what its requests in flight reserved, what its
  settled requests used that the rollups may not show yet, and a **slack** it may admit from
  on its own.

A request whose demand fits the slack of every rule that applies is admitted here, with no
store work for its budgets at all (all rules or none). One that does not fit asks the store, in
the same atomic call as its token buckets, to grow this gateway's entries: by at least what is
missing (refused if ``used + every entry + that`` would pass the limit: exact, naming the rule
and the excess) plus some slack for the next requests, sized from recent use and capped by the
store at a small share of the room the rule has left, so that near a limit the slack is nothing
and every request is judged against every gateway's entries, as one entry per request was.
Settlement moves a request's amounts from in flight to settled, giving the unused part back to
the slack (a store write only when the request used more than the slack can cover). Once the
rollups show a settled request — a refresh that started at least ``grace_s`` after the ledger
committed it, so every other gateway's refresh has seen it too — its use leaves the entry; each
refresh also gives back the slack recent use no longer needs. Every change to an entry is a
signed delta the store applies exactly once (ADR 0004). Each entry expires ``ttl_s`` after it
was last written; the gateway touches its own while it lives, so only a crashed gateway's
allowance expires (after at most ``ttl_s``).

The allowances themselves, and the sets of rules requests meet, worked out once, are in
`allowances`; what requests admitted under no rule used, added to ``used`` for the rules of
their tenant or project until the rollups show it, is in `unheld`.

Everything is integer arithmetic. ADR 0004 says what is still approximate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from fleet_core.gateway.admission.allowances import Allowance, RuleSet, RuleSets
from fleet_core.gateway.admission.directory import BudgetDimension, BudgetRule
from fleet_core.gateway.admission.limits import Hold, HoldUpdate
from fleet_core.gateway.admission.unheld import UnheldUsage
from fleet_core.shared.errors import ReservationTooLarge

__all__ = [
    "Amounts",
    "BudgetBook",
    "BudgetHold",
]

RECENT_LIMIT = 200_000
"""Settled requests tracked until the rollups show them; beyond this the oldest is treated as
committed now (its use leaves the entry a grace later, as if the rollups showed it)."""

SLACK_S = 0.5
"""The slack a growth asks for, and a refresh leaves: what the rule's requests here admitted in
this many seconds lately (at least `SLACK_REQUESTS` of the asking request's demand). The store
caps it at a share of the rule's room (`lib_holds.lua`'s SLACK_SHARE)."""

SLACK_REQUESTS = 4
"""The least slack a growth asks for, in multiples of the asking request's own demand."""


class Amounts(msgspec.Struct, frozen=True):
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

    def vector(self) -> tuple[int, ...]:
        """Every dimension's figure, in `allowances.DIMENSIONS` order (`allowances.picker` reads
        a set of rules')."""
        return (
            self.tokens_input + self.tokens_output,
            self.tokens_input,
            self.tokens_output,
            self.tokens_cached,
            self.tokens_input - self.tokens_cached,
            self.units,
        )

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(
            self.tokens_input + other.tokens_input,
            self.tokens_output + other.tokens_output,
            self.tokens_cached + other.tokens_cached,
            self.units + other.units,
        )

    def __sub__(self, other: Amounts) -> Amounts:
        return Amounts(
            self.tokens_input - other.tokens_input,
            self.tokens_output - other.tokens_output,
            self.tokens_cached - other.tokens_cached,
            self.units - other.units,
        )


NOTHING = Amounts()


class BudgetHold(msgspec.Struct, frozen=True, gc=False):
    """A request's reservation against its rules: its amount per rule, counted in this
    gateway's allowances, and (only when it had to ask the store to grow them) its asks, whose
    grants the store fills in. Untracked by the garbage collector (``gc=False``: it can take part
    in no cycle)."""

    set: RuleSet
    demand: Amounts
    amounts: tuple[int, ...]
    asks: tuple[Hold, ...] = ()

    @property
    def rules(self) -> tuple[BudgetRule, ...]:
        return self.set.rules

    @property
    def allowances(self) -> tuple[Allowance, ...]:
        return self.set.allowances


class BudgetBook:
    """The rules' rollup figures and this gateway's own allowances.

    ``ttl_s``: an entry expires this long after it was last written (its owner writes it again
    at most ``ttl_s / 2`` later: `touches`). ``grace_s``: a settled request's use leaves its
    entries once a refresh that started this long after the ledger committed its record has
    returned (twice the refresh interval: by then every gateway refreshing on schedule has read
    the record from the rollups). ``ledger``: whether a ledger commits this gateway's records
    (database mode); only then are unheld requests counted, since only then does anything tell
    the book when the rollups show them.
    """

    def __init__(
        self, *, prefix: str = "", ttl_s: float = 60.0, grace_s: float = 2.0, ledger: bool = False
    ) -> None:
        self._nonce = secrets.token_hex(8)
        self.owner = f"g{self._nonce}"
        """This gateway's entry in every book: 64 random bits per process."""
        self._serial = itertools.count()
        """Grant ids (a growth's, to undo it exactly once if its outcome is unknown)."""
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._rule_sets = RuleSets(prefix=prefix)
        """This gateway's allowance in each rule's book, and each set of rules met."""
        # The rule sets' and the unheld requests' own methods, bound once: every request finds
        # its set, and most pass `settle_unheld`; a method here that only passed the call on
        # would cost a frame each time.
        self._rule_set = self._rule_sets.find
        self._unheld = UnheldUsage(counting=ledger, nothing=NOTHING)
        self.settle_unheld = self._unheld.settle
        """Count what a request admitted under no rule used, until the rollups show it."""
        self._generation = 0
        """Refreshes so far: a rule set known in this generation needs no check of its ids."""
        self._grace_s = grace_s
        self._used: dict[str, int] = {}
        self.loaded = False
        """Whether the rollup figures were read at least once (before that, refuse)."""
        self._flying = 0
        """Reservations admitted (or asking) and not yet settled or released."""
        self._settled: dict[str, tuple[tuple[Allowance, ...], tuple[int, ...]]] = {}
        """Request id (unique: the gateway mints it) -> its allowances and what it used in
        each, for requests settled and not yet committed, oldest first."""
        self._commits: deque[tuple[float, dict[str, int]]] = deque()
        """(commit time, book key -> use) per committed batch, in commit order: a refresh
        takes the oldest ones its cutoff passed out of the entries."""
        self._touched_at = time.monotonic()
        self._refreshed_at: float | None = None
        self.wanted = asyncio.Event()
        """Set when a request meets a rule the last refresh did not cover: refresh now."""
        self._learned = asyncio.Event()

    @property
    def ttl_s(self) -> float:
        return self._ttl_ms / 1000

    def usage(self, rule: BudgetRule) -> int:
        """What counts against a rule besides the entries: its rollups (as last read) and what
        unheld requests of its scope used that the rollups may not show yet."""
        return self._used.get(rule.id, 0) + self._unheld.usage(rule)

    def knows(self, rules: Sequence[BudgetRule]) -> bool:
        """Whether the last refresh covered every one of ``rules`` (a new rule: not yet)."""
        return self._knows(self._rule_set(rules))

    def _knows(self, found: RuleSet) -> bool:
        if found.known != self._generation:
            if not all(rule.id in self._used for rule in found.rules):
                return False
            found.known = self._generation
        return True

    async def learn(self, rules: Sequence[BudgetRule], *, timeout_s: float) -> bool:
        """Ask for a refresh and wait until it covers ``rules``; False if it did not in time."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not self.knows(rules):
                    self.wanted.set()
                    await self._learned.wait()
        return self.knows(rules)

    def unrolled(self, rule: BudgetRule) -> int:
        """Usage settled here that the rollups may not show yet (held or not)."""
        found = self._rule_sets.allowance(rule)
        return self._unheld.usage(rule) + (found.unrolled if found is not None else 0)

    def own(self) -> int:
        """How many requests this gateway tracks (in flight, or settled and not committed)."""
        return self._flying + len(self._settled)

    def allowance(self, rule: BudgetRule) -> tuple[int, int, int]:
        """This gateway's (allowance, in flight, unrolled) in ``rule``'s book (for checks)."""
        found = self._rule_sets.allowance(rule)
        return (0, 0, 0) if found is None else (found.allowance, found.in_flight, found.unrolled)

    def admit(
        self, rules: Sequence[BudgetRule], demand: Amounts
    ) -> tuple[BudgetHold, list[Hold]] | None:
        """`check`, `knows` and `hold` in one, the rules worked out once (every budgeted request
        passes here): the hold and its asks, or None when the last refresh did not cover every
        rule (the caller `learn`s, then admits again)."""
        found = self._rule_set(rules)
        self._check(found, demand)
        if found.known != self._generation and not self._knows(found):
            return None
        return self._hold(found, demand)

    def check(self, rules: Sequence[BudgetRule], demand: Amounts) -> None:
        """400 for a demand above a rule's whole limit: it could never be admitted."""
        self._check(self._rule_set(rules), demand)

    def _check(self, found: RuleSet, demand: Amounts) -> None:
        # A demand's figures are counts (cached within input), so every dimension's is at most
        # tokens_total or units: both under the smallest limit, no rule can refuse (the usual
        # case, with no work per rule).
        smallest = found.smallest
        if demand.tokens_input + demand.tokens_output <= smallest and demand.units <= smallest:
            return
        for rule, amount in zip(found.rules, found.pick(demand.vector()), strict=True):
            if amount > rule.limit:
                raise ReservationTooLarge(
                    f"this request needs {amount} {rule.dimension} but budget rule {rule.id} "
                    f"allows {rule.limit} per {rule.window_s}s; it can never be admitted",
                    param="max_tokens",
                )

    def hold(self, rules: Sequence[BudgetRule], demand: Amounts) -> tuple[BudgetHold, list[Hold]]:
        """Reserve ``demand`` against ``rules``: from the slack when every rule's fits (no asks),
        else the asks that grow this gateway's entries, one per rule in ``rules`` order. Counted
        from now on; a reservation that does not complete must be given back (`release`)."""
        return self._hold(self._rule_set(rules), demand)

    def _hold(self, found: RuleSet, demand: Amounts) -> tuple[BudgetHold, list[Hold]]:
        allowances = found.allowances
        amounts = found.pick(demand.vector())
        self._flying += 1
        # One pass, taking as it goes (a loop: it runs on every request); a rule whose slack
        # does not cover its part gives back what the ones before it took. The zips here and in
        # `settle` and `_commit` name no `strict` (`pick` gives one amount per rule): a keyword
        # makes zip's call about 500 instructions dearer, and `enumerate` more again.
        taken = 0
        for allowance, amount in zip(allowances, amounts):  # noqa: B905
            if (
                amount
                > allowance.allowance
                - allowance.in_flight
                - allowance.unrolled
                - allowance.withheld
            ):
                for back, given in zip(allowances[:taken], amounts):  # noqa: B905
                    back.in_flight -= given
                    back.admitted -= given
                break
            allowance.in_flight += amount
            allowance.admitted += amount
            taken += 1  # noqa: SIM113
        else:
            return BudgetHold(found, demand, amounts), []
        return self._ask(found, demand, amounts)

    def _ask(
        self, found: RuleSet, demand: Amounts, amounts: tuple[int, ...]
    ) -> tuple[BudgetHold, list[Hold]]:
        grant = f"{self._nonce}{next(self._serial):x}"
        asks: list[Hold] = []
        for rule, allowance, amount in zip(found.rules, found.allowances, amounts, strict=True):
            need = max(0, amount - max(0, allowance.slack))
            extra = max(SLACK_REQUESTS * amount, allowance.recent)
            base = self._used.get(rule.id, 0) + self._unheld.usage(rule)
            asks.append(
                Hold(
                    allowance.key,
                    self.owner,
                    grant,
                    need,
                    extra,
                    rule.limit,
                    base,
                    allowance.confirmed,
                    self._ttl_ms,
                )
            )
            # Counted at once as if granted, so that a request meanwhile does not ask for it too.
            allowance.allowance += need
            allowance.asking += need
            allowance.in_flight += amount
            allowance.admitted += amount
        return BudgetHold(found, demand, amounts, tuple(asks)), asks

    def placed(self, hold: BudgetHold) -> bool:
        """After the store admitted ``hold``: count what its asks were granted. False if the
        store did not answer (admitted open): then the caller gives the hold back (`release`)."""
        if any(ask.granted is None for ask in hold.asks):
            return False
        now = time.monotonic()
        for ask, allowance in zip(hold.asks, hold.set.allowances, strict=True):
            allowance.allowance += (ask.granted or 0) - ask.need
            allowance.asking -= ask.need
            allowance.written_at = now
        return True

    def release(self, hold: BudgetHold) -> list[HoldUpdate]:
        """Give a reservation back unused (refused, the store failed, the caller left). A grant
        the store answered stays as slack; one whose answer was lost is undone in the store,
        exactly once, whether or not it was made."""
        self._flying -= 1
        undo: list[HoldUpdate] = []
        for index, (allowance, amount) in enumerate(
            zip(hold.set.allowances, hold.amounts, strict=True)
        ):
            allowance.in_flight -= amount  # (it stays in `admitted`: demand met, sizing slack)
            if not hold.asks:
                continue
            ask = hold.asks[index]
            allowance.asking -= ask.need
            if ask.granted is None:
                allowance.allowance -= ask.need
                undo.append(self._update(allowance, 0, grant=ask.grant))
            else:
                allowance.allowance += ask.granted - ask.need
        return undo

    def settle(self, hold: BudgetHold, used: Amounts, *, request_id: str) -> list[HoldUpdate]:
        """Move the request from in flight to settled: its use stays in the entries until the
        rollups show it, the unused part of its reservation goes back to the slack. Written to
        the store only when the request used more than its reservation and the slack together
        (an overrun: the entry grows at once, unchecked, as a bucket may go below zero)."""
        self._flying -= 1
        found = hold.set
        amounts = found.pick(used.vector())
        grown: list[HoldUpdate] = []
        allowances, reservations = found.allowances, hold.amounts
        for allowance, reserved, amount in zip(allowances, reservations, amounts):  # noqa: B905
            allowance.in_flight -= reserved
            allowance.unrolled += amount
            short = allowance.in_flight + allowance.unrolled - allowance.allowance
            if short > 0:
                allowance.allowance += short
                grown.append(self._update(allowance, short))
        settled = self._settled
        settled[request_id] = (found.allowances, amounts)
        if len(settled) > RECENT_LIMIT:
            self._commit([settled.pop(next(iter(settled)))], time.monotonic())
        return grown

    def committed(self, request_ids: Iterable[str], *, at: float | None = None) -> None:
        """The ledger committed these records (called by the ledger writer, per batch): their
        use, summed per rule, leaves the entries once a refresh past the grace returns."""
        stamp = time.monotonic() if at is None else at
        settled, found, missed = self._settled, [], []
        for request_id in request_ids:
            entry = settled.pop(request_id, None)
            if entry is not None:
                found.append(entry)
            else:
                missed.append(request_id)
        if found:
            self._commit(found, stamp)
        if missed:  # (unheld requests', or records of no request tracked here)
            self._unheld.committed(missed, stamp)

    def _commit(
        self, entries: list[tuple[tuple[Allowance, ...], tuple[int, ...]]], stamp: float
    ) -> None:
        sums: dict[str, int] = {}
        for allowances, used in entries:
            for allowance, amount in zip(allowances, used):  # noqa: B905 (see `_hold`)
                sums[allowance.key] = sums.get(allowance.key, 0) + amount
        self._commits.append((stamp, sums))

    def refreshed(self, used: Mapping[str, int], *, started_at: float) -> list[HoldUpdate]:
        """New rollup sums from a query that started at ``started_at`` (monotonic clock); the
        entry changes that follow: use every gateway's rollups now show taken out, slack that
        recent use does not need given back.

        A record committed while the query ran may be counted twice for a moment (in the sums
        and in its entry), which errs on the side of refusing.
        """
        self._used = dict(used)
        self._generation += 1
        self.loaded = True
        self._learned.set()  # wakes whoever waits in `learn`; the next ones wait on a new one
        self._learned = asyncio.Event()
        cutoff = started_at - self._grace_s
        self._unheld.drop(cutoff)
        commits, allowances = self._commits, self._rule_sets.allowances
        rolled: dict[str, int] = {}
        while commits and commits[0][0] < cutoff:  # commit times only grow (monotonic clock)
            for key, amount in commits.popleft()[1].items():
                rolled[key] = rolled.get(key, 0) + amount
        elapsed = SLACK_S if self._refreshed_at is None else started_at - self._refreshed_at
        self._refreshed_at = started_at
        updates: list[HoldUpdate] = []
        for key, allowance in allowances.items():
            # Use the rollups show now leaves the entry (it is in every gateway's base), and
            # so does slack that recent admissions here do not need.
            allowance.recent = round(allowance.admitted * SLACK_S / max(elapsed, SLACK_S))
            allowance.admitted = 0
            if allowance.withheld:  # the limit was lowered: give back every grant made under it
                allowance.withheld, allowance.recent = 0, 0
            out = rolled.get(key, 0)
            allowance.unrolled -= out
            allowance.allowance -= out
            spare = max(0, allowance.slack - allowance.recent)
            allowance.allowance -= spare
            if out + spare > 0:
                updates.append(self._update(allowance, -(out + spare)))
        if not self._flying and not self._commits:  # no request holds a rule set
            self._rule_sets.forget_idle()
        return updates

    def touches(self, *, now: float | None = None, everything: bool = False) -> list[HoldUpdate]:
        """Every ``ttl_s / 4``, the entries holding something and not written for that long,
        written again for another ``ttl_s``: none goes unwritten for more than ``ttl_s / 2``.
        A touch carries the whole allowance, so that an entry the store lost (it expired while
        this gateway could not reach the store, or the store restarted empty) is made again;
        ``everything`` touches every entry holding something now (the store lost them)."""
        now = time.monotonic() if now is None else now
        quarter = 0.0 if everything else self.ttl_s / 4
        if now - self._touched_at < quarter:
            return []
        self._touched_at = now
        return [
            self._update(a, 0, now=now)
            for a in self._rule_sets.allowances.values()
            if a.allowance > 0 and now - a.written_at >= quarter
        ]

    def _update(
        self, allowance: Allowance, delta: int, *, grant: str = "", now: float | None = None
    ) -> HoldUpdate:
        allowance.written_at = time.monotonic() if now is None else now
        return HoldUpdate(
            allowance.key, self.owner, delta, allowance.confirmed, self._ttl_ms, grant=grant
        )
