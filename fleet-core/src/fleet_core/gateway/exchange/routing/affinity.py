"""Prefix and session affinity: consistent hashing with bounded load (ADR 0013).

A request's affinity key (its session id, or a hash of its prompt's first characters) maps to a
point on a hash ring of the pool's endpoints; the request goes to the first endpoint clockwise
that is open and whose load is under ``ceil((1 + ε) × (total + 1) / n)`` — the bound of Mirrokni,
Thorup and Zadimoghaddam's "consistent hashing with bounded loads". A hot prefix therefore
overflows to the next endpoints on the ring instead of piling onto one replica, and no endpoint
ever carries more than (1 + ε) times the mean (plus one). Everything here is pure.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Ring", "bound", "build_ring", "key_of", "pick"]

VIRTUAL_NODES = 64
"""Points per endpoint on the ring: enough that keys spread evenly over a few replicas."""


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class Ring:
    points: tuple[int, ...]
    owners: tuple[str, ...]  # owners[i] holds points[i]


def build_ring(urls: Sequence[str], *, virtual_nodes: int = VIRTUAL_NODES) -> Ring:
    placed = sorted((_hash(f"{url}#{i}"), url) for url in urls for i in range(virtual_nodes))
    return Ring(tuple(p for p, _ in placed), tuple(u for _, u in placed))


def bound(total: int, endpoints: int, epsilon: float) -> int:
    """The most requests one endpoint may hold once this one is placed: ⌈(1+ε)(total+1)/n⌉."""
    return math.ceil((1 + epsilon) * (total + 1) / endpoints)


def pick(ring: Ring, key: str, loads: Mapping[str, int], *, epsilon: float) -> str | None:
    """The endpoint for ``key``: first clockwise among ``loads`` (the open endpoints and their
    loads) whose load is under the bound; None when ``loads`` is empty."""
    if not loads:
        return None
    cap = bound(sum(loads.values()), len(loads), epsilon)
    start = bisect.bisect(ring.points, _hash(key))
    size = len(ring.points)
    seen: set[str] = set()
    for step in range(size):
        url = ring.owners[(start + step) % size]
        if url in seen or url not in loads:
            continue
        if loads[url] < cap:
            return url
        seen.add(url)
        if len(seen) == len(loads):
            break
    return min(loads, key=loads.__getitem__)  # only if an open endpoint is off the ring


def key_of(session: str | None, prompt: str, *, chars: int) -> str | None:
    """A session id wins; else the hash of the rendered prompt's first ``chars`` characters
    (system prompt plus the conversation so far); None for an empty prompt."""
    if session:
        return "s:" + session
    if prompt:
        return "p:" + hashlib.blake2b(prompt[:chars].encode(), digest_size=16).hexdigest()
    return None
