"""The arithmetic of a closed month: worked examples, then the invariants over random inputs."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.control_plane.costs import allocation
from fleet_core.control_plane.costs.allocation import ClusterUsage, apportion, price, round_half_up

HOUR_US = 3_600_000_000


def test_apportion_gives_leftover_units_to_the_largest_remainders() -> None:
    # 100 / 3: quotas 33.33 each; one unit left goes to the first of the tied remainders
    assert apportion(100, [1, 1, 1]) == [34, 33, 33]
    # 10 by 1:2:3 → 1.67, 3.33, 5: the largest remainder (0.67) gets the unit
    assert apportion(10, [1, 2, 3]) == [2, 3, 5]
    assert apportion(7, [0, 5, 0]) == [0, 7, 0]
    assert apportion(7, [0, 0]) == [0, 0]


def test_apportion_refuses_negative_input() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        apportion(-1, [1])
    with pytest.raises(ValueError, match="non-negative"):
        apportion(1, [-1, 2])


def test_round_half_up() -> None:
    assert [round_half_up(Fraction(n, 2)) for n in range(-3, 4)] == [-1, -1, 0, 0, 1, 1, 2]


def test_a_month_of_two_gpus_at_3_20_per_hour() -> None:
    month_gpu_us = 2 * 30 * 24 * HOUR_US
    usage = ClusterUsage("k3s-dev", [(month_gpu_us, 3_200_000)], busy_gpu_us=2 * HOUR_US)
    figures = price([usage])
    assert figures.pool == 4_608_000_000  # 1,440 GPU-hours × 3.20
    assert figures.busy == 6_400_000  # 2 GPU-hours
    assert figures.idle == 4_601_600_000
    assert figures.by_cluster == {"k3s-dev": 4_608_000_000}


def test_busy_time_the_inventory_did_not_see_is_capped() -> None:
    usage = ClusterUsage("c", [(HOUR_US, 1_000_000)], busy_gpu_us=5 * HOUR_US)
    assert price([usage]).busy == price([usage]).pool == 1_000_000


def test_rounding_happens_once_on_exact_sums() -> None:
    # three clusters each worth a third of a micro-unit: 0 if rounded one by one, 1 in total
    third = ClusterUsage("a", [(HOUR_US, 1)], busy_gpu_us=0)
    clusters = [
        third,
        ClusterUsage("b", [(HOUR_US // 3, 1)], 0),
        ClusterUsage("c", [(HOUR_US // 3, 1)], 0),
    ]
    figures = price(clusters)
    assert sum(figures.by_cluster.values()) == figures.pool


def test_a_slice_hour_is_a_seventh_of_a_card_hour_exactly() -> None:
    seventh = Fraction(HOUR_US, 7)  # one hour on one 1g.10gb slice of an H100
    usage = ClusterUsage("mig", [(2 * 720 * HOUR_US, 7_000_000)], busy_gpu_us=seventh)
    assert price([usage]).busy == 1_000_000
    # against half an hour on a whole card: weights 2/9 and 7/9, exactly
    assert allocation.allocate(9_000_000_000, {"acme": seventh, "globex": HOUR_US // 2}) == {
        "acme": 2_000_000_000,
        "globex": 7_000_000_000,
    }


def test_allocate_orders_keys_for_deterministic_ties() -> None:
    assert allocation.allocate(1, {("b", "x"): 1, ("a", "x"): 1}) == {("a", "x"): 1, ("b", "x"): 0}


rates = st.integers(min_value=0, max_value=50_000_000)
whole_us = st.integers(min_value=0, max_value=8 * 31 * 24 * HOUR_US)
# GPU-time with MIG slices in it: exact fractions of GPU-µs (ADR 0026)
gpu_us = st.one_of(whole_us, st.builds(Fraction, whole_us, st.integers(1, 64 * 2520)))
clusters = st.lists(
    st.builds(
        lambda name, capacity, busy: ClusterUsage(name, capacity, busy),
        st.sampled_from(["a", "b", "c", "d"]),
        st.lists(st.tuples(gpu_us, rates), max_size=3),
        gpu_us,
    ),
    max_size=4,
    unique_by=lambda c: c.cluster,
)
usage = st.dictionaries(
    st.tuples(st.sampled_from(["acme", "globex", ""]), st.sampled_from(["chat", "batch"])),
    st.one_of(
        st.integers(min_value=0, max_value=10**13),
        st.builds(Fraction, st.integers(0, 10**13), st.integers(1, 64 * 2520)),
    ),
    max_size=6,
)


@given(clusters)
def test_busy_and_idle_add_up_to_the_pool(found: list[ClusterUsage]) -> None:
    figures = price(found)
    assert figures.busy + figures.idle == figures.pool
    assert 0 <= figures.busy <= figures.pool
    assert sum(figures.by_cluster.values()) == figures.pool


@given(st.integers(min_value=0, max_value=10**15), usage)
def test_the_whole_pool_is_allocated_and_only_to_users(
    pool: int, used: dict[tuple[str, str], Fraction]
) -> None:
    allocated = allocation.allocate(pool, used)
    if any(used.values()):
        assert sum(allocated.values()) == pool
    else:
        assert sum(allocated.values()) == 0  # no basis: the report shows it as unallocated
    for key, gpu_us in used.items():
        if gpu_us == 0:
            assert allocated[key] == 0
        assert allocated[key] >= 0


@given(st.integers(min_value=0, max_value=10**15), usage, st.integers(min_value=2, max_value=9))
def test_scaling_every_tenants_usage_keeps_the_allocation(
    pool: int, used: dict[tuple[str, str], Fraction], factor: int
) -> None:
    scaled = {k: v * factor for k, v in used.items()}
    assert allocation.allocate(pool, scaled) == allocation.allocate(pool, used)


@given(st.integers(min_value=0, max_value=10**15), usage)
def test_each_share_is_within_one_unit_of_its_exact_quota(
    pool: int, used: dict[tuple[str, str], Fraction]
) -> None:
    whole = sum(used.values())
    for key, amount in allocation.allocate(pool, used).items():
        if whole:
            assert abs(amount - Fraction(pool * used[key], whole)) < 1
