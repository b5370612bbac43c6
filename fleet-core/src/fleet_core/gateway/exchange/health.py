"""Active health checks: every endpoint probed on its engine kind's health path each interval.

vLLM and llama.cpp's ``llama-server`` answer ``/health``; a generic OpenAI server may have none,
so the ``openai`` kind is probed with ``/v1/models``. A passing check also readmits an endpoint that
passive ejection took out (``EndpointRegistry.record_failure``).

On the same cadence, vLLM and llama.cpp endpoints have their ``/metrics`` scraped for the load
signals routing weighs (`routing.signals`), and llama.cpp's ``/props`` for its slot count (which
the console shows beside the busy slots). A failed scrape is not a failed health check: the
endpoint keeps serving and its signals simply grow stale, and stale signals are ignored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

import aiohttp

from fleet_core.gateway.exchange.routing import signals
from fleet_core.gateway.exchange.routing.endpoints import EndpointRegistry
from fleet_core.gateway.exchange.routing.table import RoutingTable, Target
from fleet_core.shared import stopping

__all__ = ["HealthChecker", "health_path"]

log = logging.getLogger("fleet.gateway.health")


def health_path(target: Target) -> str:
    return "/v1/models" if target.engine == "openai" else "/health"


class HealthChecker:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        registry: EndpointRegistry,
        *,
        interval: float,
        timeout: float,
    ) -> None:
        self._session = session
        self._registry = registry
        self._interval = interval
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def check(self, target: Target) -> None:
        state = self._registry.get(target.url)
        headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        try:
            async with self._session.get(
                target.url + health_path(target), headers=headers, timeout=self._timeout
            ) as response:
                ok = response.status == 200
                reason = "health check passed" if ok else f"health check answered {response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, reason = False, f"health check failed: {type(exc).__name__}"
        if ok:
            state.consecutive_failures = 0
        state.mark(ok, reason)
        if ok and signals.scraped(target.engine):
            await self.scrape(target, headers)
        self._registry.notify()  # a readmitted endpoint frees slots for waiters

    async def scrape(self, target: Target, headers: dict[str, str]) -> None:
        """Read the engine's ``/metrics`` (bounded) into its state's signals."""
        raw = await self._read(target.url + "/metrics", headers)
        if raw is None:
            return
        text = raw.decode("utf-8", "replace")
        found = signals.parse_metrics(target.engine, text, at=time.monotonic())
        if target.engine == "llamacpp":
            props = await self._read(target.url + "/props", headers)
            total = None if props is None else signals.parse_props(props)
            found = dataclasses.replace(found, slots_total=total)
        self._registry.get(target.url).signals = found

    async def _read(self, url: str, headers: dict[str, str]) -> bytes | None:
        """A 200's body, at most ``MAX_METRICS_BYTES`` of it; None on any other answer."""
        try:
            async with self._session.get(url, headers=headers, timeout=self._timeout) as response:
                if response.status != 200:
                    return None
                raw = bytearray()
                async for chunk in response.content.iter_chunked(1 << 16):
                    raw += chunk
                    if len(raw) >= signals.MAX_METRICS_BYTES:
                        break  # bounded: what is past the limit is not read
        except (aiohttp.ClientError, TimeoutError):
            return None
        return bytes(raw[: signals.MAX_METRICS_BYTES])

    async def check_all(self, table: RoutingTable) -> None:
        targets = {t.url: t for pool in table.pools.values() for t in pool.targets}
        await asyncio.gather(*(self.check(t) for t in targets.values()))

    async def run(self, table_of: Callable[[], RoutingTable]) -> None:
        while True:
            try:
                await self.check_all(table_of())
            except Exception:  # a checker that dies silently is worse than one that logs
                log.exception("health check round failed")
            stopping.raise_if_cancelled()
            await asyncio.sleep(self._interval)
