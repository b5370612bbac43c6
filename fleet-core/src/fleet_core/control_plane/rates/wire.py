"""Unit rates on the wire: units per million tokens for fresh input, cached input and output.

Rates arrive as exact decimals (JSON numbers read without a float in between) with at most three
decimals, and are stored as integers (`pricing`).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

import msgspec
from msgspec import Meta

from fleet_core.shared import pricing

__all__ = ["ModelRates", "RatesPut", "stored_rates"]

Rate = Annotated[
    Decimal, Meta(description="units per million tokens, 0 to 10^12, at most three decimals")
]


class RatesPut(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    input_fresh: Rate
    input_cached: Rate
    output: Rate


class ModelRates(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    model: str
    """The model name clients send (the served model name)."""
    input_fresh: float
    input_cached: float
    output: float
    updated_at: datetime


def stored_rates(put: RatesPut, *, at: str = "") -> pricing.Rates:
    """Wire rates as the integers stored; 400 naming the first that is not exact to 0.001
    (``at`` prefixes the parameter's name: ``rates.`` inside a model's patch)."""
    return pricing.Rates(
        input_fresh=pricing.from_wire(put.input_fresh, param=f"{at}inputFresh"),
        input_cached=pricing.from_wire(put.input_cached, param=f"{at}inputCached"),
        output=pricing.from_wire(put.output, param=f"{at}output"),
    )
