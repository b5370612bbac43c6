"""Wire types of ``GET /api/v1/usage``."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["Agreement", "CountAgreement", "GroupBy", "UsageRow"]

GroupBy = Literal["hour", "day", "model", "project"]


class UsageRow(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    key: str
    """The hour or day (ISO-8601, UTC), the model, or the project (``tenant/name``)."""
    requests: int
    tokens_input: int
    tokens_output: int
    tokens_cached: int
    tokens_fresh: int
    units: int
    """Micro-units; 0 until model rates exist."""


class CountAgreement(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """How far the gateway's count is from the engine's, for one direction (prompt or output).

    The relative difference of a request is (gateway - engine) / engine (engine 0: / 1).
    """

    mean_relative_diff: float | None
    """Signed: positive when the gateway counts more than the engine on average."""
    p95_abs_relative_diff: float | None


class Agreement(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    model: str
    requests: int
    """Requests served in the window (refusals excluded)."""
    compared: int
    """Requests with both counts: the engine reported usage."""
    without_engine_usage: int
    prompt: CountAgreement
    completion: CountAgreement
    count_methods: list[str]
    """How the gateway counted: ``tokenizer:…`` (the model's own) or ``estimate:utf8-bytes``
    (older records: ``estimate:ascii/4+other``, ``estimate:chars/4``)."""
    out_of_bounds: int = 0
    """Requests whose engine reported a usage figure out of bounds (negative, more completion
    than reserved, a prompt far past the gateway's count), billed at the bound instead."""
