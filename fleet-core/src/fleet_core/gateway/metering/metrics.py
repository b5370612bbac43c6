"""The gateway's Prometheus metrics, in a registry of their own.

Operators need request rates, token volumes, latencies and limiter health per tenant, project and
model. Every request already ends in one ``UsageRecord``, so the metrics are derived from that
record rather than from instrumentation scattered through the routes: the numbers on the dashboard
and the numbers in the ledger then describe the same requests, counted the same way (P6).

Each ``GatewayMetrics`` owns its ``CollectorRegistry`` — never prometheus_client's global one — so
the resources object holds it like any other dependency, and two apps (or two tests) in one process
never add into each other's counters (STYLE §2). The metrics every request updates (requests,
tokens, the two latency histograms, in flight) are plain numbers (`series`) collected into the
same families prometheus_client would show: its ``inc`` and ``observe`` cost about 6 us a
request (ADR 0002). The rare ones (refusals, store errors, dropped settlements) stay its own.

With ``fleet-gateway --workers N`` each worker is its own process: it keeps its metrics in memory
as one process does, and ``flushing.WorkerFiles`` copies them in batches (within
``flush_interval_s`` of a change, before this worker renders, at shutdown) to prometheus_client's
multiprocess files in ``multiprocess_dir``, the directory the supervisor gives every worker. A
scrape, whichever worker answers it, sums every worker's counters and histograms and the live
workers' in-flight gauges: its own current, the others' at most ``flush_interval_s`` old. Endpoint
readiness is the answering worker's own view (every worker checks every endpoint).

Guarantee: no label value ever carries an API key or a key id. ``UsageRecord.key_id`` is never
used as a label, and every label value taken from a record or a caller passes a check here:
a value containing the record's key id, or a tenant/project/level/dimension containing ``/`` (keys
look like ``tenant/project/keyid``; those names never contain ``/``), becomes ``"invalid"``.
Endpoint URLs lose any userinfo, query and fragment, where credentials could hide.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from fleet_core.gateway.metering.flushing import WorkerFiles
from fleet_core.gateway.metering.records import UsageRecord
from fleet_core.gateway.metering.series import (
    CounterSeries,
    GaugeSeries,
    HistogramSeries,
    SeriesCollector,
)

__all__ = ["LATENCY_BUCKETS", "EndpointSignals", "EndpointStates", "GatewayMetrics"]

EndpointStates = Callable[[], Iterable[tuple[str, str, bool]]]
"""Returns ``(model, endpoint_url, ready)`` for every known endpoint, called at scrape time."""
EndpointSignals = Callable[[], Iterable[tuple[str, str, float | None, int | None, int | None]]]
"""Returns ``(model, endpoint_url, kv_usage, queue_depth, kv_capacity_tokens)`` per endpoint
with fresh engine signals (None where the engine publishes no such figure)."""

_SUB_SECOND = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75)
_SECONDS = (1.0, 1.5, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0)
LATENCY_BUCKETS = _SUB_SECOND + _SECONDS
"""Seconds. Dense below a second for time to first token, wide enough for long generations."""

INVALID = "invalid"
ANONYMOUS_TENANT = "anonymous"
NO_PROJECT = "none"


def _no_endpoints() -> Iterable[tuple[str, str, bool]]:
    return ()


def _unchanged() -> None:
    pass


def _no_signals() -> Iterable[tuple[str, str, float | None, int | None, int | None]]:
    return ()


class GatewayMetrics:
    """Counters, gauges and histograms for one gateway, and their exposition."""

    def __init__(
        self,
        *,
        endpoints: EndpointStates = _no_endpoints,
        signals: EndpointSignals = _no_signals,
        multiprocess_dir: Path | None = None,
        flush_interval_s: float = 1.0,
        pid: int | None = None,
    ) -> None:
        """``multiprocess_dir``: a worker's shared directory (None: one process); ``pid`` names
        this worker's files there (default: this process's, which the supervisor knows)."""
        self._registry = registry = CollectorRegistry()
        self._exposed = registry
        self._files: WorkerFiles | None = None
        self._changed: Callable[[], None] = _unchanged  # no files: nothing to schedule
        if multiprocess_dir is not None:
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=str(multiprocess_dir))  # type: ignore[no-untyped-call]
            self._files = WorkerFiles(
                registry,
                multiprocess_dir,
                pid=os.getpid() if pid is None else pid,
                interval_s=flush_interval_s,
            )
            self._changed = self._files.changed
        scope = ("tenant", "project", "model")
        self._requests = CounterSeries(
            "fleet_requests_total",
            "Requests finished, by status class (2xx, 4xx, 5xx).",
            (*scope, "status_class"),
        )
        self._tokens = CounterSeries(
            "fleet_tokens_total",
            "Tokens used: input_fresh, input_cached, output.",
            (*scope, "side"),
        )
        self._duration = HistogramSeries(
            "fleet_request_duration_seconds",
            "Time from receiving a request to its last byte.",
            ("model",),
            LATENCY_BUCKETS,
        )
        self._ttft = HistogramSeries(
            "fleet_time_to_first_token_seconds",
            "Time from receiving a streamed request to its first byte.",
            ("model",),
            LATENCY_BUCKETS,
        )
        self._in_flight = GaugeSeries(
            "fleet_requests_in_flight", "Requests received and not yet finished.", ("model",)
        )
        # Per request: plain values (`series`); written with every worker's gauges as livesum
        # (flushing.WorkerFiles), so a worker that exited holds nothing in flight.
        registry.register(
            SeriesCollector(
                self._requests, self._tokens, self._duration, self._ttft, self._in_flight
            )
        )
        self._refusals = Counter(
            "fleet_rate_limit_refusals_total",
            "Requests refused by a rate limit or budget rule, by tenant and project (never key).",
            ("tenant", "project", "level", "dimension"),
            registry=registry,
        )
        self._refused = Counter(
            "fleet_requests_refused_total",
            "Requests refused before reaching an engine (a limit, a budget, an inactive tenant"
            " or project), by status: counted here, not kept as ledger rows.",
            ("tenant", "project", "model", "status"),
            registry=registry,
        )
        self._out_of_bounds = Counter(
            "fleet_engine_usage_out_of_bounds_total",
            "Engine usage figures out of bounds (negative, more completion than reserved, a"
            " prompt far past the gateway's count), billed at the bound: by model and figure.",
            ("model", "figure"),
            registry=registry,
        )
        self._store_errors = Counter(
            "fleet_rate_limiter_store_errors_total",
            "Rate limiter store calls that failed or timed out.",
            registry=registry,
        )
        self._settlements_dropped = Counter(
            "fleet_settlements_dropped_total",
            "Settlement batches given up (over the retry cap, or unconfirmed at shutdown).",
            registry=registry,
        )
        # Asked live at each scrape: the answering worker's own view with --workers N.
        self._exposed.register(_EndpointReadiness(endpoints))
        self._exposed.register(_EngineSignals(signals))

    @property
    def registry(self) -> CollectorRegistry:
        """This instance's registry, e.g. to add a process collector."""
        return self._registry

    def observe(self, record: UsageRecord) -> None:
        """Count one finished request: its status, its tokens and its latencies."""
        tenant, project, model = _scope_labels(record)
        self._requests.inc((tenant, project, model, _status_class(record.status)))
        prompt, completion, cached = record.billed_tokens()
        if record.kind == "embeddings":  # an embedding produces no tokens, whatever a count says
            completion = 0
        tokens = self._tokens
        if prompt - cached > 0:
            tokens.inc((tenant, project, model, "input_fresh"), prompt - cached)
        if cached > 0:
            tokens.inc((tenant, project, model, "input_cached"), cached)
        if completion > 0:
            tokens.inc((tenant, project, model, "output"), completion)
        self._observe_latency(record, (model,))
        for figure in record.out_of_bounds:
            self._out_of_bounds.labels(model, figure).inc()
        self._changed()

    def refusal(self, record: UsageRecord) -> None:
        """One request refused before it reached an engine (its record bills nothing)."""
        tenant, project, model = _scope_labels(record)
        self._refused.labels(tenant, project, model, str(record.status)).inc()
        self._changed()

    def _observe_latency(self, record: UsageRecord, model: tuple[str]) -> None:
        self._duration.observe(model, _elapsed(record.received_at, record.done_at))
        if record.stream and record.first_byte_at is not None:
            self._ttft.observe(model, _elapsed(record.received_at, record.first_byte_at))

    def request_started(self, model: str) -> None:
        self._in_flight.add((model,), 1.0)
        self._changed()

    def request_finished(self, model: str) -> None:
        self._in_flight.add((model,), -1.0)
        self._changed()

    def refused(self, *, tenant: str, project: str, level: str, dimension: str) -> None:
        """One request refused by a limit or budget; ``tenant``/``project`` are names, never a
        key (a value that looks like one becomes ``invalid``)."""
        self._refusals.labels(
            _keyless(tenant), _keyless(project), _keyless(level), _keyless(dimension)
        ).inc()
        self._changed()

    def store_error(self) -> None:
        self._store_errors.inc()
        self._changed()

    def settlement_dropped(self) -> None:
        self._settlements_dropped.inc()
        self._changed()

    def flush(self) -> None:
        """A worker's values to the shared files now, e.g. as it stops; nothing in one process."""
        if self._files is not None:
            self._files.flush()

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition and its content type: OpenMetrics if ``accept`` asks, else text 0.0.4."""
        self.flush()  # this worker's own counts are current in its own scrape
        encode, content_type = choose_encoder(accept or "")
        return encode(self._exposed), content_type


def _scope_labels(record: UsageRecord) -> tuple[str, str, str]:
    """``(tenant, project, model)`` label values of a record, none of them a key or key id."""
    key_id = record.key_id
    return (
        _scope_name(record.tenant, default=ANONYMOUS_TENANT, key_id=key_id),
        _scope_name(record.project, default=NO_PROJECT, key_id=key_id),
        _without_key_id(record.model, key_id),
    )


def _scope_name(value: str | None, *, default: str, key_id: str | None) -> str:
    if value is None:
        return default
    return _without_key_id(_keyless(value), key_id)


def _keyless(value: str) -> str:
    """``value``, unless it could be a full key: names never contain ``/``, keys always do."""
    return INVALID if "/" in value else value


def _without_key_id(value: str, key_id: str | None) -> str:
    return INVALID if key_id and key_id in value else value


_STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


def _status_class(status: int) -> str:
    return _STATUS_CLASSES[status // 100 - 1] if 100 <= status <= 599 else "other"


def _elapsed(start: float, end: float) -> float:
    # Wall-clock stamps can step backwards; a negative duration would corrupt every bucket.
    seconds = end - start
    return seconds if seconds > 0.0 else 0.0


class _EndpointReadiness:
    """``fleet_endpoint_ready{model,endpoint}``: 1 or 0, asked of ``endpoints`` at each scrape."""

    def __init__(self, endpoints: EndpointStates) -> None:
        self._endpoints = endpoints

    def describe(self) -> Iterable[Metric]:
        # Lets the registry learn the name without calling ``endpoints`` at registration.
        return [_readiness_family()]

    def collect(self) -> Iterable[Metric]:
        states = {(model, _public_url(url)): ready for model, url, ready in self._endpoints()}
        family = _readiness_family()
        for labels, ready in states.items():
            family.add_metric(labels, 1.0 if ready else 0.0)
        return [family]


_SIGNAL_FAMILIES = (
    ("fleet_endpoint_kv_usage_ratio", "The engine's KV-cache occupancy, 0 to 1 (vLLM only)."),
    (
        "fleet_endpoint_queue_depth",
        "Requests waiting inside the engine (vLLM waiting, llama.cpp deferred).",
    ),
    ("fleet_endpoint_kv_capacity_tokens", "The engine's KV-cache capacity in tokens (vLLM only)."),
)


class _EngineSignals:
    """The engines' own load figures per endpoint, from the gateway's scrapes, where known."""

    def __init__(self, signals: EndpointSignals) -> None:
        self._signals = signals

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(n, h, labels=("model", "endpoint")) for n, h in _SIGNAL_FAMILIES]

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        seen: set[tuple[str, str]] = set()
        for model, url, *values in self._signals():
            labels = (model, _public_url(url))
            if labels in seen:
                continue
            seen.add(labels)
            for family, value in zip(families, values, strict=True):
                if value is not None:
                    family.add_metric(labels, float(value))
        return families


def _readiness_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "fleet_endpoint_ready",
        "Whether an engine endpoint is ready to take requests (1) or not (0).",
        labels=("model", "endpoint"),
    )


def _public_url(url: str) -> str:
    """``url`` without userinfo, query or fragment, where credentials may be embedded."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return INVALID
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
