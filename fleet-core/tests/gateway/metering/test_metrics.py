"""GatewayMetrics, checked through its exposition as Prometheus would parse it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgspec
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fleet_core.gateway.metering.metrics import GatewayMetrics
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord
from fleet_testing.records import usage_record

KEY_ID = "kid_7Hq2xZr9PwLs"
FULL_KEY = f"acme/search/{KEY_ID}"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"

BASE = usage_record(
    model="llama-3-8b",
    served_model="llama-3-8b-instruct",
    gateway=GatewayCount(prompt_tokens=12, completion_tokens=30, method="tokenizer"),
    project="search",
    key_id=KEY_ID,
)


def record(**changes: Any) -> UsageRecord:
    return msgspec.structs.replace(BASE, **changes)


def scrape(metrics: GatewayMetrics) -> list[Sample]:
    body, content_type = metrics.render(None)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    families = text_string_to_metric_families(body.decode())
    return [sample for family in families for sample in family.samples]


def openmetrics_samples(body: bytes) -> list[Sample]:
    families = openmetrics_families(body.decode())  # type: ignore[no-untyped-call]
    return [sample for family in families for sample in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) <= 1, f"duplicate series {name}{labels}"
    return found[0] if found else None


def scope(model: str = "llama-3-8b", **labels: str) -> dict[str, str]:
    return {"tenant": "acme", "project": "search", "model": model, **labels}


def buckets(samples: list[Sample], name: str) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    """Per series (labels without ``le``): ``(le, cumulative count)`` in ascending ``le``."""
    series: dict[tuple[str, ...], list[tuple[float, float]]] = defaultdict(list)
    for s in samples:
        if s.name == f"{name}_bucket":
            rest = tuple(sorted(f"{k}={v}" for k, v in s.labels.items() if k != "le"))
            series[rest].append((float(s.labels["le"]), s.value))
    return {key: sorted(points) for key, points in series.items()}


def test_requests_are_counted_per_scope_and_status_class() -> None:
    metrics = GatewayMetrics()
    for status in (200, 200, 429, 499, 503):
        metrics.observe(record(status=status))
    metrics.observe(record(tenant=None, project=None))

    samples = scrape(metrics)

    assert value(samples, "fleet_requests_total", **scope(status_class="2xx")) == 2
    assert value(samples, "fleet_requests_total", **scope(status_class="4xx")) == 2
    assert value(samples, "fleet_requests_total", **scope(status_class="5xx")) == 1
    anonymous = {"tenant": "anonymous", "project": "none", "model": "llama-3-8b"}
    assert value(samples, "fleet_requests_total", **anonymous, status_class="2xx") == 1


def test_the_model_label_is_the_requested_model() -> None:
    metrics = GatewayMetrics()
    metrics.observe(record())

    samples = scrape(metrics)

    assert value(samples, "fleet_requests_total", **scope(status_class="2xx")) == 1
    assert not [s for s in samples if s.labels.get("model") == "llama-3-8b-instruct"]


def test_tokens_split_into_fresh_cached_and_output() -> None:
    metrics = GatewayMetrics()
    metrics.observe(
        record(engine=EngineUsage(prompt_tokens=100, completion_tokens=7, cached_tokens=40))
    )
    metrics.observe(record(engine=EngineUsage(prompt_tokens=10, completion_tokens=3)))

    samples = scrape(metrics)

    assert value(samples, "fleet_tokens_total", **scope(side="input_fresh")) == 70
    assert value(samples, "fleet_tokens_total", **scope(side="input_cached")) == 40
    assert value(samples, "fleet_tokens_total", **scope(side="output")) == 10


def test_without_engine_usage_the_gateway_count_is_used_and_zero_sides_stay_absent() -> None:
    metrics = GatewayMetrics()
    metrics.observe(record(engine=None, gateway=GatewayCount(21, 0, method="tokenizer")))

    samples = scrape(metrics)

    assert value(samples, "fleet_tokens_total", **scope(side="input_fresh")) == 21
    assert value(samples, "fleet_tokens_total", **scope(side="input_cached")) is None
    assert value(samples, "fleet_tokens_total", **scope(side="output")) is None


def test_an_embedding_adds_no_output_tokens_even_when_a_count_claims_some() -> None:
    metrics = GatewayMetrics()
    embedding = record(
        kind="embeddings",
        model="bge-m3",
        engine=EngineUsage(prompt_tokens=50, completion_tokens=9),
        gateway=GatewayCount(prompt_tokens=50, completion_tokens=4, method="tokenizer"),
    )
    metrics.observe(embedding)
    metrics.observe(msgspec.structs.replace(embedding, engine=None))

    samples = scrape(metrics)

    assert value(samples, "fleet_tokens_total", **scope("bge-m3", side="input_fresh")) == 100
    assert not [s for s in samples if s.labels.get("side") == "output"]


def test_time_to_first_token_is_observed_for_streams_with_a_first_byte_only() -> None:
    metrics = GatewayMetrics()
    metrics.observe(record(stream=True, first_byte_at=1000.25, done_at=1002.0))
    metrics.observe(record(stream=True, first_byte_at=None, status=502))
    metrics.observe(record(stream=False, first_byte_at=1000.1))

    samples = scrape(metrics)

    model = {"model": "llama-3-8b"}
    assert value(samples, "fleet_time_to_first_token_seconds_count", **model) == 1
    assert value(samples, "fleet_time_to_first_token_seconds_sum", **model) == pytest.approx(0.25)
    assert value(samples, "fleet_request_duration_seconds_count", **model) == 3
    assert value(samples, "fleet_request_duration_seconds_sum", **model) == pytest.approx(2.8)


def test_a_clock_stepping_backwards_is_observed_as_zero_not_negative() -> None:
    metrics = GatewayMetrics()
    metrics.observe(record(done_at=999.0))

    samples = scrape(metrics)

    assert value(samples, "fleet_request_duration_seconds_sum", model="llama-3-8b") == 0
    assert value(samples, "fleet_request_duration_seconds_count", model="llama-3-8b") == 1


def traffic(metrics: GatewayMetrics, durations: list[float]) -> None:
    for i, duration in enumerate(durations):
        model = "llama-3-8b" if i % 2 else "qwen-2.5-7b"
        done = BASE.received_at + duration
        metrics.observe(record(model=model, stream=True, first_byte_at=done - 0.01, done_at=done))


@pytest.mark.parametrize(
    "name", ["fleet_request_duration_seconds", "fleet_time_to_first_token_seconds"]
)
def test_histogram_buckets_are_cumulative_and_never_decrease_between_scrapes(name: str) -> None:
    metrics = GatewayMetrics()
    traffic(metrics, [0.003, 0.2, 0.9, 4.0, 37.0])
    before = scrape(metrics)
    traffic(metrics, [0.004, 0.05, 1.3, 75.0, 300.0, 0.6, 11.0])
    after = scrape(metrics)

    for samples in (before, after):
        for labels, points in buckets(samples, name).items():
            counts = [count for _, count in points]
            assert counts == sorted(counts), f"{labels} not cumulative"
            model = dict(pair.split("=", 1) for pair in labels)
            assert points[-1] == (float("inf"), value(samples, f"{name}_count", **model))
    old, new = buckets(before, name), buckets(after, name)
    assert old.keys() <= new.keys()
    for labels, points in old.items():
        assert [le for le, _ in points] == [le for le, _ in new[labels]]
        for (le, was), (_, now) in zip(points, new[labels], strict=True):
            assert now >= was, f"{labels} le={le} went from {was} to {now}"
    assert sum(points[-1][1] for points in new.values()) == 12


def all_label_values(metrics: GatewayMetrics) -> list[tuple[str, str]]:
    openmetrics, _ = metrics.render(OPENMETRICS)
    samples = [*scrape(metrics), *openmetrics_samples(openmetrics)]
    return [(k, v) for s in samples for k, v in s.labels.items()]


def test_no_label_value_ever_carries_a_key_or_a_key_id() -> None:
    metrics = GatewayMetrics(
        endpoints=lambda: [("llama-3-8b", f"http://{KEY_ID}@engine-0/v1", True)]
    )
    metrics.observe(record())
    metrics.observe(record(tenant=FULL_KEY, project=FULL_KEY))
    metrics.observe(record(tenant="acme", project=f"search/{KEY_ID}"))
    metrics.observe(record(model=KEY_ID, stream=True, first_byte_at=1000.1))
    metrics.observe(record(tenant=KEY_ID, key_id=KEY_ID))
    metrics.refused(tenant=FULL_KEY, project=FULL_KEY, level=FULL_KEY, dimension="rpm")
    metrics.request_started("llama-3-8b")

    labels = all_label_values(metrics)

    for name, label_value in labels:
        assert KEY_ID not in label_value, f"{name}={label_value!r} carries the key id"
        assert FULL_KEY not in label_value, f"{name}={label_value!r} carries the key"
        if name in {"tenant", "project", "level", "dimension"}:
            assert "/" not in label_value, f"{name}={label_value!r} looks like a key"
    assert ("tenant", "invalid") in labels
    assert ("project", "invalid") in labels
    assert ("model", "invalid") in labels
    assert ("level", "invalid") in labels
    assert ("endpoint", "http://engine-0/v1") in labels


@pytest.mark.parametrize(
    "accept",
    [OPENMETRICS, "application/openmetrics-text", "text/html, application/openmetrics-text"],
)
def test_openmetrics_is_served_when_asked_for(accept: str) -> None:
    metrics = GatewayMetrics()
    metrics.observe(record())

    body, content_type = metrics.render(accept)

    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    samples = openmetrics_samples(body)
    assert value(samples, "fleet_requests_total", **scope(status_class="2xx")) == 1


@pytest.mark.parametrize("accept", [None, "", "*/*", "text/plain"])
def test_text_format_0_0_4_is_the_default(accept: str | None) -> None:
    body, content_type = GatewayMetrics().render(accept)

    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# EOF" not in body


def test_two_instances_do_not_share_counts() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.observe(record())
    first.refused(tenant="acme", project="search", level="tenant", dimension="tpm")
    second.observe(record(status=500))

    one, two = scrape(first), scrape(second)

    assert value(one, "fleet_requests_total", **scope(status_class="2xx")) == 1
    assert value(one, "fleet_requests_total", **scope(status_class="5xx")) is None
    assert value(two, "fleet_requests_total", **scope(status_class="2xx")) is None
    assert value(two, "fleet_requests_total", **scope(status_class="5xx")) == 1
    assert (
        value(
            two,
            "fleet_rate_limit_refusals_total",
            tenant="acme",
            project="search",
            level="tenant",
            dimension="tpm",
        )
        is None
    )


def test_endpoint_readiness_is_read_at_scrape_time() -> None:
    endpoints = [("llama-3-8b", "http://engine-0:8000", True)]
    metrics = GatewayMetrics(endpoints=lambda: endpoints)

    first = scrape(metrics)
    endpoints[:] = [
        ("llama-3-8b", "http://engine-0:8000", False),
        ("qwen-2.5-7b", "http://engine-1:8000", True),
    ]
    second = scrape(metrics)

    ready = "fleet_endpoint_ready"
    assert value(first, ready, model="llama-3-8b", endpoint="http://engine-0:8000") == 1
    assert value(first, ready, model="qwen-2.5-7b", endpoint="http://engine-1:8000") is None
    assert value(second, ready, model="llama-3-8b", endpoint="http://engine-0:8000") == 0
    assert value(second, ready, model="qwen-2.5-7b", endpoint="http://engine-1:8000") == 1


def test_requests_in_flight_rise_and_fall() -> None:
    metrics = GatewayMetrics()
    metrics.request_started("llama-3-8b")
    metrics.request_started("llama-3-8b")
    metrics.request_started("bge-m3")
    metrics.request_finished("llama-3-8b")
    metrics.request_finished("bge-m3")

    samples = scrape(metrics)

    assert value(samples, "fleet_requests_in_flight", model="llama-3-8b") == 1
    assert value(samples, "fleet_requests_in_flight", model="bge-m3") == 0


def test_refusals_are_counted_per_tenant_and_project_and_store_errors_are_counted() -> None:
    metrics = GatewayMetrics()
    metrics.refused(tenant="acme", project="search", level="tenant", dimension="rpm")
    metrics.refused(tenant="acme", project="search", level="tenant", dimension="rpm")
    metrics.refused(tenant="acme", project="chat", level="project", dimension="tpm")
    metrics.refused(tenant="globex", project="search", level="tenant", dimension="rpm")
    metrics.store_error()

    samples = scrape(metrics)

    refusals = "fleet_rate_limit_refusals_total"
    acme = {"tenant": "acme", "project": "search"}
    assert value(samples, refusals, **acme, level="tenant", dimension="rpm") == 2
    assert (
        value(samples, refusals, tenant="acme", project="chat", level="project", dimension="tpm")
        == 1
    )
    assert (
        value(samples, refusals, tenant="globex", project="search", level="tenant", dimension="rpm")
        == 1
    )
    assert value(samples, "fleet_rate_limiter_store_errors_total") == 1
