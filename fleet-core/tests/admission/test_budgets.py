"""Budget-rule arithmetic as pure functions: what is counted, when, and when it frees."""

from __future__ import annotations

import pytest

from fleet_core.admission.budgets import Amounts, BudgetBook, free_after
from fleet_core.admission.directory import BudgetRule
from fleet_core.errors import ReservationTooLarge

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


def test_a_hold_counts_until_settled_and_a_settled_record_until_the_rollups_show_it() -> None:
    book = BudgetBook()
    demand = Amounts(tokens_input=10, tokens_output=40)
    assert book.over([RULE], demand) == []
    hold = book.hold([RULE], demand)
    assert book.usage("rule_a") == 50
    assert book.over([RULE], Amounts(tokens_input=51)) == [(RULE, 1)]

    book.settle(hold, Amounts(tokens_input=10, tokens_output=5), request_id="r1")
    assert book.usage("rule_a") == 15  # the hold is gone, what was used stays
    book.refreshed({"rule_a": 0}, started_at=100.0)  # a refresh before the ledger had it
    assert book.usage("rule_a") == 15
    book.committed(["r1"], at=101.0)
    book.refreshed({"rule_a": 15}, started_at=100.5)  # started before the commit: may lack it
    assert book.usage("rule_a") == 30  # counted twice for one refresh, never zero times
    book.refreshed({"rule_a": 15}, started_at=102.0)
    assert book.usage("rule_a") == 15


def test_a_released_hold_leaves_nothing_behind() -> None:
    book = BudgetBook()
    hold = book.hold([RULE, UNITS], Amounts(tokens_input=10, units=300))
    book.release(hold)
    assert book.usage("rule_a") == 0
    assert book.usage("rule_u") == 0


def test_a_demand_above_the_limit_can_never_fit() -> None:
    with pytest.raises(ReservationTooLarge, match="rule_a"):
        BudgetBook().over([RULE], Amounts(tokens_output=101))


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
