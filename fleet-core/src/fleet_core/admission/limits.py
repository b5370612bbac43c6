"""The vocabulary shared by the limit policy and the stores: buckets, charges, decisions.

A bucket is a token bucket holding at most ``capacity`` units (the per-minute limit) and refilling
``capacity / 60`` units per second. A request reserves from every bucket that applies to it, all
or nothing; afterwards it is settled: the unused part refunded, an overrun charged (a bucket may
go below zero, which delays whoever comes next — that is the price of the overrun, P5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "Bucket",
    "Charge",
    "Decision",
    "Dimension",
    "Level",
    "LimitStore",
    "StoreUnavailable",
    "hash_tag",
]

Level = Literal["tenant", "project"]
Dimension = Literal["rpm", "tpm"]


@dataclass(frozen=True, slots=True)
class Bucket:
    key: str
    """Full store key; all buckets of one tenant share a Redis Cluster hash tag (``{tenant}``)."""
    level: Level
    dimension: Dimension
    capacity: int
    """The per-minute limit: the most the bucket holds; it refills capacity/60 per second."""

    @property
    def rate(self) -> float:
        return self.capacity / 60.0


@dataclass(frozen=True, slots=True)
class Charge:
    bucket: Bucket
    amount: int
    """Units to take (positive) or, at settlement, to give back (negative)."""


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    refused_by: Bucket | None = None
    """When refused: the refusing bucket that needs the longest wait."""
    retry_after: float = 0.0
    """Seconds until ``refused_by`` can hold its charge."""


def hash_tag(key: str) -> str:
    """The ``{...}`` part of a key: keys sharing it live in one Redis Cluster slot."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start : end + 1] if start >= 0 and end > start else key


class StoreUnavailable(Exception):
    """The store could not be reached or did not answer in time."""


class LimitStore(Protocol):
    async def reserve(self, charges: Sequence[Charge]) -> Decision:
        """Take every charge, atomically, or none; one round trip."""

    async def settle(self, charges: Sequence[Charge]) -> None:
        """Apply signed corrections (refunds capped at capacity); one round trip."""

    async def ping(self) -> bool:
        """Whether the store answers now (for readiness probes)."""

    async def aclose(self) -> None:
        """Release connections."""
