"""Properties of the edge's input bounds: whatever a client sends is refused with a 400 or is
safe for the code behind it (decoding, calendar arithmetic, Postgres)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_core.shared import inputs
from fleet_core.shared.errors import InvalidRequest

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=40,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


@given(_json)
def test_the_depth_counts_brackets_outside_strings_only(value: Any) -> None:
    assert inputs.json_depth(msgspec.json.encode(value)) == _depth(value)


@given(st.integers(min_value=0, max_value=3_000), st.sampled_from([b"[]", b"{}"]))
def test_a_body_deeper_than_the_bound_never_reaches_the_decoder(depth: int, pair: bytes) -> None:
    body = pair[:1] * depth + b"1" + pair[1:] * depth if pair == b"[]" else _objects(depth)
    if depth > inputs.MAX_DEPTH:
        with pytest.raises(InvalidRequest):
            inputs.check_json(body)
    else:
        inputs.check_json(body)
        msgspec.json.decode(body)  # shallow enough for the decoder's recursion


def _objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth if depth else b"1"


@given(_json)
def test_a_nul_in_any_string_is_refused_and_nothing_else_is(value: Any) -> None:
    body = msgspec.json.encode(value)
    holds_nul = any("\x00" in text for text in _strings(value))  # the wire has \u0000
    if holds_nul:
        with pytest.raises(InvalidRequest):
            inputs.check_json(body)
    elif _depth(value) <= inputs.MAX_DEPTH:
        inputs.check_json(body)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in _strings(v))]
    return []


_offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda m: timezone(timedelta(minutes=m))
)


@settings(max_examples=500)
@given(st.datetimes(), _offsets | st.none())
def test_an_accepted_instant_survives_any_calendar_arithmetic(
    when: datetime, zone: timezone | None
) -> None:
    text = when.replace(tzinfo=zone).isoformat()
    try:
        value = inputs.parse_instant(text, name="from")
    except InvalidRequest as exc:
        refused = exc
    else:
        refused = None
    if refused is not None:
        assert refused.param == "from"
        return
    assert value.tzinfo is UTC
    assert inputs.EARLIEST <= value < inputs.LATEST
    for step in (timedelta(days=366), -timedelta(days=366)):  # a year of rounding either way
        (value + step).astimezone(timezone(timedelta(hours=14)))


@given(st.text(max_size=40))
def test_any_text_is_an_instant_or_a_400(text: str) -> None:
    refused = None
    try:
        inputs.parse_instant(text, name="at", naive_utc=False)
    except InvalidRequest as exc:
        refused = exc
    assert refused is None or refused.param == "at"


@given(st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=5))
def test_a_parameter_is_refused_exactly_when_it_holds_a_nul(pairs: list[tuple[str, str]]) -> None:
    if any("\x00" in name + value for name, value in pairs):
        with pytest.raises(InvalidRequest):
            inputs.check_text(pairs)
    else:
        inputs.check_text(pairs)
