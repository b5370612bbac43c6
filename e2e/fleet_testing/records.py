"""One usage record for tests: every field a test does not name has a plausible value (a
streamed-or-not chat request answered 200 by one engine, with both counts of 12 prompt and 30
completion tokens), so a test spells out only what it is about."""

from __future__ import annotations

from typing import Any

import msgspec

from fleet_core.gateway.metering.records import EngineUsage, GatewayCount, UsageRecord

__all__ = ["usage_record"]

_PLAIN = UsageRecord(
    request_id="req-1",
    kind="chat",
    model="m",
    served_model="m",
    endpoint="http://engine-0:8000",
    status=200,
    outcome="ok",
    stream=False,
    received_at=1000.0,
    first_byte_at=None,
    done_at=1000.4,
    engine=EngineUsage(prompt_tokens=12, completion_tokens=30),
    gateway=GatewayCount(prompt_tokens=12, completion_tokens=30, method="estimate:utf8-bytes"),
    tenant="acme",
    project="chat",
)


def usage_record(**changes: Any) -> UsageRecord:
    """The plain record with ``changes`` (any `UsageRecord` field by name)."""
    return msgspec.structs.replace(_PLAIN, **changes)
