"""Budget windows: ``N`` + ``s|m|h|d|w|mo`` to seconds and back.

``mo`` is 30 days, a fixed length, because a rolling window must not change size with the
calendar. The gateway enforces seconds; the string is kept as written so that GET answers ``7d``
and not ``1w``. Rules stored without the string are rendered in the largest whole unit.
"""

from __future__ import annotations

import re

from fleet_core.shared.errors import InvalidRequest

__all__ = ["MAX_WINDOW_S", "UNITS", "parse_window", "render_window"]

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "mo": 30 * 86400}
MAX_WINDOW_S = 2**31 - 1  # window_s is an integer column
_WINDOW = re.compile(r"([1-9][0-9]*)(s|m|h|d|w|mo)")


def parse_window(window: str) -> int:
    """Seconds in ``window`` (``"1mo"`` → 2592000), or 400 naming ``window``."""
    match = _WINDOW.fullmatch(window)
    if match is None:
        raise InvalidRequest(
            f"window {window!r} is not N followed by s, m, h, d, w or mo (e.g. 5h, 7d, 1mo)",
            param="window",
        )
    seconds = int(match[1]) * UNITS[match[2]]
    if seconds > MAX_WINDOW_S:
        raise InvalidRequest(f"window {window!r} is longer than {MAX_WINDOW_S} s", param="window")
    return seconds


def render_window(seconds: int) -> str:
    """``seconds`` in the largest unit dividing it exactly (2592000 → ``"1mo"``)."""
    for unit, size in sorted(UNITS.items(), key=lambda item: -item[1]):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    raise AssertionError("every whole number of seconds divides by 1")
