"""This gateway's allowance in each budget rule's book, and the sets of rules requests meet.

Every budgeted request meets a set of rules (a principal's, in one catalog snapshot) and works on
this gateway's `Allowance` in each rule's book (`budget_book` has the arithmetic). Finding those
allowances, the reader of each rule's part of a request (`picker`) and the smallest limit costs
hashing and lookups per rule, so `RuleSets` works a set out once, as a `RuleSet`, and finds it
again by the identity of the directory's tuple on every later request; what it keeps must answer
as if worked out each time (``test_per_request_caches.py``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from fleet_core.gateway.admission.directory import BudgetDimension, BudgetRule

__all__ = [
    "DIMENSIONS",
    "Allowance",
    "Picker",
    "RuleSet",
    "RuleSets",
    "book_key",
    "picker",
]

KEY_CACHE_SIZE = 10_000
"""Sets of rules whose allowances are looked up once; beyond this the cache starts again."""

ALLOWANCES_KEPT = 10_000
"""Rules with an allowance kept here; beyond this the idle ones (holding nothing) are forgotten."""

DIMENSIONS: tuple[BudgetDimension, ...] = (
    "tokens_total",
    "tokens_input",
    "tokens_output",
    "tokens_cached",
    "tokens_fresh",
    "units",
)
"""The order of `budget_book.Amounts.vector`."""

Picker = Callable[[tuple[int, ...]], tuple[int, ...]]


def picker(rules: Sequence[BudgetRule]) -> Picker:
    """A function from `budget_book.Amounts.vector` to each rule's figure, in ``rules`` order:
    made once per set of rules, it reads a request's amounts in C (``itemgetter``) rather than by
    a call per rule (about 0.6 µs per request less, twice: admission and settlement)."""
    at = [DIMENSIONS.index(rule.dimension) for rule in rules]
    if len(at) == 1:
        only = at[0]
        return lambda vector: (vector[only],)
    if not at:
        return lambda vector: ()
    return operator.itemgetter(*at)


def book_key(rule: BudgetRule, *, prefix: str = "") -> str:
    """Where a rule's book (every gateway's entry) lives in the store: under its tenant's hash
    tag, like its buckets."""
    tenant = rule.scope_id.partition("/")[0]
    return f"{prefix}fleet:budget:{{{tenant}}}:{rule.id}"


@dataclass(slots=True)
class Allowance:
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
    """Demand admitted per `budget_book.SLACK_S`, as the last refresh measured it."""
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


class RuleSet(msgspec.Struct, gc=False):
    """A set of rules requests meet together (a principal's, in one catalog snapshot), worked
    out once: their allowances here, the `picker` that reads each rule's part of a request,
    their smallest limit, and the refresh that last covered them all. Untracked by the
    collector: it refers to nothing that refers back to it."""

    rules: tuple[BudgetRule, ...]
    allowances: tuple[Allowance, ...]
    pick: Picker
    smallest: int
    """The smallest of the rules' limits."""
    known: int = -1
    """The `budget_book.BudgetBook` refresh generation in which every rule had figures (-1:
    not yet)."""


class RuleSets:
    """This gateway's allowance in the book of every rule it met, and each set of rules a
    request met, worked out once. ``prefix``: the store's key prefix (`book_key`)."""

    def __init__(self, *, prefix: str = "") -> None:
        self._prefix = prefix
        self.allowances: dict[str, Allowance] = {}
        """Book key -> this gateway's allowance in it."""
        self._sets: dict[tuple[BudgetRule, ...], RuleSet] = {}
        """Each set of rules a request met, worked out once."""
        self._same: dict[int, tuple[tuple[BudgetRule, ...], RuleSet]] = {}
        """The same, by the identity of the tuple the directory hands out for a principal (it
        keeps the tuple alive, so the id is not reused): no hashing of rules per request."""

    def allowance(self, rule: BudgetRule) -> Allowance | None:
        """This gateway's allowance in ``rule``'s book; None before a request met the rule."""
        return self.allowances.get(book_key(rule, prefix=self._prefix))

    def find(self, rules: Sequence[BudgetRule]) -> RuleSet:
        """``rules`` worked out once: found by the identity of the directory's tuple on every
        request after the first, by value for any other sequence of the same rules."""
        same = self._same.get(id(rules))
        if same is not None and same[0] is rules:
            return same[1]
        as_tuple = tuple(rules)
        found = self._sets.get(as_tuple) or self._new(as_tuple)
        if as_tuple is rules:
            if len(self._same) >= KEY_CACHE_SIZE:
                self._same.clear()
            self._same[id(rules)] = (as_tuple, found)
        return found

    def _new(self, rules: tuple[BudgetRule, ...]) -> RuleSet:
        """A set of rules met for the first time (or in a new catalog)."""
        if len(self._sets) >= KEY_CACHE_SIZE:
            self._sets.clear()
        found = []
        for rule in rules:
            key = book_key(rule, prefix=self._prefix)
            allowance = self.allowances.get(key)
            if allowance is None:
                allowance = self.allowances[key] = Allowance(key, limit=rule.limit)
            if rule.limit < allowance.limit:  # no more admitting from slack granted before
                allowance.withheld += max(0, allowance.slack)
            allowance.limit = rule.limit
            found.append(allowance)
        made = self._sets[rules] = RuleSet(
            rules, tuple(found), picker(rules), min(rule.limit for rule in rules)
        )
        return made

    def forget_idle(self) -> None:
        """Past `ALLOWANCES_KEPT`, forget the allowances holding nothing, and every set (a set
        refers to its allowances). Only while no request holds a set: the book calls it then."""
        if len(self.allowances) <= ALLOWANCES_KEPT:
            return
        self.allowances = {
            key: a for key, a in self.allowances.items() if a.allowance or a.in_flight
        }
        self._sets.clear()
        self._same.clear()
