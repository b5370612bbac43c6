"""The vocabulary shared by the limit policy and the stores: buckets, charges, decisions.

A budget rule's book holds one entry per gateway process, its allowance (`budgets`): what its
requests in flight reserved, what its settled ones used that the rollups may not show yet, and
slack it admits from on its own. A `Hold` asks to grow the entry, refused when the rule's base
(its rollups, as this gateway last read them) plus every entry plus what is missing would pass
the rule's limit; a `HoldUpdate` changes it by a signed delta, applied once. Each entry expires
unless its gateway writes it again, so a crashed gateway's allowance cannot leak forever.

These values are made several times per request, so they are msgspec structs (frozen, like the
rest, but for `Hold`, whose grant the store fills in): a frozen dataclass costs about ten times
as much to make.

A bucket is a token bucket holding at most ``capacity`` units (the per-minute limit) and refilling
``capacity / 60`` units per second. A request reserves from every bucket that applies to it, all
or nothing; afterwards it is settled: the unused part refunded, an overrun charged (a bucket may
go below zero, which delays whoever comes next — that is the price of the overrun, P5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

import msgspec

__all__ = [
    "ADMITTED",
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
    "merged_charges",
]

Level = Literal["tenant", "project"]
Dimension = Literal["rpm", "tpm"]


class Bucket(msgspec.Struct, frozen=True, cache_hash=True):  # a dict key per request
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


class Hold(msgspec.Struct):
    """Grow a gateway's entry in a budget rule's book, unless that would pass ``limit``.

    Not frozen: the store fills in ``granted`` when it answers (the caller reads it after the
    reservation, whatever carried it there)."""

    key: str
    """The rule's book in the store; shares the tenant's hash tag with its buckets."""
    owner: str
    """The gateway's entry in the book (one per gateway process)."""
    grant: str
    """This growth's id: an undo under it (`HoldUpdate.grant`) takes it back exactly once."""
    need: int
    """The least growth that admits the request: refused if ``base`` + every entry + ``need``
    would pass ``limit`` (0: the rule's part fits the entry already, never refused)."""
    extra: int
    """Slack wanted beyond ``need``; the store grants at most a share of the rule's room."""
    limit: int
    base: int
    """What the rule's rollups count (as this gateway last read them), besides the entries."""
    keep: int
    """The entry as the store has confirmed it before this growth (growths still unanswered
    left out): made again at this plus the growth if the store does not have it."""
    ttl_ms: int
    """The entry is dropped this long after it was last written, unless written again."""
    granted: int | None = None
    """Set by the store: the growth made (0 when refused); None while unknown."""


class HoldUpdate(msgspec.Struct, frozen=True):
    """Change a gateway's entry in a rule's book by ``delta`` and keep it another ``ttl_ms``.

    Applied at most once per ``batch`` (so a call whose reply was lost can be sent again). An
    entry the store no longer has (it expired, or the store lost it) is made again at ``keep``,
    what the gateway means it to be after this update, its growths still unanswered left out
    (each adds itself when it lands). ``grant``: first take back that growth,
    if it was made and not yet taken back (its admission's answer was lost)."""

    key: str
    owner: str
    delta: int
    keep: int
    ttl_ms: int
    grant: str = ""
    batch: str = ""


class Decision(msgspec.Struct, frozen=True):
    admitted: bool
    refused_by: Bucket | None = None
    """When refused: the refusing bucket that needs the longest wait."""
    retry_after: float = 0.0
    """Seconds until ``refused_by`` can hold its charge."""
    refused_hold: int | None = None
    """When a budget rule refused: the index of its ask; ``excess`` says by how much."""
    excess: int = 0


ADMITTED = Decision(True)
"""Every admission's decision, made once (it is frozen)."""


def merged_charges(charges: Sequence[Charge]) -> list[Charge]:
    """One charge per key, amounts summed, so a bucket named twice is charged once, in full."""
    if len({charge.bucket.key for charge in charges}) == len(charges):
        return list(charges)  # the usual case: every key once, nothing to sum
    by_key: dict[str, Charge] = {}
    for charge in charges:
        seen = by_key.get(charge.bucket.key)
        amount = charge.amount + (seen.amount if seen else 0)
        by_key[charge.bucket.key] = Charge(seen.bucket if seen else charge.bucket, amount)
    return list(by_key.values())


def hash_tag(key: str) -> str:
    """The ``{...}`` part of a key: keys sharing it live in one Redis Cluster slot."""
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start : end + 1] if start >= 0 and end > start else key


class StoreUnavailable(Exception):
    """The store could not be reached or did not answer in time."""


class LimitStore(Protocol):
    async def reserve(self, charges: Sequence[Charge], holds: Sequence[Hold] = ()) -> Decision:
        """Take every charge and make every growth, atomically, or none; one round trip.

        Budget asks are judged first: a refusal names the first that does not fit. The store
        sets each ask's ``granted`` (0 for all when refused)."""

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        """Apply signed corrections (refunds capped at capacity); one round trip.

        Charges of one call share one hash tag. A store that can lose a reply applies a batch
        sent again under the same ``batch_id`` only once (so a failed call can be retried)."""

    async def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        """Apply entry updates (deltas, touches, undone grants), each batch once; one round
        trip per tenant's hash tag."""

    async def ping(self) -> bool:
        """Whether the store answers now (for readiness probes)."""

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever the store is found to have lost its state (a Redis that
        restarted empty; ADR 0023). A store in this process never does."""

    async def aclose(self) -> None:
        """Release connections."""
