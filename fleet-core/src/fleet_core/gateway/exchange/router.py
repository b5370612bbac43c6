"""The live routing state: the current table (swapped whole) and the endpoint registry."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from fleet_core.gateway.config import GatewayConfig
from fleet_core.gateway.exchange.routing.endpoints import EndpointRegistry
from fleet_core.gateway.exchange.routing.signals import EngineSignals
from fleet_core.gateway.exchange.routing.table import DiscoveredModel, RoutingTable, build_table

__all__ = ["Router"]


class Router:
    def __init__(
        self, config: GatewayConfig, registry: EndpointRegistry, *, engine_key: str = ""
    ) -> None:
        self.config = config
        self.registry = registry
        self._engine_key = engine_key
        self.table: RoutingTable = build_table(config)
        self._sync()

    def current(self) -> RoutingTable:
        return self.table

    def apply_discovery(self, discovered: Iterable[DiscoveredModel]) -> None:
        """Rebuild from static config plus ``discovered`` and swap in one assignment."""
        self.table = build_table(self.config, discovered, engine_key=self._engine_key)
        self._sync()

    def _sync(self) -> None:
        self.registry.sync(t.url for p in self.table.pools.values() for t in p.targets)

    def any_ready(self) -> bool:
        return any(
            self.registry.get(t.url).ready for p in self.table.pools.values() for t in p.targets
        )

    def readiness(self) -> list[tuple[str, str, bool]]:
        """(model, endpoint, ready) for every endpoint, for the readiness gauge."""
        return [
            (p.name, t.url, self.registry.get(t.url).ready)
            for p in self.table.pools.values()
            for t in p.targets
        ]

    def signals(self) -> list[tuple[str, str, float | None, int | None, int | None]]:
        """(model, endpoint, KV usage, engine queue, KV capacity) of every endpoint whose
        signals are fresh, for the gauges (stale ones are not published: routing ignores them)."""
        return [
            (p.name, t.url, found.kv_usage, found.waiting, found.kv_capacity_tokens)
            for p in self.table.pools.values()
            for t in p.targets
            if (found := self.registry.fresh_signals(t.url)) is not None
        ]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        now = time.monotonic()
        for pool in self.table.pools.values():
            endpoints = []
            for target in pool.targets:
                state = self.registry.get(target.url)
                endpoints.append(
                    {
                        "url": target.url,
                        "state": "ready" if state.ready else "down",
                        "reason": state.reason,
                        "inFlight": state.in_flight,
                        "slotLimit": target.slots,
                        "finished": state.finished,
                        "errors": state.errors,
                        "signals": _signals(state.signals, now),
                    }
                )
            out[pool.name] = {
                "engine": pool.engine,
                "source": pool.source,
                "routing": pool.routing,
                "ready": any(e["state"] == "ready" for e in endpoints),
                "endpoints": endpoints,
            }
        return out


def _signals(signals: EngineSignals | None, now: float) -> dict[str, Any] | None:
    """The engine's last scrape as ``/health`` shows it; None if it never answered one."""
    if signals is None:
        return None
    return {
        "ageSeconds": round(now - signals.at, 3),
        "running": signals.running,
        "waiting": signals.waiting,
        "kvUsage": signals.kv_usage,
        "kvCapacityTokens": signals.kv_capacity_tokens,
        "slotsTotal": signals.slots_total,
    }
