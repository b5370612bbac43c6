"""`bounds.bound`'s invariants over any figures an engine could send: what is billed is within
``[0, bound]``, cached never past prompt, a figure within its bounds billed exactly as sent, and
a figure flagged exactly when it was not billed as sent."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.gateway.metering import bounds
from fleet_core.gateway.metering.records import EngineUsage, GatewayCount
from fleet_testing.records import usage_record

claims = st.integers(-(2**64), 2**64)
caps = st.none() | st.integers(0, 10**9)


@given(claims, claims, claims, caps, caps)
def test_billed_figures_are_within_bounds_and_flagged_when_changed(
    prompt: int, completion: int, cached: int, prompt_most: int | None, completion_most: int | None
) -> None:
    billed_prompt, billed_completion, billed_cached, flagged = bounds.bound(
        prompt, completion, cached, prompt_most=prompt_most, completion_most=completion_most
    )
    for billed, most in ((billed_prompt, prompt_most), (billed_completion, completion_most)):
        assert 0 <= billed <= (billed if most is None else most)
    assert 0 <= billed_cached <= billed_prompt
    sent = {"prompt": prompt, "completion": completion, "cached": cached}
    billed_by_name = {"prompt": billed_prompt, "completion": billed_completion}
    billed_by_name["cached"] = billed_cached
    assert set(flagged) == {name for name in sent if sent[name] != billed_by_name[name]}


@given(st.integers(0, 10**6), st.integers(1, 10**6), st.integers(1, 128))
def test_an_honest_engine_is_billed_exactly_what_it_says(
    counted: int, max_tokens: int, sequences: int
) -> None:
    """Within twice the gateway's count and the reservation, nothing is bounded."""
    prompt_most = bounds.prompt_cap(counted, {"messages": []})
    completion_most = bounds.completion_cap(max_tokens, sequences)
    prompt, completion = 2 * counted, max_tokens * sequences
    assert bounds.bound(
        prompt, completion, prompt, prompt_most=prompt_most, completion_most=completion_most
    ) == (prompt, completion, prompt, ())


def test_what_the_count_leaves_out_widens_the_prompt_bound() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"x": "y" * 3000}}}]
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]}
    plain = bounds.prompt_cap(1, {"messages": []})
    assert bounds.prompt_cap(1, {**body, "tools": tools}) >= plain + 3000 + bounds.IMAGE_TOKENS


def test_a_record_bills_the_gateway_count_no_further_than_reserved() -> None:
    """No engine usage: the relayed text's count, but an engine that ignored max_tokens cannot
    bill past what was reserved."""
    record = usage_record(
        stream=True,
        first_byte_at=2.0,
        engine=None,
        gateway=GatewayCount(5, 900, "estimate"),
        completion_cap=100,
    )
    assert record.billed_tokens() == (5, 100, 0)
    lied = msgspec.structs.replace(record, engine=EngineUsage(-5, 10**12, 7))
    assert lied.billed_tokens() == (0, 100, 0)
    assert lied.out_of_bounds == ("prompt", "completion", "cached")


def test_the_body_is_walked_only_for_a_figure_past_the_counts_own_bound() -> None:
    """An honest engine's figure costs no walk of the body; a larger one gets the body's
    uncounted parts added, as the cap it is held to."""
    body = {"messages": [], "tools": [{"x": "y" * 3000}]}
    counted_cap = bounds.PROMPT_FACTOR * 10 + bounds.PROMPT_SLACK
    assert bounds.prompt_cap(10, body, reported=counted_cap) == counted_cap
    assert bounds.prompt_cap(10, body, reported=counted_cap + 1) > counted_cap + 3000
    assert bounds.prompt_cap(10, body, reported=-5) == bounds.prompt_cap(10, body)
