"""When a budget rule's rolling window frees enough: the arithmetic behind a refusal's Retry-After.

Pure, over the rule's per-minute rollups (`catalog.RuleMinutes` reads them, only when a rule
refuses). Kept apart from `budget_book`, which admits against the rollups' sums and never looks
at their minutes.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["free_after"]


def free_after(
    minutes: Sequence[tuple[float, int]],
    *,
    over_by: int,
    window_s: int,
    now: float,
    unrolled: int = 0,
) -> float | None:
    """Seconds until enough of the window's minutes have slid out to shed ``over_by``.

    ``minutes`` are (minute start, amount) in time order; ``unrolled`` is usage settled here that
    the rollups may not show yet, which will land in the current minute. A minute leaves the
    window once its end is ``window_s`` old. None when that cannot shed enough (the excess is
    held by requests in flight): the caller retries shortly.
    """
    shed = 0
    current = now - now % 60
    for start, amount in [*minutes, (current, unrolled)]:
        shed += amount
        if shed >= over_by:
            return max(0.0, start + 60.0 + window_s - now)
    return None
