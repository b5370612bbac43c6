"""What admission keeps per key or per set of rules rather than working out per request (issue
21, session 9) must answer as if worked out each time: a principal's rules follow the catalog
snapshot, a reservation's allowances follow its rules, and charges are merged exactly when a bucket
comes twice."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleet_core.admission.budgets import Amounts, BudgetBook, book_key
from fleet_core.admission.directory import BudgetRule, Catalog, CatalogDirectory
from fleet_core.admission.keys import Principal
from fleet_core.admission.limits import Bucket, Charge
from fleet_core.admission.store import _merged

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
