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
signed delta the store applies exactly once (ADR 0004, session 10). Each entry expires ``ttl_s``
after it was last written; the gateway touches its own while it lives, so only a crashed
gateway's allowance expires (after at most ``ttl_s``).

A request admitted while no rule applied to it (a rule created a moment ago, not yet in this
gateway's catalog) reserves nothing, so its usage is invisible to a new rule until the rollups
show it. The book therefore also keeps what such **unheld** requests used, from their settlement
until the rollups show them (the same rule as for settled requests), and adds it to ``used`` for
any rule of their tenant or project. Most requests of a deployment meet no rule, so each costs one
entry (and one per ledger batch once committed); a scope's sum is made from the entries when a
rule first asks about it, and kept from then on.

Everything is integer arithmetic. ADR 0004 says what is still approximate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import operator
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from fleet_core.gateway.admission.directory import BudgetDimension, BudgetRule
from fleet_core.gateway.admission.limits import Hold, HoldUpdate
from fleet_core.shared.errors import RateLimited, ReservationTooLarge

__all__ = [
    "Amounts",
    "BudgetBook",
    "BudgetExceeded",
    "BudgetHold",
    "book_key",
    "free_after",
]

RECENT_LIMIT = 200_000
"""Settled requests tracked until the rollups show them; beyond this the oldest is treated as
committed now (its use leaves the entry a grace later, as if the rollups showed it)."""

KEY_CACHE_SIZE = 10_000
"""Sets of rules whose allowances are looked up once; beyond this the cache starts again."""

ALLOWANCES_KEPT = 10_000
"""Rules with an allowance kept here; beyond this the idle ones (holding nothing) are forgotten."""

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
        """Every dimension's figure, in `DIMENSIONS` order (`picker` reads a set of rules')."""
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

DIMENSIONS: tuple[BudgetDimension, ...] = (
    "tokens_total",
    "tokens_input",
    "tokens_output",
    "tokens_cached",
    "tokens_fresh",
    "units",
)
"""The order of `Amounts.vector`."""

Picker = Callable[[tuple[int, ...]], tuple[int, ...]]


def picker(rules: Sequence[BudgetRule]) -> Picker:
    """A function from `Amounts.vector` to each rule's figure, in ``rules`` order: made once
    per set of rules, it reads a request's amounts in C (``itemgetter``) rather than by a call
    per rule (about 0.6 µs per request less, twice: admission and settlement)."""
    at = [DIMENSIONS.index(rule.dimension) for rule in rules]
    if len(at) == 1:
        only = at[0]
        return lambda vector: (vector[only],)
    if not at:
        return lambda vector: ()
    return operator.itemgetter(*at)


@dataclass(slots=True)
class _Allowance:
    """This gateway's entry in one rule's book, as it means it to be. The store holds
    ``allowance`` once every delta sent has landed; ``slack`` is what may be admitted here
    without asking. A plain class with slots, not a msgspec struct: every request writes its
    fields several times, and a struct's own ``__setattr__`` keeps the interpreter from
    specializing those writes (about 500 instructions each instead of a few dozen)."""

    key: str
    """The rule's book in the store."""
    allowance: int = 0
    asking: int = 0
    """Growths asked for and not answered yet: counted in ``allowance`` as if granted, not in
    what the store is told the entry is (`confirmed`)."""
    in_flight: int = 0
    """Reserved by requests admitted and not yet settled."""
    unrolled: int = 0
    """Used by settled requests the rollups may not show yet."""
    withheld: int = 0
    """Slack not to be admitted from: granted under a limit since lowered; given back at the
    next refresh."""
    limit: int = 0
    """The rule's limit as this gateway last met it."""
    admitted: int = 0
    """Demand admitted since the last refresh (sizes the slack)."""
    recent: int = 0
    """Demand admitted per `SLACK_S`, as the last refresh measured it."""
    written_at: float = 0.0
    """When the store was last given this entry (monotonic clock)."""

    @property
    def slack(self) -> int:
        return self.allowance - self.in_flight - self.unrolled - self.withheld

    @property
    def confirmed(self) -> int:
        """The entry as the store has it once every answered change has landed: what an entry
        the store lost is made again at. Growths still on their way are left out, or each would
        count twice: in the entry made again, and again when it lands."""
        return self.allowance - self.asking


class _RuleSet(msgspec.Struct, gc=False):
    """A set of rules requests meet together (a principal's, in one catalog snapshot), worked
    out once: their allowances here, the `picker` that reads each rule's part of a request,
    their smallest limit, and the refresh that last covered them all. Untracked by the
    collector: it refers to nothing that refers back to it."""

    rules: tuple[BudgetRule, ...]
    allowances: tuple[_Allowance, ...]
    pick: Picker
    smallest: int
    """The smallest of the rules' limits."""
    known: int = -1
    """The `BudgetBook` refresh generation in which every rule had figures (-1: not yet)."""


class BudgetHold(msgspec.Struct, frozen=True, gc=False):
    """A request's reservation against its rules: its amount per rule, counted in this
    gateway's allowances, and (only when it had to ask the store to grow them) its asks, whose
    grants the store fills in. Untracked by the garbage collector (``gc=False``: it can take part
    in no cycle)."""

    set: _RuleSet
    demand: Amounts
    amounts: tuple[int, ...]
    asks: tuple[Hold, ...] = ()

    @property
    def rules(self) -> tuple[BudgetRule, ...]:
        return self.set.rules

    @property
    def allowances(self) -> tuple[_Allowance, ...]:
        return self.set.allowances


class BudgetExceeded(RateLimited):
    default_code = "budget_exceeded"


_Unheld = tuple[str, str, "Amounts"]
"""An unheld request's tenant, project and what it used."""


def book_key(rule: BudgetRule, *, prefix: str = "") -> str:
    """Where a rule's book (every gateway's entry) lives in the store: under its tenant's hash
    tag, like its buckets."""
    tenant = rule.scope_id.partition("/")[0]
    return f"{prefix}fleet:budget:{{{tenant}}}:{rule.id}"


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
        self._prefix = prefix
        self._nonce = secrets.token_hex(8)
        self.owner = f"g{self._nonce}"
        """This gateway's entry in every book: 64 random bits per process."""
        self._serial = itertools.count()
        """Grant ids (a growth's, to undo it exactly once if its outcome is unknown)."""
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._allowances: dict[str, _Allowance] = {}
        """Book key -> this gateway's allowance in it."""
        self._sets: dict[tuple[BudgetRule, ...], _RuleSet] = {}
        """Each set of rules a request met, worked out once."""
        self._same: dict[int, tuple[tuple[BudgetRule, ...], _RuleSet]] = {}
        """The same, by the identity of the tuple the directory hands out for a principal (it
        keeps the tuple alive, so the id is not reused): no hashing of rules per request."""
        self._generation = 0
        """Refreshes so far: a rule set known in this generation needs no check of its ids."""
        self._grace_s = grace_s
        self._used: dict[str, int] = {}
        self.loaded = False
        """Whether the rollup figures were read at least once (before that, refuse)."""
        self._flying = 0
        """Reservations admitted (or asking) and not yet settled or released."""
        self._settled: dict[str, tuple[tuple[_Allowance, ...], tuple[int, ...]]] = {}
        """Request id (unique: the gateway mints it) -> its allowances and what it used in
        each, for requests settled and not yet committed, oldest first."""
        self._commits: deque[tuple[float, dict[str, int]]] = deque()
        """(commit time, book key -> use) per committed batch, in commit order: a refresh
        takes the oldest ones its cutoff passed out of the entries."""
        self._ledger = ledger
        self._unheld: dict[str, _Unheld] = {}
        """Request id -> tenant, project and what an unheld request used, from its settlement
        until the ledger commits its record, oldest first."""
        self._unheld_committed: deque[tuple[float, list[_Unheld]]] = deque()
        """(commit time, the unheld requests of one ledger batch), in commit order, until a
        refresh past the grace drops them."""
        self._unheld_committed_count = 0
        """The requests in `_unheld_committed`."""
        self._watched_tenants: dict[str, Amounts] = {}
        """Tenant -> what its unheld requests tracked here used: only for the scopes a rule was
        asked about (`_unheld_usage`), summed from the requests when first asked, then kept as
        requests come and go. Most requests meet no rule: they add nothing to any sum."""
        self._watched_projects: dict[tuple[str, str], Amounts] = {}
        """(tenant, project) -> the same, per project."""
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
        return self._used.get(rule.id, 0) + self._unheld_usage(rule)

    def _unheld_usage(self, rule: BudgetRule) -> int:
        if not self._unheld and not self._unheld_committed:  # every request here was held
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
        if len(self._watched_tenants) + len(self._watched_projects) >= KEY_CACHE_SIZE:
            self._watched_tenants.clear()  # (summed again when next asked)
            self._watched_projects.clear()
        total = NOTHING
        batches = (batch for _, batch in self._unheld_committed)
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

    def knows(self, rules: Sequence[BudgetRule]) -> bool:
        """Whether the last refresh covered every one of ``rules`` (a new rule: not yet)."""
        return self._knows(self._rule_set(rules))

    def _knows(self, found: _RuleSet) -> bool:
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
        found = self._allowances.get(book_key(rule, prefix=self._prefix))
        return self._unheld_usage(rule) + (found.unrolled if found is not None else 0)

    def own(self) -> int:
        """How many requests this gateway tracks (in flight, or settled and not committed)."""
        return self._flying + len(self._settled)

    def allowance(self, rule: BudgetRule) -> tuple[int, int, int]:
        """This gateway's (allowance, in flight, unrolled) in ``rule``'s book (for checks)."""
        found = self._allowances.get(book_key(rule, prefix=self._prefix))
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

    def _check(self, found: _RuleSet, demand: Amounts) -> None:
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

    def _hold(self, found: _RuleSet, demand: Amounts) -> tuple[BudgetHold, list[Hold]]:
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
        self, found: _RuleSet, demand: Amounts, amounts: tuple[int, ...]
    ) -> tuple[BudgetHold, list[Hold]]:
        grant = f"{self._nonce}{next(self._serial):x}"
        asks: list[Hold] = []
        for rule, allowance, amount in zip(found.rules, found.allowances, amounts, strict=True):
            need = max(0, amount - max(0, allowance.slack))
            extra = max(SLACK_REQUESTS * amount, allowance.recent)
            base = self._used.get(rule.id, 0) + self._unheld_usage(rule)
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

    def settle_unheld(self, tenant: str, project: str, used: Amounts, *, request_id: str) -> None:
        """Count what a request admitted under no rule used, until the rollups show it.
        Written for few operations: most requests pass here (a scope with no rule), and add
        to a sum only where a rule was asked about its scope."""
        unheld = self._unheld
        if not self._ledger or used == NOTHING or request_id in unheld:
            return
        unheld[request_id] = (tenant, project, used)
        if self._watched_tenants or self._watched_projects:
            self._rewatch(tenant, project, used)
        if len(unheld) > RECENT_LIMIT:  # the oldest leaves at once, as if rolled up
            self._uncount_unheld([unheld.pop(next(iter(unheld)))])

    def committed(self, request_ids: Iterable[str], *, at: float | None = None) -> None:
        """The ledger committed these records (called by the ledger writer, per batch): their
        use, summed per rule, leaves the entries once a refresh past the grace returns."""
        stamp = time.monotonic() if at is None else at
        settled, unheld, found, moved = self._settled, self._unheld, [], []
        for request_id in request_ids:
            entry = settled.pop(request_id, None)
            if entry is not None:
                found.append(entry)
            elif unheld:
                gone = unheld.pop(request_id, None)
                if gone is not None:
                    moved.append(gone)
        if found:
            self._commit(found, stamp)
        if moved:  # one entry per batch: a refresh drops it whole, with no work per request
            self._unheld_committed.append((stamp, moved))
            self._unheld_committed_count += len(moved)

    def _commit(
        self, entries: list[tuple[tuple[_Allowance, ...], tuple[int, ...]]], stamp: float
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
        self._drop_unheld(cutoff)
        commits, allowances = self._commits, self._allowances
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
        self._forget_idle()
        return updates

    def _forget_idle(self) -> None:
        if len(self._allowances) <= ALLOWANCES_KEPT or self._flying or self._commits:
            return
        self._allowances = {
            key: a for key, a in self._allowances.items() if a.allowance or a.in_flight
        }
        self._sets.clear()
        self._same.clear()

    def _drop_unheld(self, cutoff: float) -> None:
        committed = self._unheld_committed
        while committed and committed[0][0] < cutoff:  # commit times only grow
            self._uncount_unheld(committed.popleft()[1], committed=True)
        while self._unheld_committed_count > RECENT_LIMIT:  # (refreshes failing meanwhile)
            stamp, batch = committed.popleft()  # the oldest leave, as if rolled up
            excess = self._unheld_committed_count - RECENT_LIMIT
            if len(batch) > excess:
                committed.appendleft((stamp, batch[excess:]))
                batch = batch[:excess]
            self._uncount_unheld(batch, committed=True)

    def _uncount_unheld(self, gone: list[_Unheld], *, committed: bool = False) -> None:
        """Unheld requests leave: their use out of the sums kept for rules' scopes."""
        if committed:
            self._unheld_committed_count -= len(gone)
        if self._watched_tenants or self._watched_projects:
            for tenant, project, used in gone:
                self._rewatch(tenant, project, used, out=True)

    def touches(self, *, now: float | None = None) -> list[HoldUpdate]:
        """Every ``ttl_s / 4``, the entries holding something and not written for that long,
        written again for another ``ttl_s``: none goes unwritten for more than ``ttl_s / 2``.
        A touch carries the whole allowance, so that an entry the store lost (it expired while
        this gateway could not reach the store) is made again."""
        now = time.monotonic() if now is None else now
        quarter = self.ttl_s / 4
        if now - self._touched_at < quarter:
            return []
        self._touched_at = now
        return [
            self._update(a, 0, now=now)
            for a in self._allowances.values()
            if a.allowance > 0 and now - a.written_at >= quarter
        ]

    def _update(
        self, allowance: _Allowance, delta: int, *, grant: str = "", now: float | None = None
    ) -> HoldUpdate:
        allowance.written_at = time.monotonic() if now is None else now
        return HoldUpdate(
            allowance.key, self.owner, delta, allowance.confirmed, self._ttl_ms, grant=grant
        )

    def _rule_set(self, rules: Sequence[BudgetRule]) -> _RuleSet:
        """``rules`` worked out once: found by the identity of the directory's tuple on every
        request after the first, by value for any other sequence of the same rules."""
        same = self._same.get(id(rules))
        if same is not None and same[0] is rules:
            return same[1]
        as_tuple = tuple(rules)
        found = self._sets.get(as_tuple) or self._new_rule_set(as_tuple)
        if as_tuple is rules:
            if len(self._same) >= KEY_CACHE_SIZE:
                self._same.clear()
            self._same[id(rules)] = (as_tuple, found)
        return found

    def _new_rule_set(self, rules: tuple[BudgetRule, ...]) -> _RuleSet:
        """A set of rules met for the first time (or in a new catalog)."""
        if len(self._sets) >= KEY_CACHE_SIZE:
            self._sets.clear()
        found = []
        for rule in rules:
            key = book_key(rule, prefix=self._prefix)
            allowance = self._allowances.get(key)
            if allowance is None:
                allowance = self._allowances[key] = _Allowance(key, limit=rule.limit)
            if rule.limit < allowance.limit:  # no more admitting from slack granted before
                allowance.withheld += max(0, allowance.slack)
            allowance.limit = rule.limit
            found.append(allowance)
        made = self._sets[rules] = _RuleSet(
            rules, tuple(found), picker(rules), min(rule.limit for rule in rules)
        )
        return made
