"""The benches measure their targets in a rotated order each round, so that none always follows
the same other (in a fixed order, no auth, measured right after database mode, came out slower
than environment mode in two database runs of three: noise, or an order effect this removes)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.gateway_bench import rotated


@given(st.lists(st.integers(), min_size=1, max_size=12, unique=True))
def test_over_as_many_rounds_as_targets_each_target_takes_every_place_once(
    targets: list[int],
) -> None:
    orders = [rotated(targets, round_) for round_ in range(len(targets))]
    assert orders[0] == targets
    for order in orders:
        assert sorted(order) == sorted(targets)
    for place in range(len(targets)):
        assert sorted(order[place] for order in orders) == sorted(targets)


@given(st.lists(st.integers(), max_size=12, unique=True), st.integers(0, 100))
def test_a_rotation_keeps_the_cyclic_order(targets: list[int], round_: int) -> None:
    order = rotated(targets, round_)
    assert len(order) == len(targets)
    if targets:
        start = targets.index(order[0])
        assert order == [targets[(start + i) % len(targets)] for i in range(len(targets))]
