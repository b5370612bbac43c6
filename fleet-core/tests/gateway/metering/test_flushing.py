"""A worker's metrics in batches to prometheus_client's multiprocess files (``flushing.py``):
what the files sum to is what the workers counted, whenever they flushed."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from fleet_core.gateway.metering.metrics import GatewayMetrics
from fleet_core.gateway.metering.records import EngineUsage

from .test_metrics import BASE, record, scrape

HOUR = 3600.0  # no timer fires in a test: only the flushes it asks for


def summed(directory: Path) -> list[Sample]:
    """What any worker's scrape shows: every file in ``directory``, summed."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return [sample for family in registry.collect() for sample in family.samples]


def total(samples: list[Sample], name: str) -> float:
    return sum(s.value for s in samples if s.name == name)


def comparable(samples: list[Sample]) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """Samples as a set, less ``_created`` (the multiprocess files keep no creation time)."""
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for s in samples
        if not s.name.endswith("_created")
    }


RECORDS = [
    record(),
    record(status=503, tenant="globex", project=None, done_at=1003.0),
    record(stream=True, first_byte_at=1000.02, done_at=1012.5, model="qwen"),
    record(engine=EngineUsage(prompt_tokens=100, completion_tokens=7, cached_tokens=40)),
    record(kind="embeddings", model="bge-m3", done_at=1000.001),
]


def test_the_files_sum_to_what_one_process_shows(tmp_path: Path) -> None:
    """Every series — counters, each histogram bucket, sums and counts, the live gauge — comes
    back from the files as the worker's own exposition shows it."""
    alone = GatewayMetrics()
    worker = GatewayMetrics(multiprocess_dir=tmp_path, flush_interval_s=HOUR)
    for metrics in (alone, worker):
        for finished in RECORDS * 3:
            metrics.observe(finished)
        metrics.request_started("qwen")
        metrics.refused(tenant="acme", project="search", level="tenant", dimension="rpm")
        metrics.store_error()
        metrics.settlement_dropped()
    worker.flush()
    assert comparable(summed(tmp_path)) == comparable(scrape(alone))


def test_a_worker_scrape_writes_its_own_counts_first(tmp_path: Path) -> None:
    async def scenario() -> list[Sample]:
        worker = GatewayMetrics(multiprocess_dir=tmp_path, flush_interval_s=HOUR)
        for _ in range(7):
            worker.request_started("m")
            worker.observe(BASE)
            worker.request_finished("m")
        assert summed(tmp_path) == []  # nothing written yet: the timer is an hour away
        return scrape(worker)

    shown = asyncio.run(scenario())
    assert total(shown, "fleet_requests_total") == 7
    assert total(shown, "fleet_request_duration_seconds_count") == 7
    assert total(shown, "fleet_requests_in_flight") == 0


def test_a_change_is_written_within_the_interval(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, float]:
        worker = GatewayMetrics(multiprocess_dir=tmp_path, flush_interval_s=0.05)
        worker.request_started("m")
        worker.observe(BASE)
        before = total(summed(tmp_path), "fleet_requests_total")
        await asyncio.sleep(0.3)
        return before, total(summed(tmp_path), "fleet_requests_in_flight")

    before, in_flight = asyncio.run(scenario())
    assert before == 0
    assert in_flight == 1
    assert total(summed(tmp_path), "fleet_requests_total") == 1


Step = tuple[str, int]
"""``(what, worker)``: what is ``start`` (a request in), ``finish`` (one out, observed), or
``flush``."""

steps = st.lists(
    st.tuples(st.sampled_from(["start", "finish", "flush"]), st.integers(0, 2)), max_size=60
)


@settings(deadline=None, max_examples=60)
@given(steps=steps)
def test_k_requests_from_any_interleaving_of_flushes_are_k_in_the_files(
    steps: list[Step],
) -> None:
    """Three workers in one directory, each flushing whenever the draw says: at every point the
    files hold each worker's counts as of its last flush, and after a last flush exactly K
    requests, K durations and nothing in flight."""
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(_interleave(Path(directory), steps))


async def _interleave(directory: Path, steps: list[Step]) -> None:
    workers = [
        GatewayMetrics(multiprocess_dir=directory, flush_interval_s=HOUR, pid=1000 + i)
        for i in range(3)
    ]
    in_flight, finished = [0, 0, 0], [0, 0, 0]
    flushed = [(0, 0), (0, 0), (0, 0)]  # (in flight, finished) each worker last wrote
    for what, i in steps:
        if what == "start":
            workers[i].request_started("m")
            in_flight[i] += 1
        elif what == "finish" and in_flight[i] > 0:
            workers[i].observe(msgspec.structs.replace(BASE, model="m"))
            workers[i].request_finished("m")
            in_flight[i], finished[i] = in_flight[i] - 1, finished[i] + 1
        elif what == "flush":
            workers[i].flush()
            flushed[i] = (in_flight[i], finished[i])
        files = summed(directory)
        assert total(files, "fleet_requests_total") == sum(f for _, f in flushed)
        assert total(files, "fleet_requests_in_flight") == sum(n for n, _ in flushed)
    for i, worker in enumerate(workers):
        for _ in range(in_flight[i]):
            worker.observe(msgspec.structs.replace(BASE, model="m"))
            worker.request_finished("m")
            finished[i] += 1
        worker.flush()
    files = summed(directory)
    assert total(files, "fleet_requests_total") == sum(finished)
    assert total(files, "fleet_request_duration_seconds_count") == sum(finished)
    assert total(files, "fleet_requests_in_flight") == 0
