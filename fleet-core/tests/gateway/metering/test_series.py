"""The plain series show exactly what prometheus_client's own metrics would, and add up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families

from fleet_core.gateway.metering import flushing
from fleet_core.gateway.metering.metrics import LATENCY_BUCKETS, GatewayMetrics
from fleet_core.gateway.metering.series import (
    CounterSeries,
    GaugeSeries,
    HistogramSeries,
    SeriesCollector,
)

from .test_metrics import record

NAMES = ("a", "b", "x y", 'q"uote', "ü")
LABELS = st.tuples(st.sampled_from(NAMES), st.sampled_from(NAMES))
AMOUNTS = st.one_of(
    st.integers(min_value=0, max_value=10**6),
    st.floats(min_value=0, max_value=500, allow_nan=False),
    st.sampled_from([*LATENCY_BUCKETS, 0.0]),  # exactly on a bound: that bucket, not the next
)
Ops = list[tuple[str, tuple[str, str], float]]
"""Operations on a label set: ("inc" | "gauge" | "observe", labels, amount)."""
OPS = st.lists(
    st.tuples(st.sampled_from(["inc", "gauge", "observe"]), LABELS, AMOUNTS), max_size=60
)


class Pair:
    """The same three metrics twice: prometheus_client's and the plain series."""

    @classmethod
    def after(cls, ops: Ops) -> Pair:
        """A pair that has had every one of ``ops`` applied to both sides."""
        pair = cls()
        for op in ops:
            pair.apply(*op)
        return pair

    def __init__(self) -> None:
        self.ours, self.theirs = CollectorRegistry(), CollectorRegistry()
        names = ("tenant", "model")
        self.counter = CounterSeries("t_requests_total", "Requests.", names)
        self.gauge = GaugeSeries("t_in_flight", "In flight.", names)
        self.histogram = HistogramSeries("t_seconds", "Seconds.", names, LATENCY_BUCKETS)
        self.ours.register(SeriesCollector(self.counter, self.gauge, self.histogram))
        self.ref_counter = Counter("t_requests_total", "Requests.", names, registry=self.theirs)
        self.ref_gauge = Gauge("t_in_flight", "In flight.", names, registry=self.theirs)
        self.ref_histogram = Histogram(
            "t_seconds", "Seconds.", names, buckets=LATENCY_BUCKETS, registry=self.theirs
        )

    def apply(self, op: str, labels: tuple[str, str], amount: float) -> None:
        if op == "inc":
            self.counter.inc(labels, amount)
            self.ref_counter.labels(*labels).inc(amount)
        elif op == "gauge":
            self.gauge.add(labels, -amount)
            self.ref_gauge.labels(*labels).dec(amount)
        else:
            self.histogram.observe(labels, amount)
            self.ref_histogram.labels(*labels).observe(amount)


def _without_created(text: bytes) -> str:
    """The exposition with ``_created`` values blanked (each side stamps its own clock)."""
    return re.sub(r"(_created\{[^\n]*\}) \S+", r"\1 T", text.decode())


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_the_exposition_is_prometheus_clients_own(
    ops: Ops,
) -> None:
    pair = Pair.after(ops)
    for encode in (generate_latest, openmetrics_latest):
        assert _without_created(encode(pair.ours)) == _without_created(encode(pair.theirs))


@settings(max_examples=100, deadline=None)
@given(OPS)
def test_the_worker_files_hold_what_prometheus_clients_would(
    ops: Ops,
) -> None:
    """What `flushing` writes for ``--workers N`` (and so what a scrape sums) is unchanged."""
    pair = Pair.after(ops)
    ours = sorted(flushing._file_entries(pair.ours, gauge_kind="gauge_livesum"))
    theirs = sorted(flushing._file_entries(pair.theirs, gauge_kind="gauge_livesum"))
    assert ours == theirs


def test_created_is_when_a_label_set_was_first_seen() -> None:
    pair = Pair()
    pair.apply("inc", ("a", "b"), 1)
    pair.apply("observe", ("a", "b"), 0.2)
    created = [
        sample
        for family in text_string_to_metric_families(generate_latest(pair.ours).decode())
        for sample in family.samples
        if sample.name.endswith("_created")
    ]
    assert {s.name for s in created} == {"t_requests_created", "t_seconds_created"}
    theirs = {s.name: s.value for s in next(iter(pair.theirs.collect())).samples}
    assert all(abs(s.value - theirs["t_requests_created"]) < 5 for s in created)


@pytest.mark.parametrize("k", [1, 7, 250])
def test_a_scrape_after_k_requests_shows_k(k: int) -> None:
    metrics = GatewayMetrics()
    for i in range(k):
        metrics.request_started("llama-3-8b")
        metrics.request_finished("llama-3-8b")
        metrics.observe(record(request_id=f"req-{i}", status=200 if i % 3 else 429))
    body, _ = metrics.render(None)
    samples = [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]
    total = sum(s.value for s in samples if s.name == "fleet_requests_total")
    assert total == k
    assert sum(s.value for s in samples if s.name == "fleet_request_duration_seconds_count") == k
    assert sum(s.value for s in samples if s.name == "fleet_requests_in_flight") == 0


def test_k_requests_over_two_workers_files_sum_to_k(tmp_path: Path) -> None:
    """Two workers' files, summed by prometheus_client's collector as a scrape sums them."""
    from prometheus_client.multiprocess import MultiProcessCollector

    workers = [
        GatewayMetrics(multiprocess_dir=tmp_path, pid=pid, flush_interval_s=60) for pid in (1, 2)
    ]
    for i in range(9):
        workers[i % 2].observe(record(request_id=f"req-{i}"))
    for worker in workers:
        worker.flush()
    summed = CollectorRegistry()
    MultiProcessCollector(summed, path=str(tmp_path))  # type: ignore[no-untyped-call]
    samples = [s for f in summed.collect() for s in f.samples]
    assert sum(s.value for s in samples if s.name == "fleet_requests_total") == 9
    outputs = sum(
        s.value
        for s in samples
        if s.name == "fleet_tokens_total" and s.labels.get("side") == "output"
    )
    assert outputs == 9 * 30
