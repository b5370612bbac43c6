"""A record's billed figures, its units and its ledger row are what the plain computation gives.

The ledger decides the billed figures once per record, rates without a second record and builds
the COPY row with fewer operations; not one stored value may change. The reference below is the
old computation written out plainly (the properties as `UsageRecord` had them, the rating
``_record`` did, and the row `store.row_values` built), and hypothesis compares the two over
random engine and gateway usage.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import psycopg
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.gateway.ledger import LedgerWriter, store
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord
from fleet_core.shared.pricing import MAX_RATE, Rates

OUTCOMES = ["ok", "client_error", "upstream_error", "client_disconnected", "refused"]
counts = st.integers(0, 10**9)
# Unix times to the microsecond and beyond (floats from clocks), 2001 to 2100.
times = st.floats(978_307_200.0, 4_102_444_800.0, allow_nan=False, allow_infinity=False)
texts = st.text(max_size=12)
records = st.builds(
    UsageRecord,
    request_id=st.text(min_size=1, max_size=20),
    kind=st.sampled_from(["chat", "completions", "embeddings"]),
    model=texts,
    served_model=texts,
    endpoint=st.none() | st.just("http://engine:8000"),
    status=st.sampled_from([200, 400, 429, 499, 502, 504]),
    outcome=st.sampled_from(OUTCOMES),
    stream=st.booleans(),
    received_at=times,
    first_byte_at=st.none() | times,
    done_at=times,
    engine=st.none() | st.builds(EngineUsage, counts, counts, counts),
    gateway=st.builds(GatewayCount, counts, counts, st.sampled_from(["tiktoken", "chars/4"])),
    tenant=st.none() | texts,
    project=st.none() | texts,
    key_id=st.none() | texts,
    client_request_id=st.none() | texts,
)
rates = st.builds(
    Rates, st.integers(0, MAX_RATE), st.integers(0, MAX_RATE), st.integers(0, MAX_RATE)
)


def old_billed(r: UsageRecord) -> bool:
    if r.outcome == "refused" or r.endpoint is None:
        return False
    return not (r.outcome == "upstream_error" and r.first_byte_at is None)


def old_prompt(r: UsageRecord) -> int:
    if not old_billed(r):
        return 0
    return r.engine.prompt_tokens if r.engine else r.gateway.prompt_tokens


def old_completion(r: UsageRecord) -> int:
    if not old_billed(r):
        return 0
    return r.engine.completion_tokens if r.engine else r.gateway.completion_tokens


def old_cached(r: UsageRecord) -> int:
    """The engine's cached tokens, never more than the prompt (metering/bounds.py)."""
    return min(r.engine.cached_tokens, old_prompt(r)) if r.engine and old_billed(r) else 0


def old_fresh(r: UsageRecord) -> int:
    return old_prompt(r) - old_cached(r)


def old_units(r: UsageRecord, rates: Rates) -> int:
    return rates.micro_units(fresh=old_fresh(r), cached=old_cached(r), output=old_completion(r))


def old_when(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def old_row(r: UsageRecord) -> tuple[object, ...]:
    engine = r.engine
    return (
        r.request_id,
        old_when(r.received_at),
        old_when(r.first_byte_at),
        old_when(r.done_at),
        r.tenant,
        r.project,
        r.key_id,
        r.model,
        r.served_model,
        r.endpoint,
        r.kind,
        r.status,
        r.outcome,
        r.stream,
        engine.prompt_tokens if engine else None,
        engine.completion_tokens if engine else None,
        engine.cached_tokens if engine else None,
        r.gateway.prompt_tokens,
        r.gateway.completion_tokens,
        r.gateway.method,
        old_prompt(r),
        old_completion(r),
        old_cached(r),
        old_fresh(r),
        r.units,
        r.client_request_id,
    )


def rated(record: UsageRecord, rates: Rates | None) -> UsageRecord:
    """Rated as ``GatewayService._record`` rates a record: in place, before anyone holds it."""
    if rates is not None:
        msgspec.structs.force_setattr(record, "units", rates.billed(record.billed_tokens()))
    return record


@given(records, st.none() | rates)
def test_billed_figures_units_and_row_are_the_old_computations(
    record: UsageRecord, rates: Rates | None
) -> None:
    reference = record if rates is None else msgspec.structs.replace(record)
    record = rated(record, rates)
    figures = (old_prompt(reference), old_completion(reference), old_cached(reference))
    assert record.billed is old_billed(reference)
    assert record.billed_tokens() == figures
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == figures
    assert record.fresh_tokens == old_fresh(reference)
    assert record.units == (None if rates is None else old_units(reference, rates))
    expected = msgspec.structs.replace(reference, units=record.units)
    assert store.row_values(record) == old_row(expected)
    # The stored timestamps: microseconds exactly as datetime.fromtimestamp gives them, in UTC.
    for value in store.row_values(record)[1:4]:
        assert value is None or (isinstance(value, datetime) and value.tzinfo is UTC)


@given(records)
def test_the_figures_are_decided_once_and_never_encoded(record: UsageRecord) -> None:
    """Computed at construction and kept: every reader gets the same tuple; the JSON (spool,
    request log) is the fields alone, and a record read back decides the same figures."""
    assert record.billed_tokens() is record.billed_tokens()
    encoded = msgspec.json.encode(record)
    assert set(msgspec.json.decode(encoded)) == {
        f.encode_name for f in msgspec.structs.fields(UsageRecord)
    }
    decoded = msgspec.json.decode(encoded, type=UsageRecord)
    assert decoded == record
    assert decoded.billed_tokens() == record.billed_tokens()
    assert msgspec.structs.replace(record).billed_tokens() == record.billed_tokens()


def random_record(rng: random.Random, n: int) -> UsageRecord:
    """Request ``n`` with random usage, outcome and times with random microsecond fractions
    (sometimes a float just below a microsecond boundary, where rounding decides)."""

    def when() -> float:
        seconds = rng.uniform(978_307_200.0, 4_102_444_800.0)
        return math.nextafter(round(seconds, 6) + 5e-7, 0.0) if rng.random() < 0.2 else seconds

    engine = EngineUsage(*(rng.randrange(10**6) for _ in range(3))) if rng.random() < 0.7 else None
    tenant = rng.choice([None, "acme", "ünïcode\tt"])
    return UsageRecord(
        request_id=f"req-{n:06d}",
        kind=rng.choice(["chat", "completions", "embeddings"]),
        model=rng.choice(["llama", "m\\odel\n"]),
        served_model="llama-served",
        endpoint=rng.choice([None, "http://engine-a:8000"]),
        status=rng.choice([200, 400, 499, 502]),
        outcome=rng.choice(OUTCOMES),  # type: ignore[arg-type]
        stream=rng.random() < 0.5,
        received_at=when(),
        first_byte_at=rng.choice([None, when()]),
        done_at=when(),
        engine=engine,
        gateway=GatewayCount(rng.randrange(10**6), rng.randrange(10**6), "tiktoken"),
        tenant=tenant,
        project=None if tenant is None else f"{tenant}/p",
        key_id=None if tenant is None else "key-1",
        units=rng.choice([None, rng.randrange(10**12)]),
        client_request_id=rng.choice([None, "client\\N\t1"]),
    )


async def test_rows_written_read_back_equal_to_their_records(
    ledger_url: str, spool_path: Path
) -> None:
    """1,200 records through the writer (those of admitted requests in two batches, each
    several COPY buffers): every stored row is the old computation's row, timestamps to the
    microsecond in UTC."""
    rng = random.Random(10)
    written = [random_record(rng, n) for n in range(1200)]
    async with LedgerWriter(ledger_url, spool_path=spool_path) as writer:
        for record in written:
            writer.record(record)
    written = [r for r in written if r.outcome != "refused"]  # counted, never stored
    assert (writer.stats.batches, writer.stats.written) == (2, len(written))
    async with (
        await psycopg.AsyncConnection.connect(ledger_url) as conn,
        conn.cursor() as cursor,
    ):
        await cursor.execute(f"SELECT {', '.join(store.COLUMNS)} FROM ledger ORDER BY request_id")
        rows = await cursor.fetchall()
    assert len(rows) == len(written)
    for record, row in zip(written, rows, strict=True):
        assert row == old_row(record)
        for stored, seconds in zip(
            row[1:4], (record.received_at, record.first_byte_at, record.done_at), strict=True
        ):
            if seconds is None:
                continue
            expected = datetime.fromtimestamp(seconds, UTC)
            assert stored == expected
            assert stored.astimezone(UTC).microsecond == expected.microsecond
