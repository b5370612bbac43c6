"""A worker's metrics written to prometheus_client's multiprocess files in batches.

prometheus_client's own multiprocess mode backs every value with an mmap'd file: each ``inc`` or
``observe`` takes a process-wide lock and writes the file: py-spy found prometheus_client in 3-4%
of a ``--workers 2`` gateway's samples, 1.5% with values in memory (ADR 0002). So a
worker keeps plain in-memory metrics (the per-request ones as plain numbers, `series`; the rare
ones as prometheus_client's single-process values) and this module
copies them into the same files, in the same format, in batches: within ``interval_s`` of any
change (a timer in the worker's event loop, armed by the first change after a write), just before
the worker renders ``/metrics`` itself, and once more when it stops. ``MultiProcessCollector`` in
any worker sums the files as before.

What that costs: another worker's counts in a scrape are at most ``interval_s`` old (Prometheus
scrapes every 15-60 s); the answering worker's own are current. A worker killed without a drain
(SIGKILL) loses what it counted since its last write. A value is written whole (a float in
place, as prometheus_client does), so a reader never sees a torn one.

Only what the files hold is written: counters' ``_total``, gauges, histograms' per-bucket counts
(the files keep each bucket's own count, not the cumulative one the exposition shows) and
``_sum``. ``_created`` samples are left out, as prometheus_client's multiprocess mode does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.registry import CollectorRegistry

__all__ = ["WorkerFiles"]

log = logging.getLogger("fleet.metrics")

Entry = tuple[str, str, float]
"""``(file kind, mmap key, value)``: the kind names the file (``counter``, ``gauge_livesum``)."""


class WorkerFiles:
    """One worker's values, copied from ``registry`` into ``directory`` as ``{kind}_{pid}.db``.

    Every gauge of ``registry`` is written as ``gauge_mode`` (``livesum``: summed over the live
    workers; the supervisor removes a stopped worker's file). Call ``changed`` on each update
    (cheap: it arms the timer once per batch), ``flush`` to write now. The timer runs in the
    event loop of the change that armed it; a change outside any event loop is written at once.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        directory: Path,
        *,
        pid: int,
        interval_s: float,
        gauge_mode: str = "livesum",
    ) -> None:
        self._registry = registry
        self._directory = directory
        self._pid = pid
        self._interval_s = interval_s
        self._gauge_kind = f"gauge_{gauge_mode}"
        self._timer: asyncio.TimerHandle | None = None
        self._keys = _Keys()
        self._lock = threading.Lock()

    def changed(self) -> None:
        """A value changed: written within ``interval_s`` (at once outside an event loop)."""
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._timer = loop.call_later(self._interval_s, self.flush)

    def flush(self) -> None:
        """Write every current value to this worker's files. A write that fails (the directory
        gone at shutdown, a full disk) is logged; the next one writes everything again."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with self._lock:  # one writer per file: two would append new keys over each other
            self._write_all()

    def _write_all(self) -> None:
        by_kind: dict[str, list[tuple[str, float]]] = {}
        entries = _file_entries(self._registry, gauge_kind=self._gauge_kind, keys=self._keys)
        for kind, key, value in entries:
            by_kind.setdefault(kind, []).append((key, value))
        for kind, values in by_kind.items():
            path = self._directory / f"{kind}_{self._pid}.db"
            try:
                _write(path, values)
            except OSError as exc:
                log.warning("metrics: could not write %s (%s)", path, exc)


def _write(path: Path, values: list[tuple[str, float]]) -> None:
    # Opened per batch: a worker holds no file between writes, and at one write a second (or
    # per scrape) the open costs nothing the requests notice.
    db = MmapedDict(str(path))  # type: ignore[no-untyped-call]
    try:
        for key, value in values:
            db.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
    finally:
        db.close()  # type: ignore[no-untyped-call]


class _Keys:
    """mmap keys by series, made once: the key is JSON, the dearest part of a write."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}

    def __call__(self, family: Metric, name: str, labels: dict[str, str]) -> str:
        series = (family.name, name, tuple(labels.items()))
        key = self._made.get(series)
        if key is None:
            values = list(labels.values())
            key = mmap_key(family.name, name, list(labels), values, family.documentation)
            self._made[series] = key
        return key


def _file_entries(
    registry: CollectorRegistry, *, gauge_kind: str, keys: _Keys | None = None
) -> Iterator[Entry]:
    """What prometheus_client's multiprocess values would hold for ``registry``'s metrics."""
    key = _Keys() if keys is None else keys
    for family in registry.collect():
        if family.type == "counter":
            yield from _entries(family, "counter", key, suffix="_total")
        elif family.type == "gauge":
            yield from _entries(family, gauge_kind, key, suffix="")
        elif family.type == "histogram":
            yield from _entries(family, "histogram", key, suffix="_sum")
            yield from _bucket_entries(family, key)


def _entries(family: Metric, kind: str, key: _Keys, *, suffix: str) -> Iterator[Entry]:
    name = family.name + suffix
    for sample in family.samples:
        if sample.name == name:
            yield kind, key(family, name, sample.labels), sample.value


def _bucket_entries(family: Metric, key: _Keys) -> Iterator[Entry]:
    """Each bucket's own count: the exposition's cumulative counts, less the bucket below."""
    below: dict[tuple[tuple[str, str], ...], float] = {}
    name = family.name + "_bucket"
    for sample in family.samples:
        if sample.name != name:
            continue
        series = tuple((k, v) for k, v in sample.labels.items() if k != "le")
        count = sample.value - below.get(series, 0.0)
        below[series] = sample.value
        yield "histogram", key(family, name, sample.labels), count
