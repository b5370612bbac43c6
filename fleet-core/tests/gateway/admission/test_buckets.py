"""The token-bucket arithmetic both stores (and the Lua scripts) share: examples, properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.gateway.admission import buckets

CAPACITY = 60  # one unit per second: easy to reason about


def test_rate_is_capacity_per_minute() -> None:
    assert buckets.rate(CAPACITY) == 1.0
    assert buckets.rate(6000) == 100.0


def test_refill_adds_rate_times_elapsed_up_to_capacity() -> None:
    assert buckets.refill(0.0, 10.0, CAPACITY) == 10.0
    assert buckets.refill(-30.0, 10.0, CAPACITY) == -20.0
    assert buckets.refill(55.0, 10.0, CAPACITY) == CAPACITY


def test_refill_ignores_a_clock_stepped_back_but_still_caps() -> None:
    assert buckets.refill(10.0, -5.0, CAPACITY) == 10.0
    assert buckets.refill(100.0, 0.0, CAPACITY) == CAPACITY  # the capacity was lowered


def test_retry_after_is_the_shortfall_over_the_rate() -> None:
    assert buckets.retry_after(0.0, 3, CAPACITY) == 3.0
    assert buckets.retry_after(-30.0, 1, CAPACITY) == 31.0
    assert buckets.retry_after(10.0, 3, CAPACITY) == 0.0


def test_retry_after_is_infinite_when_the_amount_can_never_fit() -> None:
    assert buckets.retry_after(CAPACITY, CAPACITY + 1, CAPACITY) == math.inf
    assert buckets.retry_after(0.0, 1, 0) == math.inf


def test_apply_takes_into_debt_and_refunds_up_to_capacity() -> None:
    assert buckets.apply(10.0, 30, CAPACITY) == -20.0
    assert buckets.apply(50.0, -30, CAPACITY) == CAPACITY


def test_ttl_is_twice_the_time_to_full_and_at_least_two_minutes() -> None:
    assert buckets.ttl(0.0, CAPACITY) == buckets.MIN_TTL_S
    assert buckets.ttl(-60.0, CAPACITY) == 240.0
    assert buckets.ttl(0.0, 0) == buckets.MIN_TTL_S


def test_admit_names_the_refusing_bucket_with_the_longest_wait() -> None:
    assert buckets.admit([5.0, 5.0], [5, 5], [60, 60]) is None
    assert buckets.admit([0.0, 0.0], [3, 4], [60, 120]) == buckets.Refusal(0, 3.0)
    assert buckets.admit([0.0, 0.0], [1, 4], [60, 120]) == buckets.Refusal(1, 2.0)
    assert buckets.admit([0.0, 0.0], [2, 2], [60, 60]) == buckets.Refusal(0, 2.0)  # tie: first
    assert buckets.admit([9.0, 0.0], [1, 61], [60, 60]) == buckets.Refusal(1, math.inf)


def test_admit_needs_one_level_per_amount() -> None:
    with pytest.raises(ValueError, match="longer"):
        buckets.admit([1.0], [1, 1], [60, 60])


capacities = st.integers(min_value=1, max_value=10_000_000)
amounts = st.integers(min_value=1, max_value=10_000_000)
elapsed = st.floats(min_value=-10.0, max_value=1e6, allow_nan=False)


@st.composite
def levels(draw: st.DrawFn, capacity: int) -> float:
    """A level a bucket of ``capacity`` can hold: anything up to it, deep overruns included."""
    return draw(st.floats(min_value=-10.0 * capacity, max_value=capacity, allow_nan=False))


@given(st.data(), capacities, elapsed)
def test_refill_never_exceeds_capacity_nor_loses_units(
    data: st.DataObject, capacity: int, seconds: float
) -> None:
    level = data.draw(levels(capacity))
    refilled = buckets.refill(level, seconds, capacity)
    assert level <= refilled <= capacity


@given(st.data(), capacities, amounts)
def test_waiting_retry_after_is_enough(data: st.DataObject, capacity: int, amount: int) -> None:
    level = data.draw(levels(capacity))
    wait = buckets.retry_after(level, amount, capacity)
    if amount > capacity:
        assert wait == math.inf
    else:
        later = buckets.refill(level, wait, capacity)
        rounding = 1e-12 * max(abs(level), amount)
        assert later >= amount - rounding


@given(st.data(), capacities, amounts, st.floats(min_value=0.0, max_value=1e4, allow_nan=False))
def test_reserve_then_refund_restores_the_level_up_to_refill(
    data: st.DataObject, capacity: int, amount: int, seconds: float
) -> None:
    level = data.draw(levels(capacity))
    taken = buckets.apply(level, amount, capacity)
    settled = buckets.apply(buckets.refill(taken, seconds, capacity), -amount, capacity)
    expected = buckets.refill(level, seconds, capacity)
    assert settled <= capacity
    assert math.isclose(settled, expected, rel_tol=1e-9, abs_tol=1e-6 * capacity)


@given(st.lists(st.tuples(capacities, amounts, st.floats(0, 1), st.floats(-1, 0)), min_size=1))
def test_admit_refuses_exactly_when_some_bucket_falls_short(
    rows: list[tuple[int, int, float, float]],
) -> None:
    capacity = [row[0] for row in rows]
    amount = [row[1] for row in rows]
    # Levels from deep debt to full, as fractions of each capacity.
    level = [row[0] * (row[2] + row[3]) for row in rows]
    refusal = buckets.admit(level, amount, capacity)
    short = [i for i, (lv, am) in enumerate(zip(level, amount, strict=True)) if lv < am]
    if refusal is None:
        assert not short
        return
    waits = [buckets.retry_after(level[i], amount[i], capacity[i]) for i in short]
    assert refusal.index in short
    assert refusal.retry_after == max(waits)
    assert refusal.index == short[waits.index(max(waits))]  # ties go to the first
