"""What admission keeps per key or per set of rules rather than working out per request (to cut
its CPU per request) must answer as if worked out each time: a principal's rules follow the catalog
snapshot, a reservation's allowances follow its rules, and charges are merged exactly when a bucket
comes twice."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook, book_key
from fleet_core.gateway.admission.directory import BudgetRule, Catalog, CatalogDirectory
from fleet_core.gateway.admission.key_ring import Principal
from fleet_core.gateway.admission.limits import Bucket, Charge
from fleet_core.gateway.admission.store import _merged
from fleet_core.shared.errors import ReservationTooLarge

ALICE = Principal("acme", "research", "k_alice")
BOB = Principal("acme", "ops", "k_bob")
TENANT = BudgetRule("r_tenant", "tenant", "acme", "tokens_total", 1000, 3600)
RESEARCH = BudgetRule("r_research", "project", "acme/research", "units", 500, 86400)
OPS = BudgetRule("r_ops", "project", "acme/ops", "tokens_output", 50, 60)


def test_a_principals_rules_follow_each_new_snapshot() -> None:
    directory = CatalogDirectory(Catalog(rules=(TENANT,)))
    assert directory.rules(ALICE) == (TENANT,)
    assert directory.rules(ALICE) == (TENANT,)  # the second answer comes from the cache

    directory.replace(Catalog(rules=(TENANT, RESEARCH, OPS)))
    assert directory.rules(ALICE) == (TENANT, RESEARCH)
    assert directory.rules(BOB) == (TENANT, OPS)

    directory.replace(Catalog(rules=()))  # every rule deleted: nothing cached survives
    assert directory.rules(ALICE) == ()
    assert directory.rules(BOB) == ()


def test_a_reservations_allowances_follow_its_own_rules_whatever_was_held_before() -> None:
    book = BudgetBook(prefix="p:")
    book.refreshed({rule.id: 0 for rule in (TENANT, RESEARCH, OPS)}, started_at=0.0)
    demand = Amounts(tokens_input=3, tokens_output=4, units=5)
    for rules in ((TENANT, RESEARCH), (OPS,), (TENANT, RESEARCH), (RESEARCH, TENANT)):
        hold, asks = book.hold(list(rules), demand)
        expected = [book_key(rule, prefix="p:") for rule in rules]
        assert [allowance.key for allowance in hold.allowances] == expected
        assert list(hold.amounts) == [demand.get(rule.dimension) for rule in rules]
        assert [ask.key for ask in asks] == expected  # nothing granted yet: every rule asks
        assert [ask.need for ask in asks] == list(hold.amounts)
        book.release(hold)
        assert all(book.allowance(rule)[1] == 0 for rule in rules)


def _reference(charges: list[Charge]) -> dict[str, int]:
    summed: dict[str, int] = {}
    for charge in charges:
        summed[charge.bucket.key] = summed.get(charge.bucket.key, 0) + charge.amount
    return summed


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(-100, 100)), max_size=8))
def test_merged_charges_sum_per_bucket_in_first_seen_order(pairs: list[tuple[str, int]]) -> None:
    charges = [Charge(Bucket(f"{{t}}:{name}", "tenant", "tpm", 1000), n) for name, n in pairs]
    merged = _merged(charges)
    assert {c.bucket.key: c.amount for c in merged} == _reference(charges)
    assert [c.bucket.key for c in merged] == list(_reference(charges))


def test_the_directorys_tuple_a_list_and_a_new_snapshots_equal_rules_share_one_rule_set() -> None:
    """A set of rules is found by the identity of the directory's tuple; any other
    sequence of the same rules (a list, a new snapshot's tuple) reaches the same allowances."""
    book = BudgetBook()
    book.refreshed({TENANT.id: 0, RESEARCH.id: 0}, started_at=0.0)
    directory = CatalogDirectory(Catalog(rules=(TENANT, RESEARCH)))
    demand = Amounts(tokens_input=1, units=1)
    first, _ = book.hold(directory.rules(ALICE), demand)
    again, _ = book.hold(directory.rules(ALICE), demand)
    listed, _ = book.hold([TENANT, RESEARCH], demand)
    directory.replace(Catalog(rules=(TENANT, RESEARCH)))  # equal rules, new tuples
    renewed, _ = book.hold(directory.rules(ALICE), demand)
    assert first.set is again.set is listed.set is renewed.set
    assert book.allowance(TENANT)[1] == 4 * demand.get(TENANT.dimension)


def test_a_lowered_limit_in_a_new_snapshot_makes_a_new_rule_set_that_withholds_the_slack() -> None:
    book = BudgetBook()
    book.refreshed({TENANT.id: 0}, started_at=0.0)
    directory = CatalogDirectory(Catalog(rules=(TENANT,)))
    hold, asks = book.hold(directory.rules(ALICE), Amounts(tokens_input=10))
    asks[0].granted = asks[0].need + 90  # the store granted 90 of slack
    assert book.placed(hold)
    book.release(hold)
    lowered = msgspec.structs.replace(TENANT, limit=500)
    directory.replace(Catalog(rules=(lowered,)))
    later, more = book.hold(directory.rules(ALICE), Amounts(tokens_input=10))
    assert later.set is not hold.set
    assert [ask.need for ask in more] == [10]  # the slack granted under 1000 is not spent


def test_knows_follows_each_refresh_even_for_a_rule_set_known_before() -> None:
    book = BudgetBook()
    rules = (TENANT, RESEARCH)
    assert not book.knows(rules)
    book.refreshed({TENANT.id: 0, RESEARCH.id: 0}, started_at=0.0)
    assert book.knows(rules)
    assert book.knows(rules)  # known in this refresh: no look-up of the ids
    book.refreshed({TENANT.id: 0}, started_at=1.0)  # RESEARCH deleted meanwhile
    assert not book.knows(rules)
    assert book.knows((TENANT,))


@given(st.integers(0, 2000), st.integers(0, 2000), st.integers(0, 2000), st.integers(0, 1200))
def test_check_refuses_exactly_the_demands_over_a_rules_whole_limit(
    tokens_input: int, tokens_output: int, units: int, cached: int
) -> None:
    book = BudgetBook()
    demand = Amounts(tokens_input, tokens_output, min(cached, tokens_input), units)
    rules = (TENANT, RESEARCH, OPS)
    over = [rule for rule in rules if demand.get(rule.dimension) > rule.limit]
    if not over:
        book.check(rules, demand)
        return
    with pytest.raises(ReservationTooLarge, match=f"budget rule {over[0].id} "):
        book.check(rules, demand)


def _refusal(call: Callable[..., object], *args: object) -> str | None:
    try:
        call(*args)
    except ReservationTooLarge as exc:
        return str(exc)
    return None


def _state(book: BudgetBook, rules: tuple[BudgetRule, ...]) -> list[tuple[int, int, int]]:
    return [book.allowance(rule) for rule in rules]


@given(
    st.one_of(
        st.just({TENANT.id, RESEARCH.id, OPS.id}),
        st.sets(st.sampled_from([TENANT.id, RESEARCH.id, OPS.id])),
    ),
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 60), st.integers(0, 40), st.integers(0, 150)),
        max_size=16,
    ),
)
def test_admit_answers_as_check_knows_and_hold_one_after_the_other(
    known: set[str], steps: list[tuple[int, int, int, int]]
) -> None:
    """`admit` works the rules out once for what `check`, `knows` and `hold` do in turn: the
    same refusal, the same None for a rule the last refresh did not cover, the same hold, asks
    and allowances after it. Each growth is granted a random slack, so later holds meet every
    case: all from the slack, asks for every rule, and a hold that fits some rules' slack and
    not another's, which gives back what it took (in flight stays the sum of the holds)."""
    rules = (TENANT, RESEARCH, OPS)
    one, other = BudgetBook(), BudgetBook()
    for book in (one, other):
        book.refreshed({rule_id: 0 for rule_id in known}, started_at=0.0)
    in_flight = [0, 0, 0]
    for tokens_input, tokens_output, units, slack in steps:
        demand = Amounts(tokens_input, tokens_output, 0, units)
        refusal = _refusal(one.check, rules, demand)
        if refusal is not None:
            assert _refusal(other.admit, rules, demand) == refusal
            continue
        if not one.knows(rules):
            assert other.admit(rules, demand) is None
            continue
        admitted = other.admit(rules, demand)
        assert admitted is not None
        (hold, asks), (expected, expected_asks) = admitted, one.hold(rules, demand)
        assert hold.amounts == expected.amounts
        assert [(a.key, a.need, a.extra) for a in asks] == [
            (a.key, a.need, a.extra) for a in expected_asks
        ]
        for book, placed, its_asks in ((other, hold, asks), (one, expected, expected_asks)):
            for ask in its_asks:
                ask.granted = ask.need + slack
            assert not its_asks or book.placed(placed)
        in_flight = [
            held + demand.get(rule.dimension) for held, rule in zip(in_flight, rules, strict=True)
        ]
        assert [flying for _, flying, _ in _state(other, rules)] == in_flight
        assert _state(other, rules) == _state(one, rules)
