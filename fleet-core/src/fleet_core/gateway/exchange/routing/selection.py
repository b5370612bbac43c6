"""Endpoint choice as a pure function: the lowest load score, random among ties (P3, ADR 0013).

An endpoint's score is the gateway's own requests in flight there, plus the engine's waiting
queue and a penalty for KV-cache occupancy above a threshold when the engine's signals are
fresh. Stale or absent signals (``waiting``/``kv_usage`` None) leave the plain in-flight count:
least outstanding requests, the policy this replaced. Kept free of I/O and clocks (the caller
decides freshness) so it can be tested on tables of endpoint states.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

__all__ = ["Candidate", "Scoring", "choose", "score"]


@dataclass(frozen=True, slots=True)
class Scoring:
    """How engine signals weigh against the gateway's own count."""

    kv_threshold: float = 0.8
    """KV-cache occupancy (0–1) above which an engine is penalised: near full, vLLM preempts."""
    kv_penalty: float = 8.0
    """Score added at 100% occupancy, growing linearly from 0 at the threshold: an almost full
    engine looks as busy as one with this many more requests in flight."""


class Candidate(msgspec.Struct, frozen=True):
    """One endpoint as routing sees it. A struct: one is made per endpoint per request."""

    ready: bool
    in_flight: int
    slots: int | None = None  # None: unlimited
    waiting: int | None = None
    """The engine's own queue (vLLM waiting, llama.cpp deferred); None when unknown or stale."""
    kv_usage: float | None = None
    """KV-cache occupancy 0–1; None when unknown or stale (llama.cpp publishes none)."""

    @property
    def has_room(self) -> bool:
        return self.ready and (self.slots is None or self.in_flight < self.slots)


DEFAULT_SCORING = Scoring()


def score(candidate: Candidate, scoring: Scoring = DEFAULT_SCORING) -> float:
    """Lower is better: in flight, plus the engine's queue, plus the KV-pressure penalty."""
    value = float(candidate.in_flight + (candidate.waiting or 0))
    kv, threshold = candidate.kv_usage, scoring.kv_threshold
    if kv is not None and kv > threshold:
        value += scoring.kv_penalty * (min(kv, 1.0) - threshold) / max(1.0 - threshold, 1e-9)
    return value


def choose(
    candidates: Sequence[Candidate], rng: random.Random, scoring: Scoring = DEFAULT_SCORING
) -> int | None:
    """Index of the ready candidate with a free slot and the lowest score; None if none."""
    best, picks = math.inf, []
    for index, candidate in enumerate(candidates):
        if not candidate.has_room:
            continue
        # Without signals the score is the in-flight count: skip the call on the hot path.
        plain = candidate.waiting is None and candidate.kv_usage is None
        value = candidate.in_flight if plain else score(candidate, scoring)
        if value < best:
            best, picks = value, [index]
        elif value == best:
            picks.append(index)
    if len(picks) < 2:
        return picks[0] if picks else None
    return rng.choice(picks)
