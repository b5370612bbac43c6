"""The vocabulary shared by the limit policy and the stores: buckets, charges, decisions.

A hold is a budget rule's reservation: the request's demand in the rule's dimension, kept in the
store beside the buckets so that every gateway sees every other gateway's requests in flight
(and settled ones the rollups do not show yet). A hold refuses when the rule's base (its rollups,
as this gateway last read them) plus every live hold plus the demand would pass the rule's limit.
Each hold expires unless its gateway touches it, so a crashed gateway's holds cannot leak forever.

These values are made several times per request, so they are msgspec structs (frozen, like the
rest): a frozen dataclass costs about ten times as much to make.

A bucket is a token bucket holding at most ``capacity`` units (the per-minute limit) and refilling
``capacity / 60`` units per second. A request reserves from every bucket that applies to it, all
or nothing; afterwards it is settled: the unused part refunded, an overrun charged (a bucket may
go below zero, which delays whoever comes next — that is the price of the overrun, P5).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

__all__ = [
    "Bucket",
    "Charge",
    "Decision",
    "Dimension",
    "Hold",
    "HoldUpdate",
    "Level",
    "LimitStore",
    "StoreUnavailable",
    "hash_tag",
]

Level = Literal["tenant", "project"]
Dimension = Literal["rpm", "tpm"]


class Bucket(msgspec.Struct, frozen=True):
    key: str
    """Full store key; all buckets of one tenant share a Redis Cluster hash tag (``{tenant}``)."""
    level: Level
    dimension: Dimension
    capacity: int
    """The per-minute limit: the most the bucket holds; it refills capacity/60 per second."""

    @property
    def rate(self) -> float:
        return self.capacity / 60.0


class Charge(msgspec.Struct, frozen=True, gc=False):  # in no cycle, untracked by the collector
    bucket: Bucket
    amount: int
    """Units to take (positive) or, at settlement, to give back (negative)."""


class Hold(msgspec.Struct, frozen=True):
    """Hold ``amount`` against a budget rule's shared book, unless it would pass ``limit``."""

    key: str
    """The rule's book in the store; shares the tenant's hash tag with its buckets."""
    id: str
    """The hold's own name in the book (minted by the gateway, unique)."""
    amount: int
    limit: int
    base: int
    """What the rule's rollups count (as this gateway last read them), besides the holds."""
    ttl_ms: int
    """The hold is dropped this long after it was last written, unless touched again."""


class HoldUpdate(msgspec.Struct, frozen=True):
    """Set a hold to ``amount`` for another ``ttl_ms`` (settle, touch), or drop it (None)."""

    key: str
    id: str
    amount: int | None
    ttl_ms: int = 0


class Decision(msgspec.Struct, frozen=True):
    admitted: bool
    refused_by: Bucket | None = None
    """When refused: the refusing bucket that needs the longest wait."""
    retry_after: float = 0.0
    """Seconds until ``refused_by`` can hold its charge."""
    refused_hold: int | None = None
    """When a budget rule refused: the index of its hold; ``excess`` says by how much."""
    excess: int = 0


def hash_tag(key: str) -> str:
    """The ``{...}`` part of a key: keys sharing it live in one Redis Cluster slot."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start : end + 1] if start >= 0 and end > start else key


class StoreUnavailable(Exception):
    """The store could not be reached or did not answer in time."""


class LimitStore(Protocol):
    async def reserve(self, charges: Sequence[Charge], holds: Sequence[Hold] = ()) -> Decision:
        """Take every charge and place every hold, atomically, or none; one round trip.

        Budget holds are judged first: a refusal names the first hold that does not fit."""

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        """Apply signed corrections (refunds capped at capacity); one round trip.

        Charges of one call share one hash tag. A store that can lose a reply applies a batch
        sent again under the same ``batch_id`` only once (so a failed call can be retried)."""

    async def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        """Apply hold updates (settle, touch, drop); one round trip per tenant's hash tag."""

    async def ping(self) -> bool:
        """Whether the store answers now (for readiness probes)."""

    async def aclose(self) -> None:
        """Release connections."""
