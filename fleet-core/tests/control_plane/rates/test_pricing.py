"""Unit rates as integers: a request's micro-units are exact and rounded once, halves up, by the
same rule as the cost pool; wire rates (units per million tokens) convert without loss."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_core.control_plane.costs.allocation import round_half_up
from fleet_core.shared.errors import InvalidRequest
from fleet_core.shared.pricing import MAX_RATE, PER_TOKENS, Rates, from_wire, to_wire

tokens = st.integers(0, 10**9)
rates = st.integers(0, MAX_RATE)


def test_half_a_unit_per_million_tokens_rounds_halves_up() -> None:
    """The issue's case: at 0.5 units per million tokens, 1, 3, 5 and 7 output tokens cost
    0.5, 1.5, 2.5 and 3.5 micro-units; a double with round-half-even billed 0, 2, 2, 4."""
    half = Rates(input_fresh=0, input_cached=0, output=from_wire(Decimal("0.5"), param="output"))
    assert [half.micro_units(fresh=0, cached=0, output=n) for n in (1, 3, 5, 7)] == [1, 2, 3, 4]


@given(fresh=tokens, cached=tokens, output=tokens, a=rates, b=rates, c=rates)
def test_micro_units_are_the_exact_sum_rounded_once_like_the_cost_pool(
    fresh: int, cached: int, output: int, a: int, b: int, c: int
) -> None:
    exact = Fraction(fresh * a + cached * b + output * c, PER_TOKENS)
    priced = Rates(a, b, c).micro_units(fresh=fresh, cached=cached, output=output)
    assert priced == round_half_up(exact)
    assert abs(priced - exact) <= Fraction(1, 2)


@given(output=tokens, more=tokens, rate=rates)
def test_more_tokens_never_cost_less(output: int, more: int, rate: int) -> None:
    priced = Rates(0, 0, rate)
    assert priced.micro_units(fresh=0, cached=0, output=output + more) >= priced.micro_units(
        fresh=0, cached=0, output=output
    )


@given(rate=rates)
def test_a_stored_rate_survives_the_wire_both_ways(rate: int) -> None:
    """What the API shows (a JSON number, shortest repr) reads back as the same integer."""
    assert from_wire(Decimal(repr(to_wire(rate))), param="output") == rate


@pytest.mark.parametrize(
    "text", ["-0.001", "0.0005", "1.0001", "1000000000000.001", "1e13", "NaN", "Infinity"]
)
def test_a_rate_finer_than_a_thousandth_or_out_of_range_is_refused(text: str) -> None:
    with pytest.raises(InvalidRequest, match="at most three decimals") as refused:
        from_wire(Decimal(text), param="output")
    assert refused.value.param == "output"


@given(prompt=tokens, completion=tokens, cached=tokens, a=rates, b=rates, c=rates)
def test_a_records_billed_tokens_cost_their_fresh_cached_and_output_parts(
    prompt: int, completion: int, cached: int, a: int, b: int, c: int
) -> None:
    """`Rates.billed` (what a usage record is rated at) is `micro_units` of its parts."""
    cached = min(cached, prompt)
    assert Rates(a, b, c).billed((prompt, completion, cached)) == Rates(a, b, c).micro_units(
        fresh=prompt - cached, cached=cached, output=completion
    )
