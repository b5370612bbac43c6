"""Unit rates on the wire: units per million tokens for fresh input, cached input and output."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["ModelRates", "RatesPut"]

Rate = Annotated[float, Meta(ge=0, le=1e12, description="units per million tokens")]


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
