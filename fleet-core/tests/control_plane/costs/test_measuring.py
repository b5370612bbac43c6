"""Observed and busy time as defined in Python (the reference the SQL is held to)."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from fleet_core.control_plane.costs.measuring import observed_intervals, replica_usage


def test_a_sample_holds_until_the_next_but_no_longer_than_the_gap() -> None:
    samples = [(0, 2), (30, 2), (60, 4), (500, 4)]
    assert observed_intervals(samples, start=0, end=1000, max_gap_us=90) == [
        (0, 30, 2),
        (30, 60, 2),
        (60, 150, 4),  # 440 s until the next sample: only 90 vouched for
        (500, 590, 4),  # the last sample too
    ]


def test_observation_is_clipped_to_the_period() -> None:
    samples = [(-40, 1), (10, 1)]
    assert observed_intervals(samples, start=0, end=50, max_gap_us=90) == [(0, 10, 1), (10, 50, 1)]


def test_concurrent_requests_split_a_replicas_time() -> None:
    busy, shares = replica_usage([(0, 60, "a"), (30, 90, "b"), (200, 230, "a")], gpus=2)
    assert busy == 2 * (90 + 30)
    assert shares == {"a": 2 * (30 + 15 + 30), "b": 2 * (15 + 30)}


def test_identical_intervals_share_equally_whatever_their_order() -> None:
    busy, shares = replica_usage([(0, 10, "b"), (0, 10, "a"), (0, 10, "a")], gpus=1)
    assert busy == 10
    assert shares == {"a": Fraction(20, 3), "b": Fraction(10, 3)}


requests = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=1000),
        st.integers(min_value=0, max_value=300),
        st.sampled_from(["a", "b", "c"]),
    ).map(lambda r: (r[0], r[0] + r[1], r[2])),
    max_size=25,
)


# whole GPUs, or GPUs per replica × a MIG slice's share of a card
cards = st.one_of(
    st.integers(min_value=0, max_value=8),
    st.builds(
        lambda g, n, d: g * Fraction(n, d),
        st.integers(0, 8),
        st.integers(1, 64),
        st.integers(1, 64),
    ),
)


@given(requests, cards)
def test_shares_sum_to_busy_time_which_is_at_most_the_span(
    found: list[tuple[int, int, str]], gpus: Fraction
) -> None:
    busy, shares = replica_usage(found, gpus=gpus)
    assert sum(shares.values()) == busy
    assert 0 <= busy <= gpus * sum(e - s for s, e, _ in found)
    assert all(share > 0 for share in shares.values()) or gpus == 0


@given(requests)
def test_doubling_every_request_keeps_busy_time_and_shares(
    found: list[tuple[int, int, str]],
) -> None:
    assert replica_usage(found + found, gpus=1) == replica_usage(found, gpus=1)
