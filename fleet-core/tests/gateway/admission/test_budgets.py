"""Budget rules: what a gateway's allowance counts, when it grows and shrinks, and when a window
frees (memory store, which mirrors the Redis scripts)."""

from __future__ import annotations

import asyncio
import time
from unittest import mock

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_core.gateway.admission import budget_book, unheld
from fleet_core.gateway.admission.allowances import book_key
from fleet_core.gateway.admission.budget_book import SLACK_S, Amounts, BudgetBook, BudgetHold
from fleet_core.gateway.admission.directory import BudgetRule
from fleet_core.gateway.admission.memory_store import MemoryStore
from fleet_core.gateway.admission.windows import free_after
from fleet_core.shared.errors import ReservationTooLarge

from .conftest import FakeClock
from .redis_books import admit

RULE = BudgetRule("rule_a", "tenant", "acme", "tokens_total", 100, 3600)
UNITS = BudgetRule("rule_u", "project", "acme/x", "units", 1_000, 86400)
RULE_BIG = BudgetRule("rule_b", "tenant", "acme", "tokens_total", 1_000_000, 3600)


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


async def test_a_request_the_slack_covers_asks_the_store_nothing() -> None:
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    hold, asks = book.hold([RULE_BIG], Amounts(tokens_output=10))
    assert [(a.need, a.extra) for a in asks] == [(10, 40)]  # nothing yet: ask, with slack
    assert (await store.reserve([], asks)).admitted
    assert book.placed(hold)
    assert asks[0].granted == 50
    for _ in range(4):
        _, more = book.hold([RULE_BIG], Amounts(tokens_output=10))
        assert more == []  # the slack covers it: no store call for the budget
    assert book.allowance(RULE_BIG) == (50, 50, 0)
    assert store.held(book_key(RULE_BIG)) == 50
    _, asks = book.hold([RULE_BIG], Amounts(tokens_output=10))
    assert [a.need for a in asks] == [10]


async def test_near_the_limit_the_slack_is_nothing_and_admission_exact() -> None:
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({"rule_a": 60}, started_at=0.0)  # the rollups already count 60 of 100
    refused, decision = await admit(store, book, [RULE], Amounts(tokens_output=41))
    assert refused is None
    assert decision is not None
    assert (decision.refused_hold, decision.excess) == (0, 1)
    assert book.allowance(RULE) == (0, 0, 0)
    hold, _ = await admit(store, book, [RULE], Amounts(tokens_output=40))
    assert hold is not None
    assert book.allowance(RULE) == (40, 40, 0)  # no room left for slack
    assert store.held(book_key(RULE)) == 40


async def test_a_reservation_counts_until_settled_then_until_every_rollup_shows_it() -> None:
    store = MemoryStore()
    book = BudgetBook(grace_s=2.0)
    book.refreshed({}, started_at=0.0)
    key = book_key(RULE)
    hold, _ = await admit(store, book, [RULE], Amounts(tokens_input=10, tokens_output=40))
    assert hold is not None
    assert store.held(key) == 53  # 50 and a sixteenth of the room left (50 // 16)
    refused, _ = await admit(store, book, [RULE], Amounts(tokens_input=51))
    assert refused is None

    assert book.settle(hold, Amounts(tokens_input=10, tokens_output=5), request_id="r1") == []
    # Used less than reserved: the unused part is slack now; the entry still holds it.
    assert book.allowance(RULE) == (53, 0, 15)
    assert book.unrolled(RULE) == 15
    book.committed(["r1"], at=101.0)
    # Committed, and this refresh has it, but another gateway's may have started before the
    # commit: the use stays until a refresh started grace_s after the commit. (Slack no recent
    # admission needs is given back at every refresh.)
    await store.update_holds(book.refreshed({"rule_a": 15}, started_at=102.0))
    assert book.allowance(RULE) == (15, 0, 15)
    assert store.held(key) == 15
    await store.update_holds(book.refreshed({"rule_a": 15}, started_at=103.5))
    assert book.allowance(RULE) == (0, 0, 0)
    assert store.held(key) == 0
    assert book.own() == 0


async def test_an_overrun_grows_the_entry_at_once() -> None:
    """A use past the reservation and the slack is written now, unchecked (the store never
    holds less than was used); one within them is not written at all."""
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    demand = Amounts(tokens_input=10, tokens_output=20, units=300)
    hold, _ = await admit(store, book, [RULE, UNITS], demand)
    assert hold is not None
    before = (store.held(book_key(RULE)), store.held(book_key(UNITS)))
    assert before == (30 + 70 // 16, 300 + 700 // 16)
    updates = book.settle(hold, Amounts(tokens_input=10, units=400), request_id="r1")
    assert [(u.key, u.delta) for u in updates] == [(book_key(UNITS), 400 - before[1])]
    await store.update_holds(updates)
    assert (store.held(book_key(RULE)), store.held(book_key(UNITS))) == (before[0], 400)
    assert book.allowance(UNITS) == (400, 0, 400)


async def test_settled_use_leaves_the_entries_in_commit_order_once_the_cutoff_passed() -> None:
    store = MemoryStore()
    book = BudgetBook(grace_s=2.0)
    book.refreshed({}, started_at=0.0)
    for n in range(3):
        hold, _ = await admit(store, book, [RULE_BIG], Amounts(tokens_output=10))
        assert hold is not None
        book.settle(hold, Amounts(tokens_output=n + 1), request_id=f"r{n}")
    book.committed(["r1"], at=10.0)
    book.committed(["r0", "r2", "r9"], at=11.0)  # r9: not settled here
    book.committed(["r1"], at=12.0)  # reported again: its first commit counts
    await store.update_holds(book.refreshed({}, started_at=12.5))
    assert book.allowance(RULE_BIG)[2] == 1 + 3  # r1 (2) left the entry; r0 and r2 wait
    await store.update_holds(book.refreshed({}, started_at=13.5))
    assert book.allowance(RULE_BIG) == (0, 0, 0)
    assert store.held(book_key(RULE_BIG)) == 0
    assert book.own() == 0


async def test_use_the_rollups_show_leaves_the_entry_however_busy_the_gateway() -> None:
    """Steady traffic keeps the slack (recent admissions need it), but settled use the rollups
    now count must leave the entry all the same: left in as slack, it would be admitted from a
    second time, and what was served would pass the limit."""
    store = MemoryStore()
    book = BudgetBook(grace_s=2.0)
    rolled, now, served = 0, 0.0, 0
    book.refreshed({"rule_a": 0}, started_at=now)
    for step in range(40):
        for n in range(3):
            hold, _ = await admit(store, book, [RULE], Amounts(tokens_output=7))
            if hold is not None:
                book.settle(hold, Amounts(tokens_output=7), request_id=f"r{step}-{n}")
                book.committed([f"r{step}-{n}"], at=now)
                rolled += 7  # the rollups show it at once (every gateway's refresh too)
                served += 7
        now += 0.2  # refreshes close together: the slack recent admissions need is kept
        await store.update_holds(book.refreshed({"rule_a": rolled}, started_at=now))
        assert served <= RULE.limit
    assert served >= RULE.limit - 7  # and it did admit up to the limit


async def test_slack_granted_under_a_limit_since_lowered_is_not_admitted_from() -> None:
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    hold, _ = await admit(store, book, [RULE_BIG], Amounts(tokens_output=10))
    assert hold is not None
    assert book.allowance(RULE_BIG) == (50, 10, 0)  # 40 of slack
    lowered = msgspec.structs.replace(RULE_BIG, limit=45)
    refused, decision = await admit(store, book, [lowered], Amounts(tokens_output=10))
    assert refused is None  # it asked the store, which judged it by the new limit
    assert decision is not None
    assert decision.excess == 50 + 10 - 45
    await store.update_holds(book.refreshed({}, started_at=1.0))  # the slack is given back
    assert book.allowance(lowered) == (10, 10, 0)
    assert store.held(book_key(lowered)) == 10


async def test_a_refresh_leaves_the_slack_recent_admissions_need() -> None:
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    holds = []
    for _ in range(20):
        hold, _ = await admit(store, book, [RULE_BIG], Amounts(tokens_output=10))
        assert hold is not None
        holds.append(hold)
    assert book.allowance(RULE_BIG) == (200, 200, 0)  # a growth of 50 every fifth request
    for n, hold in enumerate(holds):
        book.settle(hold, Amounts(), request_id=f"r{n}")  # used nothing: all slack now
    await store.update_holds(book.refreshed({}, started_at=2.0))  # 200 in 2 s: 50 per SLACK_S
    assert book.allowance(RULE_BIG) == (200 * SLACK_S / 2, 0, 0)
    assert store.held(book_key(RULE_BIG)) == 50
    await store.update_holds(book.refreshed({}, started_at=4.0))  # nothing admitted since
    assert book.allowance(RULE_BIG) == (0, 0, 0)
    assert store.held(book_key(RULE_BIG)) == 0


async def test_a_released_reservation_leaves_nothing_behind() -> None:
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    hold, asks = book.hold([RULE, UNITS], Amounts(tokens_input=10, units=300))
    assert (await store.reserve([], asks)).admitted
    # The caller left after the store answered: the grants stay, as slack, nothing is sent.
    assert book.release(hold) == []
    assert book.allowance(RULE) == (store.held(book_key(RULE)), 0, 0)
    await store.update_holds(book.refreshed({}, started_at=1.0))
    await store.update_holds(book.refreshed({}, started_at=2.0))  # no recent admission
    assert (store.held(book_key(RULE)), store.held(book_key(UNITS))) == (0, 0)
    assert book.own() == 0


async def test_a_growth_whose_answer_was_lost_is_taken_back_exactly_once() -> None:
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    hold, asks = book.hold([RULE], Amounts(tokens_output=30))
    assert (await store.reserve([], asks)).admitted
    for ask in asks:
        ask.granted = None  # as if the reply never came
    undo = book.release(hold)
    assert [(u.delta, u.grant) for u in undo] == [(0, asks[0].grant)]
    batch = [msgspec.structs.replace(u, batch="b1") for u in undo]
    await store.update_holds(batch)
    await store.update_holds(batch)  # sent again: applied once
    assert store.held(book_key(RULE)) == 0
    assert book.allowance(RULE) == (0, 0, 0)
    await store.update_holds([msgspec.structs.replace(u, batch="b2") for u in undo])
    assert store.held(book_key(RULE)) == 0  # a second undo of one growth takes nothing


async def test_a_growth_given_up_before_it_arrives_is_refused() -> None:
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    hold, asks = book.hold([RULE], Amounts(tokens_output=30))
    await store.update_holds(book.release(hold))  # the caller gave up first
    decision = await store.reserve([], asks)
    assert (decision.admitted, decision.refused_hold) == (False, 0)
    assert store.held(book_key(RULE)) == 0


async def test_growths_asked_together_make_the_entry_once() -> None:
    """Seen once on a clean clone (two gateways under load, one entry 22,418 in a book of limit
    5,000): requests asked to grow the entry before the store had it, and the first growth to land
    made it at a figure counting the others' needs as granted; each of them, landing after, added
    its growth again. An entry is made from what the store has confirmed, never from growths still
    on their way."""
    store = MemoryStore()
    book = BudgetBook()
    book.refreshed({}, started_at=0.0)
    asked = [book.hold([RULE_BIG], Amounts(tokens_output=n)) for n in (10, 20, 30)]
    assert all(asks for _, asks in asked)  # no slack yet: every one asks, none answered
    for hold, asks in reversed(asked):  # the last asked lands first (another connection)
        assert (await store.reserve([], asks)).admitted
        assert book.placed(hold)
    assert store.held(book_key(RULE_BIG)) == book.allowance(RULE_BIG)[0]
    for hold, _ in asked:  # and the deltas from here on keep the two equal
        await store.update_holds(book.settle(hold, hold.demand, request_id=str(id(hold))))
    for started_at in (1.0, 2.0):  # slack given back
        await store.update_holds(book.refreshed({}, started_at=started_at))
    assert store.held(book_key(RULE_BIG)) == book.allowance(RULE_BIG)[0]


async def test_a_request_served_before_its_rule_existed_counts_until_rolled_up() -> None:
    """Seen once in CI: a request admitted before the gateway knew a new rule held
    nothing, and its record was not yet in the rollups, so the rule admitted 20 tokens too many."""
    store = MemoryStore()
    book = BudgetBook(grace_s=2.0, ledger=True)
    book.refreshed({}, started_at=0.0)
    book.settle_unheld("acme", "x", Amounts(tokens_input=12, tokens_output=8), request_id="r0")
    book.settle_unheld("globex", "x", Amounts(tokens_input=50), request_id="r1")
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
    book.settle_unheld("acme", "x", Amounts(tokens_input=12), request_id="r0")
    assert book.usage(RULE) == 0


_UNHELD_STEP = st.one_of(
    st.tuples(  # a request of a tenant's project settles with no rule: what it used
        st.just("settle"),
        st.sampled_from([("acme", "x"), ("acme", "y"), ("globex", "x")]),
        st.integers(0, 50),
        st.integers(0, 50),
    ),
    st.tuples(st.just("commit"), st.just(("", "")), st.integers(0, 4), st.integers(0, 3)),
    st.tuples(st.just("refresh"), st.just(("", "")), st.just(0), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(_UNHELD_STEP, max_size=60),
    limit=st.integers(1, 6),
    asked_from=st.integers(0, 12),
)
def test_unheld_use_counts_per_tenant_and_project_until_rolled_up(
    steps: list[tuple[str, tuple[str, str], int, int]], limit: int, asked_from: int
) -> None:
    """Against a model that keeps every unheld request: its use counts for its tenant's and its
    project's rules from settlement until a refresh a grace after the ledger committed it, and
    past ``RECENT_LIMIT`` the oldest uncommitted (or committed) request leaves at once. The book
    sums a scope's use only once a rule asks about it (from step ``asked_from`` on): what it
    summed then and kept since must match the model as well as summing from the start."""
    rules = {
        "acme": BudgetRule("rule_t", "tenant", "acme", "tokens_total", 10**9, 3600),
        "acme/x": BudgetRule("rule_x", "project", "acme/x", "tokens_input", 10**9, 3600),
        "acme/y": BudgetRule("rule_y", "project", "acme/y", "tokens_output", 10**9, 3600),
    }
    with mock.patch.object(unheld, "RECENT_LIMIT", limit):
        book = BudgetBook(grace_s=2.0, ledger=True)
        uncommitted: dict[str, tuple[str, str, Amounts]] = {}
        committed: list[tuple[float, str, str, Amounts]] = []
        now = 0.0
        for n, (kind, (tenant, project), first, second) in enumerate(steps):
            now += 1.0
            if kind == "settle":
                used = Amounts(tokens_input=first, tokens_output=second)
                book.settle_unheld(tenant, project, used, request_id=f"r{n}")
                if used != Amounts():
                    uncommitted[f"r{n}"] = (tenant, project, used)
                    if len(uncommitted) > limit:
                        del uncommitted[next(iter(uncommitted))]
            elif kind == "commit":  # a ledger batch: some of the oldest, one id it never saw
                ids = [*list(uncommitted)[first : first + second], "unknown"]
                book.committed(ids, at=now)
                committed += [(now, *uncommitted.pop(rid)) for rid in ids[:-1]]
            else:
                book.refreshed({}, started_at=now)
                committed = [entry for entry in committed if entry[0] >= now - 2.0]
                committed = committed[-limit:]
            if n < asked_from:
                continue
            kept = [(t, p, used) for _, t, p, used in committed] + list(uncommitted.values())
            for scope, rule in rules.items():
                expected = sum(
                    used.get(rule.dimension) for t, p, used in kept if scope in (t, f"{t}/{p}")
                )
                assert book.usage(rule) == expected, (scope, kept)


def test_past_the_limit_only_the_oldest_committed_requests_leave() -> None:
    """The ledger commits unheld requests a batch at a time; past ``RECENT_LIMIT`` a refresh
    drops the oldest requests one by one, splitting a batch rather than dropping it whole."""
    rule = BudgetRule("rule_t", "tenant", "acme", "tokens_input", 10**9, 3600)
    with mock.patch.object(unheld, "RECENT_LIMIT", 3):
        book = BudgetBook(grace_s=2.0, ledger=True)
        for n, used in enumerate((1, 10, 100, 1000)):
            book.settle_unheld("acme", "x", Amounts(tokens_input=used), request_id=f"r{n}")
            if n == 2:
                book.committed(["r0", "r1", "r2"], at=1.0)
                assert book.usage(rule) == 111  # asked about with committed requests held
        book.committed(["r3"], at=1.5)
        book.refreshed({}, started_at=2.0)  # nothing rolled up yet: four held, one too many
        assert book.usage(rule) == 1110
        book.refreshed({}, started_at=3.4)  # the first batch's grace has passed
        assert book.usage(rule) == 1000


def test_a_demand_above_the_limit_can_never_fit() -> None:
    with pytest.raises(ReservationTooLarge, match="rule_a"):
        BudgetBook().check([RULE], Amounts(tokens_output=101))


async def test_own_entries_are_touched_every_quarter_ttl_and_a_crashed_ones_expire() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    book = BudgetBook(ttl_s=8.0)
    book.refreshed({}, started_at=0.0)
    hold, _ = await admit(store, book, [RULE], Amounts(tokens_output=30))
    assert hold is not None
    held = store.held(book_key(RULE))
    assert book.touches(now=time.monotonic()) == []  # not yet a quarter of the ttl
    clock.advance(7.0)
    touches = book.touches(now=time.monotonic() + 2.5)
    assert [(u.delta, u.keep) for u in touches] == [(0, held)]
    await store.update_holds(touches)
    clock.advance(7.0)  # 14 s after the growth: alive, as it was touched at 7 s
    assert store.held(book_key(RULE)) == held
    clock.advance(8.5)  # a crashed gateway stops touching: its entry expires
    assert store.held(book_key(RULE)) == 0


async def test_an_entry_the_store_lost_is_made_again_at_the_next_write() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    book = BudgetBook(ttl_s=8.0)
    book.refreshed({}, started_at=0.0)
    hold, _ = await admit(store, book, [RULE], Amounts(tokens_output=30))
    assert hold is not None
    held = store.held(book_key(RULE))
    clock.advance(9.0)  # the touches failed (the store was away): the entry expired
    assert store.held(book_key(RULE)) == 0
    await store.update_holds(book.touches(now=time.monotonic() + 10.0))
    assert store.held(book_key(RULE)) == held


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


@settings(max_examples=150, deadline=None)
@given(
    limit=st.integers(1, 5_000),
    base=st.integers(0, 2_000),
    slack_requests=st.integers(0, 8),
    steps=st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 900), st.integers(0, 3)), max_size=60
    ),
)
def test_two_gateways_never_count_more_than_the_limit(
    limit: int, base: int, slack_requests: int, steps: list[tuple[int, int, int]]
) -> None:
    """Random demands on two gateways sharing one store, under random limits, rollups and slack
    sizes, with settlements (at most the reservation) and refreshes between: what both count
    (in flight: the demand; settled: the use) never passes what the rule leaves, and every
    entry in the store is what its gateway means it to be."""
    rule = BudgetRule("rule_p", "tenant", "acme", "tokens_total", limit, 3600)
    with mock.patch.object(budget_book, "SLACK_REQUESTS", slack_requests):
        asyncio.run(_two_gateways(rule, base, steps))


async def _two_gateways(rule: BudgetRule, base: int, steps: list[tuple[int, int, int]]) -> None:
    store = MemoryStore()
    books = [BudgetBook(), BudgetBook()]
    flying: list[list[tuple[BudgetHold, int]]] = [[], []]
    counted, now = 0, 0.0
    for book in books:
        book.refreshed({rule.id: base}, started_at=now)
    for n, (side, demand, then) in enumerate(steps):
        book = books[side]
        hold, _ = await admit(store, book, [rule], Amounts(tokens_output=demand))
        if hold is not None:
            flying[side].append((hold, demand))
            counted += demand
        assert base + counted <= max(rule.limit, base)
        if then == 1 and flying[side]:  # the oldest here settles, using half its reservation
            settled, reserved = flying[side].pop(0)
            counted -= reserved - reserved // 2
            used = Amounts(tokens_output=reserved // 2)
            await store.update_holds(book.settle(settled, used, request_id=f"r{n}"))
        if then == 2:  # a refresh: slack recent admissions do not need is given back
            now += 0.3
            await store.update_holds(book.refreshed({rule.id: base}, started_at=now))
        for other in books:
            assert store.held(book_key(rule)) >= other.allowance(rule)[0]
    assert store.held(book_key(rule)) == sum(b.allowance(rule)[0] for b in books)
