"""Budget rules: what a hold counts, when it is dropped, and when a window frees (memory store)."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleet_core.admission.budgets import Amounts, BudgetBook, book_key, free_after, scopes_of
from fleet_core.admission.directory import BudgetRule
from fleet_core.admission.limits import HoldUpdate
from fleet_core.admission.store import MemoryStore
from fleet_core.errors import ReservationTooLarge

from .conftest import FakeClock

RULE = BudgetRule("rule_a", "tenant", "acme", "tokens_total", 100, 3600)
UNITS = BudgetRule("rule_u", "project", "acme/x", "units", 1_000, 86400)


def test_every_dimension_reads_its_own_figure() -> None:
    used = Amounts(tokens_input=30, tokens_output=20, tokens_cached=10, units=7)
    assert [
        used.get(d)
        for d in (
            "tokens_total",
            "tokens_input",
            "tokens_output",
            "tokens_cached",
            "tokens_fresh",
            "units",
        )
    ] == [50, 30, 20, 10, 20, 7]


async def test_a_hold_counts_until_settled_then_until_every_rollup_shows_it() -> None:
    store = MemoryStore()
    book = BudgetBook(grace_s=2.0)
    book.refreshed({}, started_at=0.0)
    key = book_key(RULE)
    hold, asks = book.hold([RULE], Amounts(tokens_input=10, tokens_output=40))
    assert (await store.reserve([], asks)).admitted
    assert store.held(key) == 50
    refused, more = book.hold([RULE], Amounts(tokens_input=51))
    decision = await store.reserve([], more)
    assert (decision.refused_hold, decision.excess) == (0, 1)
    await store.update_holds(book.release(refused))

    await store.update_holds(
        book.settle(hold, Amounts(tokens_input=10, tokens_output=5), request_id="r1")
    )
    # Used less than reserved: the store keeps the reservation (errs on refusing) until the
    # hold is dropped or touched; the book already counts what was used.
    assert store.held(key) == 50
    assert book.unrolled(RULE) == 15
    assert book.refreshed({"rule_a": 0}, started_at=100.0) == []  # the ledger lacks it yet
    book.committed(["r1"], at=101.0)
    # Committed, and this refresh has it, but another gateway's may have started before the
    # commit: the hold stays until a refresh started grace_s after the commit.
    assert book.refreshed({"rule_a": 15}, started_at=102.0) == []
    assert store.held(key) == 50
    await store.update_holds(book.refreshed({"rule_a": 15}, started_at=103.5))
    assert store.held(key) == 0
    assert book.own() == 0


async def test_a_hold_that_grew_at_settlement_is_written_at_once() -> None:
    """An overrun in any rule's dimension rewrites the hold now: the store never holds less
    than was used (a shrink may wait; a growth may not, or a budget could be passed)."""
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    hold, asks = book.hold([RULE, UNITS], Amounts(tokens_input=10, tokens_output=20, units=300))
    assert (await store.reserve([], asks)).admitted
    updates = book.settle(hold, Amounts(tokens_input=10, units=310), request_id="r1")
    assert {(u.key, u.amount) for u in updates} == {(book_key(RULE), 10), (book_key(UNITS), 310)}
    await store.update_holds(updates)
    assert (store.held(book_key(RULE)), store.held(book_key(UNITS))) == (10, 310)


async def test_a_hold_settled_under_its_reservation_is_shrunk_by_the_next_touch() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    book = BudgetBook(ttl_s=8.0)
    book.refreshed({}, started_at=0.0)
    hold, asks = book.hold([RULE], Amounts(tokens_output=40))
    assert (await store.reserve([], asks)).admitted
    assert book.settle(hold, Amounts(tokens_output=12), request_id="r1") == []
    assert store.held(book_key(RULE)) == 40
    clock.advance(3.0)
    await store.update_holds(book.touches(now=time.monotonic() + 2.5))
    assert store.held(book_key(RULE)) == 12
    clock.advance(7.0)  # 10 s after the hold was placed, 7 s after the touch: alive
    assert store.held(book_key(RULE)) == 12


async def test_settled_holds_are_dropped_in_commit_order_once_their_cutoff_passed() -> None:
    store = MemoryStore()
    book = BudgetBook(grace_s=2.0)
    book.refreshed({}, started_at=0.0)
    holds = []
    for n in range(3):
        hold, asks = book.hold([RULE], Amounts(tokens_output=10))
        assert (await store.reserve([], asks)).admitted
        book.settle(hold, Amounts(tokens_output=10), request_id=f"r{n}")
        holds.append(hold)
    book.committed(["r1"], at=10.0)
    book.committed(["r0", "r2"], at=11.0)
    book.committed(["r1"], at=12.0)  # reported again: its first commit counts
    assert {u.id for u in book.refreshed({}, started_at=12.5)} == {holds[1].id}
    assert book.refreshed({}, started_at=12.9) == []
    await store.update_holds(book.refreshed({}, started_at=13.5))
    assert store.held(book_key(RULE)) == 10  # r1's drop was never sent to this store
    assert book.own() == 0


async def test_a_released_hold_leaves_nothing_behind() -> None:
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    hold, asks = book.hold([RULE, UNITS], Amounts(tokens_input=10, units=300))
    assert (await store.reserve([], asks)).admitted
    await store.update_holds(book.release(hold))
    assert store.held(book_key(RULE)) == 0
    assert store.held(book_key(UNITS)) == 0
    assert book.own() == 0


async def test_a_request_served_before_its_rule_existed_counts_until_rolled_up() -> None:
    """The CI failure of stop 22: a request admitted before the gateway knew a new rule held
    nothing, and its record was not yet in the rollups, so the rule admitted 20 tokens too many."""
    store = MemoryStore()
    book = BudgetBook(grace_s=2.0, ledger=True)
    book.refreshed({}, started_at=0.0)
    book.settle_unheld(
        scopes_of("acme", "x"), Amounts(tokens_input=12, tokens_output=8), request_id="r0"
    )
    book.settle_unheld(scopes_of("globex", "x"), Amounts(tokens_input=50), request_id="r1")
    book.refreshed({"rule_a": 0}, started_at=1.0)  # the rule appears; the ledger lacks r0 yet
    assert book.usage(RULE) == 20
    assert book.unrolled(RULE) == 20
    _, asks = book.hold([RULE], Amounts(tokens_input=41, tokens_output=40))
    decision = await store.reserve([], asks)
    assert (decision.refused_hold, decision.excess) == (0, 1)  # 20 + 81 > 100

    book.committed(["r0", "r1"], at=2.0)
    book.refreshed({"rule_a": 20}, started_at=3.0)  # another gateway may not have it yet
    assert book.usage(RULE) == 40  # counted twice for a moment: errs on refusing
    book.refreshed({"rule_a": 20}, started_at=4.5)
    assert book.usage(RULE) == 20  # the rollups alone now
    assert book.unrolled(RULE) == 0


async def test_without_a_ledger_unheld_requests_are_not_tracked() -> None:
    book = BudgetBook()
    book.settle_unheld(scopes_of("acme", "x"), Amounts(tokens_input=12), request_id="r0")
    assert book.usage(RULE) == 0


def test_a_demand_above_the_limit_can_never_fit() -> None:
    with pytest.raises(ReservationTooLarge, match="rule_a"):
        BudgetBook().check([RULE], Amounts(tokens_output=101))


async def test_own_holds_are_touched_every_quarter_ttl_and_others_expire() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    book = BudgetBook(ttl_s=8.0)
    _, asks = book.hold([RULE], Amounts(tokens_output=30))
    assert (await store.reserve([], asks)).admitted
    assert book.touches(now=time.monotonic()) == []  # not yet a quarter of the ttl
    clock.advance(7.0)
    await store.update_holds(book.touches(now=time.monotonic() + 2.5))
    clock.advance(7.0)  # 14 s after the hold: alive, as it was touched at 7 s
    assert store.held(book_key(RULE)) == 30
    clock.advance(8.5)  # a crashed gateway stops touching: its hold expires
    assert store.held(book_key(RULE)) == 0


async def test_a_touch_rewrites_only_the_holds_not_written_for_a_quarter_ttl() -> None:
    book = BudgetBook(ttl_s=4.0)
    old, _ = book.hold([RULE], Amounts(tokens_output=30))
    await asyncio.sleep(1.05)
    settled, _ = book.hold([RULE], Amounts(tokens_output=20))
    fresh, _ = book.hold([RULE], Amounts(tokens_output=10))
    book.settle(settled, Amounts(tokens_output=5), request_id="r1")
    assert book.touches() == [HoldUpdate(book_key(RULE), old.id, 30, 4000)]
    # The next touch, a quarter later, rewrites all three: none waits longer than half the ttl.
    later = book.touches(now=time.monotonic() + 1.0)
    assert {(u.id, u.amount) for u in later} == {(old.id, 30), (settled.id, 5), (fresh.id, 10)}


def test_the_window_frees_when_enough_old_minutes_slide_out() -> None:
    minutes = [(0.0, 40), (60.0, 30), (120.0, 30)]
    # 50 must go: the first two minutes; the second ends at 120 and leaves at 120 + 3600.
    assert free_after(minutes, over_by=50, window_s=3600, now=1000.0) == 120 + 3600 - 1000
    assert free_after(minutes, over_by=10, window_s=3600, now=1000.0) == 60 + 3600 - 1000
    # Usage not yet in the rollups lands in the current minute.
    assert free_after(minutes, over_by=120, window_s=3600, now=1000.0, unrolled=30) == (
        960 + 60 + 3600 - 1000
    )
    assert free_after(minutes, over_by=200, window_s=3600, now=1000.0) is None
