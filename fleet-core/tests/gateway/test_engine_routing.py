"""Routing that knows the engines, end to end: stub engines over real HTTP whose metrics and
prefix cache are scripted, a real gateway in front (ADR 0013)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fleet_core.gateway.config import GatewayConfig
from fleet_core.gateway.exchange.routing.endpoints import EndpointRegistry, Ticket
from fleet_core.gateway.exchange.routing.signals import EngineSignals
from fleet_core.gateway.exchange.routing.table import build_table
from fleet_core.gateway.settings import admission_from_env
from fleet_core.shared.errors import RateLimited
from fleet_testing.waiting import eventually

from .conftest import GatewayFactory, StubFactory

KEYS = {"FLEET_AUTH_REQUIRED": "true", "FLEET_API_KEYS": "A/p/ka;B/p/kb"}
FAST_HEALTH = {"interval_s": 0.1, "timeout_s": 1.0}


def chat(system: str, user: str = "hello", **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return {"model": "m", "messages": messages, "max_tokens": 4, **extra}


async def post(http: httpx.AsyncClient, url: str, body: dict[str, Any], **kw: Any) -> None:
    response = await http.post(f"{url}/v1/chat/completions", json=body, **kw)
    assert response.status_code == 200, response.text


async def test_signals_are_scraped_published_and_shown(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    vllm = await start_stub(model="m", kv_capacity_tokens=4096, kv_baseline=0.5)
    llama = await start_stub(model="l", profile="llamacpp", max_num_seqs=3)
    gw = await start_gateway(
        {
            "health": FAST_HEALTH,
            "upstreams": [
                {"id": "v", "model": "m", "base_url": vllm.url, "slots": 8},
                {"id": "l", "model": "l", "engine": "llamacpp", "base_url": llama.url},
            ],
        }
    )
    async with httpx.AsyncClient(timeout=10) as http:

        async def scraped() -> bool:
            text = (await http.get(f"{gw.url}/metrics")).text
            return "fleet_endpoint_kv_capacity_tokens{" in text and "queue_depth{" in text

        await eventually(scraped, within=10)
        text = (await http.get(f"{gw.url}/metrics")).text
        health = (await http.get(f"{gw.url}/health")).json()
    assert f'fleet_endpoint_kv_usage_ratio{{endpoint="{vllm.url}",model="m"}} 0.5' in text
    assert f'fleet_endpoint_kv_capacity_tokens{{endpoint="{vllm.url}",model="m"}} 4096.0' in text
    assert f'fleet_endpoint_queue_depth{{endpoint="{llama.url}",model="l"}} 0.0' in text
    # llama.cpp publishes no occupancy and no capacity: none is made up
    assert f'fleet_endpoint_kv_usage_ratio{{endpoint="{llama.url}",model="l"}}' not in text
    shown = health["upstreams"]["m"]["endpoints"][0]["signals"]
    assert (shown["kvUsage"], shown["kvCapacityTokens"], shown["waiting"]) == (0.5, 4096, 0)
    assert health["upstreams"]["l"]["endpoints"][0]["signals"]["kvUsage"] is None
    # slots: the gateway's own limit where configured; the engine's total where it says (/props)
    (v,), (ll,) = health["upstreams"]["m"]["endpoints"], health["upstreams"]["l"]["endpoints"]
    assert (v["slotLimit"], v["signals"]["slotsTotal"], v["signals"]["running"]) == (8, None, 0)
    assert (ll["slotLimit"], ll["signals"]["slotsTotal"], ll["signals"]["running"]) == (None, 3, 0)


async def test_kv_pressure_steers_requests_away(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    full = await start_stub(model="m", kv_baseline=0.97)
    roomy = await start_stub(model="m", kv_baseline=0.2)
    gw = await start_gateway(
        {
            "health": FAST_HEALTH,
            "upstreams": [{"id": "x", "model": "m", "endpoints": [full.url, roomy.url]}],
        }
    )
    async with httpx.AsyncClient(timeout=10) as http:

        async def scraped() -> bool:
            text = (await http.get(f"{gw.url}/metrics")).text
            return text.count("fleet_endpoint_kv_usage_ratio{") == 2

        await eventually(scraped, within=10)
        for _ in range(20):
            await post(http, gw.url, chat("s"))
    assert (full.stats().requests_started, roomy.stats().requests_started) == (0, 20)


def test_stale_signals_fall_back_to_least_outstanding() -> None:
    """Signals older than their max age (two scrape intervals) are ignored."""
    table = build_table(
        _config(
            {"upstreams": [{"id": "x", "model": "m", "endpoints": ["http://a:1", "http://b:1"]}]}
        )
    )
    pool = table.pools["m"]
    registry = EndpointRegistry(eject_after=3, rng=random.Random(0), signal_max_age=1.0)
    registry.sync(t.url for t in pool.targets)
    a, b = registry.get("http://a:1"), registry.get("http://b:1")
    b.in_flight = 1
    a.signals = EngineSignals(time.monotonic(), waiting=50)  # fresh: a looks far busier
    assert registry._pick(pool, list(pool.targets), Ticket()) == 1
    a.signals = EngineSignals(time.monotonic() - 5, waiting=50)  # stale: ignored
    assert registry._pick(pool, list(pool.targets), Ticket()) == 0


def _config(raw: dict[str, Any]) -> GatewayConfig:
    return msgspec.convert(raw, GatewayConfig)


async def _cache_rig(
    start_stub: StubFactory, start_gateway: GatewayFactory, routing: str, *, delay_ms: float = 0
) -> tuple[Any, list[Any]]:
    stubs = [
        await start_stub(
            model="m",
            latency_ms=40,
            prefix_cache_chars=64,
            prefix_hit_latency_ms=0,
            token_delay_ms=delay_ms,
        )
        for _ in range(3)
    ]
    upstream = {"id": "x", "model": "m", "endpoints": [s.url for s in stubs], "routing": routing}
    gw = await start_gateway({"routing": {"prefix_chars": 64}, "upstreams": [upstream]})
    return gw, stubs


async def test_prefix_affinity_hits_the_cache_least_load_does_not(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    hits = {}
    for routing in ("prefix_affinity", "least_load"):
        gw, stubs = await _cache_rig(start_stub, start_gateway, routing)
        async with httpx.AsyncClient(timeout=10) as http:
            for turn in range(6):
                for prefix in range(6):
                    await post(
                        http, gw.url, chat(f"system prompt number {prefix} " * 4, f"t{turn}")
                    )
        hits[routing] = sum(s.stats().prefix_hits for s in stubs)
    assert hits["prefix_affinity"] == 30  # only each prefix's first request misses
    assert hits["least_load"] < 30


async def test_a_session_sticks_to_one_endpoint(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    gw, stubs = await _cache_rig(start_stub, start_gateway, "prefix_affinity")
    async with httpx.AsyncClient(timeout=10) as http:
        for turn in range(8):  # a different prompt every turn, one session
            await post(http, gw.url, chat(f"turn {turn}"), headers={"X-Session-Id": "conv-1"})
    assert sorted(s.stats().requests_started for s in stubs) == [0, 0, 8]


async def test_a_hot_prefix_is_spread_within_the_bound(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    gw, stubs = await _cache_rig(start_stub, start_gateway, "prefix_affinity", delay_ms=100)
    bodies = [chat("hot " * 20) if i % 2 else chat(f"cold {i} " * 20) for i in range(36)]
    async with httpx.AsyncClient(timeout=20) as http:
        await asyncio.gather(*(post(http, gw.url, body) for body in bodies))
    started = [s.stats().requests_started for s in stubs]
    assert sum(started) == 36
    assert max(started) <= 15  # ceil(1.25 × 36 / 3): the hot half did not pile onto one


async def test_fair_queue_b_waits_for_a_few_of_as_hundred(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    """The issue's case: tenant A enqueues 100 long requests, then tenant B sends 5. B's wait
    for at most a few of A's, not all 100 (arrival order would make it wait for every one)."""
    engine = await start_stub(model="m", latency_ms=15)
    admission = admission_from_env(KEYS)
    gw = await start_gateway(
        {
            "queue_timeout_s": 60,
            "upstreams": [{"id": "x", "model": "m", "base_url": engine.url, "slots": 2}],
        },
        admission=admission,
    )
    done: list[str] = []

    async def send(http: httpx.AsyncClient, tenant: str, max_tokens: int) -> None:
        body = {**chat("s"), "max_tokens": max_tokens}
        await post(
            http, gw.url, body, headers={"Authorization": f"Bearer {tenant}/p/k{tenant.lower()}"}
        )
        done.append(tenant)

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200)) as http:
        a = [asyncio.create_task(send(http, "A", 1000)) for _ in range(100)]
        await eventually(lambda: _queued(gw) >= 90, within=10)
        await asyncio.gather(*(send(http, "B", 1000) for _ in range(5)))
        a_before_last_b = done.count("A")
        await asyncio.gather(*a)
    assert a_before_last_b <= 15, a_before_last_b


async def test_priority_weights_the_share(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    """fleet.yaml's tenants.<id>.priority: a tenant of priority 4 gets ~4 of every 5 slots."""
    engine = await start_stub(model="m", latency_ms=10)
    admission = admission_from_env(KEYS)
    gw = await start_gateway(
        {
            "queue_timeout_s": 60,
            "tenants": {"B": {"priority": 4}},
            "upstreams": [{"id": "x", "model": "m", "base_url": engine.url, "slots": 1}],
        },
        admission=admission,
    )
    done: list[str] = []

    async def send(http: httpx.AsyncClient, tenant: str) -> None:
        await post(
            http,
            gw.url,
            chat("s"),
            headers={"Authorization": f"Bearer {tenant}/p/k{tenant.lower()}"},
        )
        done.append(tenant)

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200)) as http:
        tasks = [asyncio.create_task(send(http, "A")) for _ in range(40)]
        await eventually(lambda: _queued(gw) >= 35, within=10)
        tasks += [asyncio.create_task(send(http, "B")) for _ in range(40)]
        await eventually(lambda: _queued(gw) >= 70, within=10)
        mark = len(done)  # from here both tenants wait
        await asyncio.gather(*tasks)
    window = done[mark : mark + 25]
    # 4 : 1 is 20 of 25; equal shares would be ~12, arrival order 0, strict priority 25
    assert 17 <= window.count("B") <= 23, window


def _queued(gw: Any) -> int:
    return int(gw.app.state.router.registry.waiting)


async def test_a_failing_scrape_is_not_a_failed_health_check(
    start_gateway: GatewayFactory, serve_app: Any
) -> None:
    async def health(request: Request) -> Response:
        return Response("")

    async def metrics(request: Request) -> Response:
        return Response("broken", status_code=500)

    url = await serve_app(Starlette(routes=[Route("/health", health), Route("/metrics", metrics)]))
    gw = await start_gateway(
        {"health": FAST_HEALTH, "upstreams": [{"id": "x", "model": "m", "base_url": url}]}
    )
    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.sleep(0.5)  # several rounds of checks and scrapes
        endpoint = (await http.get(f"{gw.url}/health")).json()["upstreams"]["m"]["endpoints"][0]
    assert endpoint["state"] == "ready"
    assert endpoint["signals"] is None


def _one_slot_pool() -> tuple[EndpointRegistry, Any]:
    upstream = {"id": "x", "model": "m", "base_url": "http://a:1", "slots": 1}
    pool = build_table(_config({"upstreams": [upstream]})).pools["m"]
    registry = EndpointRegistry(eject_after=3)
    registry.sync(t.url for t in pool.targets)
    return registry, pool


async def test_a_waiter_cancelled_as_its_slot_arrives_does_not_leak_it() -> None:
    registry, pool = _one_slot_pool()
    held = await registry.acquire(pool, set(), wait_s=1)
    assert held is not None
    waiter = asyncio.create_task(registry.acquire(pool, set(), wait_s=5))
    await asyncio.sleep(0)  # it queues
    assert registry.waiting == 1
    held.release()  # hands the slot to the waiter...
    waiter.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    state = registry.get("http://a:1")
    assert (state.in_flight, registry.waiting) == (0, 0)
    again = await registry.acquire(pool, set(), wait_s=0)
    assert again is not None


async def test_a_freed_slot_goes_to_the_queue_not_to_a_newcomer() -> None:
    registry, pool = _one_slot_pool()
    held = await registry.acquire(pool, set(), wait_s=1)
    assert held is not None
    waiter = asyncio.create_task(registry.acquire(pool, set(), wait_s=5, ticket=Ticket("b")))
    await asyncio.sleep(0)
    held.release()
    with pytest.raises(RateLimited):  # the slot already belongs to the waiter
        await registry.acquire(pool, set(), wait_s=0, ticket=Ticket("newcomer"))
    lease = await waiter
    assert lease is not None
    assert registry.get("http://a:1").in_flight == 1
