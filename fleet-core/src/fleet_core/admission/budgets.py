"""Budget rules at admission: rolling-window limits checked against the ledger's rollups (P5).

A rule's usage is two parts:

- ``used``: the rule's sum over the ledger's per-minute rollups inside its window, refreshed by a
  background query every second (``refreshed``); its cost follows the number of minutes in the
  window, never the number of ledger rows. Every gateway reads it for itself.
- the rule's **holds**, kept in the limit store beside the token buckets (Redis when there is
  one, so every gateway sees every other's; `limits.Hold`). A request admitted anywhere holds
  its demand until it settles; then its hold is set to what it used (at once if that is more
  than it held; otherwise at the next touch, keeping the larger reservation meanwhile, which
  errs on refusing) and stays until the rollups show the record — until a refresh that started
  at least ``grace_s`` after the ledger committed it, so every other gateway's refresh has seen
  it too. Each hold expires ``ttl_s`` after it was
  last written; the gateway that owns it touches it while it lives, so only a crashed gateway's
  holds expire (after at most ``ttl_s``).

A request admitted while no rule applied to it (a rule created a moment ago, not yet in this
gateway's catalog) holds nothing, so its usage is invisible to a new rule until the rollups show
it. The book therefore also counts, per scope, what such **unheld** requests used, from their
settlement until the rollups show them (the same rule as for settled holds), and adds it to
``used`` for any rule of that scope.

A request is admitted only if, for every rule that applies, ``used + holds + demand`` stays
within the limit; the store checks that and places the holds in the same atomic call as the
token buckets, so concurrent requests on any number of gateways cannot all pass one check.
This book keeps the rollup figures and the gateway's own holds (to touch, settle and drop them);
everything is integer arithmetic. ADR 0004 says what is still approximate.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from fleet_core.admission.directory import BudgetDimension, BudgetRule
from fleet_core.admission.limits import Hold, HoldUpdate
from fleet_core.errors import RateLimited, ReservationTooLarge

__all__ = [
    "Amounts",
    "BudgetBook",
    "BudgetExceeded",
    "BudgetHold",
    "Scope",
    "book_key",
    "free_after",
    "scopes_of",
]

RECENT_LIMIT = 200_000
"""Settled holds tracked until the rollups show them; beyond this the oldest are left to expire."""

KEY_CACHE_SIZE = 10_000
"""Sets of rules whose book keys are kept; beyond this the cache starts again."""

Scope = tuple[str, str]
"""A rule's scope: ("tenant", tenant id) or ("project", "tenant/project")."""


def scopes_of(tenant: str, project: str) -> tuple[Scope, Scope]:
    """The scopes whose rules apply to a request of ``tenant``'s ``project``."""
    return ("tenant", tenant), ("project", f"{tenant}/{project}")


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
    """A request's holds: one per rule, all under one id. Untracked by the garbage collector
    (``gc=False``: it can take part in no cycle, holding strings, numbers and frozen structs):
    thousands live for seconds, settled and waiting for the rollups, and every collection of
    an older generation would walk them."""

    id: str
    rules: Sequence[BudgetRule]
    demand: Amounts


class BudgetExceeded(RateLimited):
    default_code = "budget_exceeded"


class _Entry(msgspec.Struct, gc=False):
    """One of this gateway's holds: what the store holds per rule, and when it was committed.
    (A struct, not a dataclass: one is made per request, ~0.1 µs against ~1 µs.)"""

    hold: BudgetHold
    keys: tuple[str, ...]
    """The rules' books in the store, in ``hold.rules`` order."""
    amounts: tuple[int, ...]
    written_at: float
    """When the store was last given this hold (monotonic clock): placed, settled or touched."""
    settled: bool = False
    committed_at: float | None = None


class _Unheld(msgspec.Struct, gc=False):
    """A request settled without a hold: what it used, against its scopes, until rolled up."""

    scopes: tuple[Scope, ...]
    used: Amounts
    committed_at: float | None = None


def book_key(rule: BudgetRule, *, prefix: str = "") -> str:
    """Where a rule's holds live in the store: under its tenant's hash tag, like its buckets."""
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
    """The rules' rollup figures and this gateway's own holds.

    ``ttl_s``: a hold expires this long after it was last written (its owner writes it again at
    most ``ttl_s / 2`` later: `touches`). ``grace_s``: a settled hold is dropped once a refresh
    that started this long after the ledger committed its record has returned (twice the refresh
    interval: by then every gateway refreshing on schedule has read the record from the rollups).
    ``ledger``: whether a ledger commits this gateway's records (database mode); only then are
    unheld requests counted, since only then does anything tell the book when the rollups show
    them.
    """

    def __init__(
        self, *, prefix: str = "", ttl_s: float = 60.0, grace_s: float = 2.0, ledger: bool = False
    ) -> None:
        self._prefix = prefix
        self._nonce = secrets.token_hex(8)
        self._serial = itertools.count()
        """Hold ids: this book's random nonce and a serial, unique among every gateway's holds
        (64 random bits per process) and cheaper to mint and to send than a UUID each."""
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._keys: dict[tuple[BudgetRule, ...], tuple[str, ...]] = {}
        """The book keys of each set of rules a request met, made once (per rule per request
        otherwise); kept on the hold's entry for its settlement, touches and drop."""
        self._grace_s = grace_s
        self._used: dict[str, int] = {}
        self.loaded = False
        """Whether the rollup figures were read at least once (before that, refuse)."""
        self._entries: dict[str, _Entry] = {}
        self._settled: OrderedDict[str, str] = OrderedDict()
        """Request id -> hold id, for holds settled and waiting for the rollups."""
        self._commits: deque[tuple[float, str]] = deque()
        """(commit time, request id) of the settled holds' records, in commit order: a refresh
        drops the oldest ones its cutoff passed, never scanning every hold still waiting."""
        self._ledger = ledger
        self._unheld: OrderedDict[str, _Unheld] = OrderedDict()
        """Request id -> what an unheld request used, until the rollups show it."""
        self._unheld_sums: dict[Scope, Amounts] = {}
        self._touched_at = time.monotonic()
        self.wanted = asyncio.Event()
        """Set when a request meets a rule the last refresh did not cover: refresh now."""
        self._learned = asyncio.Event()

    @property
    def ttl_s(self) -> float:
        return self._ttl_ms / 1000

    def usage(self, rule: BudgetRule) -> int:
        """What counts against a rule besides holds: its rollups (as last read) and what unheld
        requests of its scope used that the rollups may not show yet."""
        return self._used.get(rule.id, 0) + self._unheld_usage(rule)

    def _unheld_usage(self, rule: BudgetRule) -> int:
        if not self._unheld_sums:  # the usual case: every request was held
            return 0
        return self._unheld_sums.get((rule.scope_kind, rule.scope_id), NOTHING).get(rule.dimension)

    def knows(self, rules: Sequence[BudgetRule]) -> bool:
        """Whether the last refresh covered every one of ``rules`` (a new rule: not yet)."""
        return all(rule.id in self._used for rule in rules)

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
        return self._unheld_usage(rule) + sum(
            amount
            for entry in self._entries.values()
            if entry.settled
            for held, amount in zip(entry.hold.rules, entry.amounts, strict=True)
            if held.id == rule.id
        )

    def own(self) -> int:
        """How many holds this gateway keeps (in flight or waiting for the rollups)."""
        return len(self._entries)

    def check(self, rules: Sequence[BudgetRule], demand: Amounts) -> None:
        """400 for a demand above a rule's whole limit: it could never be admitted."""
        for rule in rules:
            amount = demand.get(rule.dimension)
            if amount > rule.limit:
                raise ReservationTooLarge(
                    f"this request needs {amount} {rule.dimension} but budget rule {rule.id} "
                    f"allows {rule.limit} per {rule.window_s}s; it can never be admitted",
                    param="max_tokens",
                )

    def hold(self, rules: Sequence[BudgetRule], demand: Amounts) -> tuple[BudgetHold, list[Hold]]:
        """A new hold for ``demand`` and what to ask the store; tracked from now on, so that
        a reservation that never completes can still be dropped (`release`)."""
        rules = tuple(rules)
        hold_id = f"h{self._nonce}{next(self._serial):x}"
        hold = BudgetHold(hold_id, rules, demand)
        keys = self._keys_of(rules)
        amounts: list[int] = []
        asks: list[Hold] = []
        ttl_ms, used = self._ttl_ms, self._used
        for rule, key in zip(rules, keys, strict=True):  # a loop: it runs on every request
            amount = demand.get(rule.dimension)
            base = used.get(rule.id, 0) + (self._unheld_usage(rule) if self._unheld_sums else 0)
            amounts.append(amount)
            asks.append(Hold(key, hold_id, amount, rule.limit, base, ttl_ms))
        self._entries[hold_id] = _Entry(hold, keys, tuple(amounts), time.monotonic())
        return hold, asks

    def release(self, hold: BudgetHold) -> list[HoldUpdate]:
        """Give a hold back unused (the request was refused or never started)."""
        self._entries.pop(hold.id, None)
        return [HoldUpdate(key, hold.id, None) for key in self._keys_of(tuple(hold.rules))]

    def settle(self, hold: BudgetHold, used: Amounts, *, request_id: str) -> list[HoldUpdate]:
        """Set the hold to what was used; it stays until the rollups show it.

        Only a hold that grew (the request used more than it reserved in some rule's dimension)
        is written now. One that used no more than it reserved keeps its reservation in the
        store, which errs on refusing, until it is dropped (a few seconds, once the rollups
        show the record) or, if it lives that long, until the next touch writes what was used
        (at most ``ttl_s / 2``): one store write fewer per rule per request (ADR 0004)."""
        entry = self._entries.get(hold.id)
        if entry is None or entry.settled:
            return []
        reserved = entry.amounts
        entry.amounts = amounts = tuple([used.get(rule.dimension) for rule in hold.rules])
        entry.settled = True
        self._settled[request_id] = hold.id
        if len(self._settled) > RECENT_LIMIT:
            _, dropped = self._settled.popitem(last=False)
            self._entries.pop(dropped, None)  # no longer touched: it expires within ttl_s
        if amounts == reserved or all([a <= b for a, b in zip(amounts, reserved, strict=True)]):
            return []
        entry.written_at = time.monotonic()
        return self._puts(entry)

    def settle_unheld(self, scopes: Sequence[Scope], used: Amounts, *, request_id: str) -> None:
        """Count what a request admitted under no rule used, until the rollups show it."""
        if not self._ledger or used == NOTHING or request_id in self._unheld:
            return
        self._unheld[request_id] = _Unheld(tuple(scopes), used)
        self._count_unheld(self._unheld[request_id], add=True)
        while len(self._unheld) > RECENT_LIMIT:
            _, dropped = self._unheld.popitem(last=False)
            self._count_unheld(dropped, add=False)

    def _count_unheld(self, entry: _Unheld, *, add: bool) -> None:
        for scope in entry.scopes:
            before = self._unheld_sums.get(scope, NOTHING)
            after = before + entry.used if add else before - entry.used
            if after == NOTHING:
                self._unheld_sums.pop(scope, None)
            else:
                self._unheld_sums[scope] = after

    def committed(self, request_ids: Iterable[str], *, at: float | None = None) -> None:
        """The ledger committed these records (called by the ledger writer)."""
        stamp = time.monotonic() if at is None else at
        for request_id in request_ids:
            entry = self._entries.get(self._settled.get(request_id, ""))
            if entry is not None and entry.committed_at is None:
                entry.committed_at = stamp
                self._commits.append((stamp, request_id))
            unheld = self._unheld.get(request_id)
            if unheld is not None and unheld.committed_at is None:
                unheld.committed_at = stamp

    def refreshed(self, used: Mapping[str, int], *, started_at: float) -> list[HoldUpdate]:
        """New rollup sums from a query that started at ``started_at`` (monotonic clock); the
        settled holds every gateway's rollups now show, to drop from the store.

        A record committed while the query ran may be counted twice for a moment (in the sums
        and in its hold), which errs on the side of refusing.
        """
        self._used = dict(used)
        self.loaded = True
        self._learned.set()  # wakes whoever waits in `learn`; the next ones wait on a new one
        self._learned = asyncio.Event()
        cutoff = started_at - self._grace_s
        self._drop_unheld(cutoff)
        drops: list[HoldUpdate] = []
        commits = self._commits
        while commits and commits[0][0] < cutoff:  # commit times only grow (monotonic clock)
            entry = self._entries.pop(self._settled.pop(commits.popleft()[1], ""), None)
            if entry is not None:
                drops += [HoldUpdate(key, entry.hold.id, None) for key in entry.keys]
        return drops

    def _drop_unheld(self, cutoff: float) -> None:
        rolled = [
            rid
            for rid, e in self._unheld.items()
            if e.committed_at is not None and e.committed_at < cutoff
        ]
        for request_id in rolled:
            self._count_unheld(self._unheld.pop(request_id), add=False)

    def touches(self, *, now: float | None = None) -> list[HoldUpdate]:
        """Every ``ttl_s / 4``, the own holds not written for that long, written again for
        another ``ttl_s``: none goes unwritten for more than ``ttl_s / 2``. Most holds live a
        few seconds (placed, settled, dropped once the rollups show them), so under load a
        touch rewrites the few that live long (long streams; everything while the ledger is
        away), not thousands of holds written a moment ago."""
        now = time.monotonic() if now is None else now
        quarter = self.ttl_s / 4
        if now - self._touched_at < quarter:
            return []
        self._touched_at = now
        stale = [e for e in self._entries.values() if now - e.written_at >= quarter]
        for entry in stale:
            entry.written_at = now
        return [update for entry in stale for update in self._puts(entry)]

    def _puts(self, entry: _Entry) -> list[HoldUpdate]:
        return [
            HoldUpdate(key, entry.hold.id, amount, self._ttl_ms)
            for key, amount in zip(entry.keys, entry.amounts, strict=True)
        ]

    def _keys_of(self, rules: tuple[BudgetRule, ...]) -> tuple[str, ...]:
        keys = self._keys.get(rules)
        if keys is None:
            if len(self._keys) >= KEY_CACHE_SIZE:
                self._keys.clear()
            keys = self._keys[rules] = tuple([book_key(r, prefix=self._prefix) for r in rules])
        return keys
