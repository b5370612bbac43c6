"""Pushing the inventory to the control plane: debounced, one PUT in flight, retried with backoff.

One task owns the loop, so at most one PUT is ever in flight. It wakes on a change (after a short
debounce that folds a burst of watch events into one report) or when the heartbeat interval has
passed, and sends a fresh snapshot. A failure is retried with capped exponential backoff; a change
arriving meanwhile needs nothing more, since the retry sends the newest snapshot anyway. The
control plane being down is logged, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp
import msgspec

from fleet_contract import InventoryReport, encode_report
from fleet_serving.credentials import TokenFile
from fleet_serving.view import ClusterView

__all__ = ["Reporter", "ReporterSettings", "backoff_delay"]

logger = logging.getLogger(__name__)


class ReporterSettings(msgspec.Struct, kw_only=True, frozen=True):
    """How and how often the inventory is pushed."""

    url: str
    """The control plane's base URL; the report goes to ``{url}/api/v1/inventory``."""
    cluster_id: str
    token: TokenFile | None = None
    """The operator credential (``--report-token-file``) for this cluster."""
    interval: float = 30.0
    """Heartbeat: seconds between reports when nothing changes."""
    debounce: float = 0.2
    """Seconds to wait after a change for more changes, so a burst costs one PUT."""
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    timeout: float = 10.0


def backoff_delay(attempt: int, *, initial: float, cap: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): doubling, capped."""
    return float(min(cap, initial * 2 ** max(0, attempt - 1)))


class Reporter:
    """Owns the PUT loop; ``run()`` until cancelled."""

    def __init__(
        self,
        settings: ReporterSettings,
        view: ClusterView,
        session: aiohttp.ClientSession,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self.view = view
        self.session = session
        self.clock = clock
        self.sent = 0
        """Reports the control plane accepted (for logs and tests)."""

    async def run(self) -> None:
        while True:
            await self._wait_for_reason()
            await self._send_until_accepted()

    async def _wait_for_reason(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.view.changed.wait(), timeout=self.settings.interval)
            await asyncio.sleep(self.settings.debounce)  # coalesce a burst of events

    async def _send_until_accepted(self) -> None:
        attempt = 0
        while True:
            self.view.changed.clear()  # later changes re-arm it and are sent next round
            report = self.view.report(
                cluster_id=self.settings.cluster_id,
                now=self.clock(),
                interval=self.settings.interval,
            )
            problem = await self._put(report)
            if problem is None:
                self.sent += 1
                if attempt:
                    logger.info("inventory accepted again", extra={"attempts": attempt + 1})
                return
            attempt += 1
            delay = backoff_delay(
                attempt, initial=self.settings.backoff_initial, cap=self.settings.backoff_max
            )
            logger.warning(
                "inventory PUT failed; retrying",
                extra={"problem": problem, "attempt": attempt, "retry_in_s": delay},
            )
            await asyncio.sleep(delay)

    async def _put(self, report: InventoryReport) -> str | None:
        """PUT one report; None when accepted, else what went wrong."""
        url = self.settings.url.rstrip("/") + "/api/v1/inventory"
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout)
        headers = {"Content-Type": "application/json"}
        if self.settings.token is not None:
            headers |= self.settings.token.headers()
        try:
            async with self.session.put(
                url, data=encode_report(report), headers=headers, timeout=timeout
            ) as response:
                if response.status < 300:
                    return None
                body = (await response.text())[:500]
                return f"HTTP {response.status}: {body}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"
