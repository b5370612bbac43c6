"""Composing a report from measurements: the refusals, and the invariants end to end."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.control_plane.costs import closing
from fleet_core.control_plane.costs.measuring import Measurements, RateSlice
from fleet_core.control_plane.costs.periods import Period, parse_period
from fleet_core.control_plane.costs.wire import CostReport
from fleet_core.shared.errors import InvalidRequest

SEP = Period(2026, 9)
MONTH_US = 30 * 86_400 * 1_000_000
NOW = datetime(2026, 11, 30, tzinfo=UTC)
ANY = closing.Closing(min_coverage=Fraction(0), threshold=Fraction(95, 100))


def compose(found: Measurements, how: closing.Closing = ANY) -> CostReport:
    report, _ = closing.compose(SEP, found, closing=how, corrections=[], computed_at=NOW)
    return report


def test_periods_are_utc_months() -> None:
    assert parse_period("2026-12") is not None
    assert parse_period("2026-12").following().name == "2027-01"  # type: ignore[union-attr]
    assert Period(2027, 1).previous().name == "2026-12"
    assert SEP.seconds == 30 * 86_400
    assert [parse_period(p) for p in ("2026-13", "2026-9", "26-09", "1969-12")] == [None] * 4


def test_below_the_threshold_is_refused_naming_the_coverage() -> None:
    found = Measurements(observed_us={"a": MONTH_US // 2})
    with pytest.raises(InvalidRequest, match=r"observed 50\.00% \(a 50\.00%\)") as refused:
        compose(found, closing.Closing(min_coverage=Fraction(9, 10), threshold=Fraction(9, 10)))
    assert refused.value.param == "minCoverage"
    assert compose(found).forced is True


def test_a_cluster_used_but_never_observed_counts_as_unwatched() -> None:
    found = Measurements(observed_us={"a": MONTH_US}, busy_gpu_us={"b": 10})
    with pytest.raises(InvalidRequest, match=r"b 0\.00%"):
        compose(found, closing.Closing(min_coverage=Fraction(1, 2), threshold=Fraction(1, 2)))


def test_gpus_without_a_rate_name_the_cluster() -> None:
    found = Measurements(
        observed_us={"a": MONTH_US, "b": MONTH_US},
        capacity_gpu_us={"a": 10, "b": 10},
        slices=[RateSlice("a", 1, "USD", None, 10), RateSlice("b", 1, "USD", None, 4)],
    )
    with pytest.raises(InvalidRequest, match="cluster 'b'"):
        compose(found)


def test_one_pool_has_one_currency() -> None:
    found = Measurements(
        observed_us={"a": MONTH_US, "b": MONTH_US},
        capacity_gpu_us={"a": 10, "b": 10},
        slices=[RateSlice("a", 1, "USD", None, 10), RateSlice("b", 1, "EUR", None, 10)],
    )
    with pytest.raises(InvalidRequest, match="EUR, USD"):
        compose(found)


def test_nobody_used_the_fleet_so_the_pool_is_unallocated() -> None:
    found = Measurements(
        observed_us={"a": MONTH_US},
        capacity_gpu_us={"a": MONTH_US},
        slices=[RateSlice("a", 3_600_000, "USD", None, MONTH_US)],
    )
    report = compose(found)
    assert (report.pool, report.allocated, report.unallocated) == (2_592_000_000, 0, 2_592_000_000)


def test_differences_leave_out_zeros() -> None:
    before = {("a", "x"): 5, ("b", "y"): 3}
    after = {("a", "x"): 5, ("c", "z"): 3}
    assert closing.differences(before, after) == {("b", "y"): -3, ("c", "z"): 3}


HOUR_US = 3_600_000_000


def cards_us(most: int) -> st.SearchStrategy[Fraction]:
    """GPU-µs: whole, or exact fractions where MIG slices are in them (ADR 0026)."""
    whole = st.integers(0, most).map(Fraction)
    return st.one_of(whole, st.builds(Fraction, st.integers(0, most), st.integers(1, 64 * 2520)))


measurements = st.builds(
    lambda caps, rates, busy, used: Measurements(
        observed_us={c: MONTH_US for c in caps},
        capacity_gpu_us=dict(caps),
        slices=[RateSlice(c, rates, "USD", None, gpu_us) for c, gpu_us in caps.items()],
        busy_gpu_us=busy,
        used_gpu_us=used,
    ),
    st.dictionaries(st.sampled_from("abc"), cards_us(8 * 720 * HOUR_US), max_size=3),
    st.integers(0, 20_000_000),
    st.dictionaries(st.sampled_from("abc"), cards_us(9 * 720 * HOUR_US), max_size=3),
    st.dictionaries(
        st.tuples(st.sampled_from(["acme", "globex", ""]), st.sampled_from(["x", "y"])),
        cards_us(10**13),
        max_size=6,
    ),
)


@given(measurements)
def test_any_month_adds_up_to_the_micro_unit(found: Measurements) -> None:
    report = compose(found)
    assert report.busy + report.idle == report.pool
    assert 0 <= report.busy <= report.pool
    assert report.allocated + report.unallocated == report.pool
    assert sum(a.allocated for a in report.allocations) == report.allocated
    assert sum(t.due for t in report.tenants) == report.allocated
    assert sum(c.pool for c in report.clusters) == report.pool
    if any(found.used_gpu_us.values()):
        assert report.unallocated == 0
    assert all(
        a.allocated == 0 or found.used_gpu_us[(a.tenant, a.project)] > 0 for a in report.allocations
    )


@given(measurements, st.integers(2, 5))
def test_multiplying_every_tenants_usage_keeps_the_allocation(
    found: Measurements, factor: int
) -> None:
    scaled = Measurements(
        observed_us=found.observed_us,
        capacity_gpu_us=found.capacity_gpu_us,
        slices=found.slices,
        busy_gpu_us=found.busy_gpu_us,
        used_gpu_us={k: v * factor for k, v in found.used_gpu_us.items()},
    )
    shares = {(a.tenant, a.project): a.allocated for a in compose(found).allocations}
    assert {(a.tenant, a.project): a.allocated for a in compose(scaled).allocations} == shares


def priced(gpu_us: int, rate: int) -> Measurements:
    return Measurements(
        observed_us={"a": MONTH_US},
        capacity_gpu_us={"a": gpu_us},
        slices=[RateSlice("a", rate, "USD", None, gpu_us)],
    )


def test_a_pool_past_what_clients_read_exactly_is_400() -> None:
    hour = 3_600_000_000
    assert compose(priced(hour, 2**53 - 1)).pool == 2**53 - 1
    with pytest.raises(InvalidRequest, match="past 9007199254740991") as refused:
        compose(priced(hour + 1_000, 2**53 - 1))
    assert refused.value.code == "pool_out_of_range"
