"""`UsageRecord.billed_tokens` is the three billed-token properties read at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord

counts = st.integers(0, 10**6)
records = st.builds(
    UsageRecord,
    request_id=st.just("req_1"),
    kind=st.sampled_from(["chat", "completions", "embeddings"]),
    model=st.just("m"),
    served_model=st.just("m"),
    endpoint=st.none() | st.just("http://engine"),
    status=st.sampled_from([200, 400, 499, 502]),
    outcome=st.sampled_from(
        ["ok", "client_error", "upstream_error", "client_disconnected", "refused"]
    ),
    stream=st.booleans(),
    received_at=st.just(1.0),
    first_byte_at=st.none() | st.just(2.0),
    done_at=st.just(3.0),
    engine=st.none() | st.builds(EngineUsage, counts, counts, counts),
    gateway=st.builds(GatewayCount, counts, counts, st.just("estimate")),
)


@given(records)
def test_billed_tokens_are_the_properties(record: UsageRecord) -> None:
    assert record.billed_tokens() == (
        record.prompt_tokens,
        record.completion_tokens,
        record.cached_tokens,
    )
