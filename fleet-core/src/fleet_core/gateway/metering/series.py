"""The gateway's per-request metrics as plain numbers, collected as prometheus_client's families.

prometheus_client's ``Counter.inc`` and ``Histogram.observe`` take a lock per value and walk the
buckets in Python: about 6 us of every plain request (ADR 0002). Every update
here happens in the event loop's thread, so a value is a float in a dict (a histogram's bucket
counts a list) updated without a lock, and the exposition is built when a scrape collects it.

What a scrape sees is what prometheus_client's own ``Counter``, ``Gauge`` and ``Histogram`` with
the same names, labels and buckets would show: the same families, samples (``_total`` and
``_created``; ``_bucket`` with prometheus_client's ``le`` text, ``_count``, ``_sum`` and
``_created``), label order and float values (``tests/metering/test_series.py`` holds the two to
the same text). ``flushing.WorkerFiles`` reads them through the registry as before, so
``--workers N`` sums them as it summed prometheus_client's.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Sequence

from prometheus_client import metrics as _client
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

__all__ = ["CounterSeries", "GaugeSeries", "HistogramSeries", "SeriesCollector"]

Labels = tuple[str, ...]


def _created_shown() -> bool:
    """prometheus_client's switch (``PROMETHEUS_DISABLE_CREATED_SERIES``), followed as is."""
    return bool(getattr(_client, "_use_created", True))


class CounterSeries:
    """A labelled counter: ``fleet_x_total`` and ``fleet_x_created`` per label set."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name.removesuffix("_total")
        self.documentation, self.labelnames = documentation, tuple(labelnames)
        self._values: dict[Labels, float] = {}
        self._created: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        if labels in self._values:
            self._values[labels] += amount
        else:
            self._created[labels] = time.time()
            self._values[labels] = 0.0 + amount

    def collect(self) -> Metric:
        family = Metric(self.name, self.documentation, "counter")
        created = _created_shown()
        for labels, value in list(self._values.items()):
            named = dict(zip(self.labelnames, labels, strict=True))
            family.add_sample(self.name + "_total", named, value)
            if created:
                family.add_sample(self.name + "_created", dict(named), self._created[labels])
        return family


class GaugeSeries:
    """A labelled gauge (one sample per label set)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self._values: dict[Labels, float] = {}

    def add(self, labels: Labels, amount: float) -> None:
        self._values[labels] = self._values.get(labels, 0.0) + amount

    def collect(self) -> Metric:
        family = Metric(self.name, self.documentation, "gauge")
        for labels, value in list(self._values.items()):
            family.add_sample(self.name, dict(zip(self.labelnames, labels, strict=True)), value)
        return family


class HistogramSeries:
    """A labelled histogram: each label set keeps its buckets' own counts and a sum; the
    exposition's cumulative counts are made at collection, as prometheus_client makes them."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        bounds = [float(b) for b in buckets]
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._bounds = bounds
        self._le = [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]
        self._counts: dict[Labels, list[float]] = {}
        """Per label set: each bucket's own count, then the sum (one list, one lookup)."""
        self._created: dict[Labels, float] = {}

    def observe(self, labels: Labels, amount: float) -> None:
        counts = self._counts.get(labels)
        if counts is None:
            self._created[labels] = time.time()
            counts = self._counts[labels] = [0.0] * (len(self._bounds) + 1)
        counts[bisect.bisect_left(self._bounds, amount)] += 1.0  # the first bound >= amount
        counts[-1] += amount

    def collect(self) -> Metric:
        family = Metric(self.name, self.documentation, "histogram")
        created = _created_shown()
        for labels, counts in list(self._counts.items()):
            named = dict(zip(self.labelnames, labels, strict=True))
            cumulative = 0.0
            for le, count in zip(self._le, counts, strict=False):
                cumulative += count
                family.add_sample(self.name + "_bucket", {**named, "le": le}, cumulative)
            family.add_sample(self.name + "_count", dict(named), cumulative)
            family.add_sample(self.name + "_sum", dict(named), counts[-1])
            if created:
                family.add_sample(self.name + "_created", dict(named), self._created[labels])
        return family


class SeriesCollector:
    """Registers plain series with a ``CollectorRegistry``, in the order given."""

    def __init__(self, *series: CounterSeries | GaugeSeries | HistogramSeries) -> None:
        self._series = series

    def describe(self) -> Iterable[Metric]:
        # The names, for the registry to refuse a second collector claiming one of them.
        return self.collect()

    def collect(self) -> Iterable[Metric]:
        return [s.collect() for s in self._series]
