"""Redis cut while a request is in flight, then resumed: the money must still come out exact.

The gateway reaches Redis through the TCP proxy fixture; the books (`money.Books`) read Redis
directly. A streaming chat is admitted while Redis is up, the proxy cuts Redis mid-stream, the
stream finishes (its settlement meets a dead Redis), and the proxy resumes.

The settlement made while Redis was down fails (logged and counted in
``fleet_rate_limiter_store_errors_total``), is kept, and is sent again with backoff once Redis is
back, under the same batch id so that it is applied once: the books come out exact.
A gateway stopped while Redis is still down gives up on such a settlement within a bound, and
says so (one log line; ``fleet_settlements_dropped_total``, see ``admission/test_settling.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import msgspec
import pytest

from fleet_core.gateway.admission.service import DRAIN_S
from fleet_core.gateway.app import create_gateway_app, open_resources
from fleet_core.gateway.config import GatewayConfig
from fleet_core.gateway.settings import GatewaySettings, LogSettings, admission_from_env
from fleet_testing import servers
from fleet_testing.asgi import serving
from fleet_testing.fix_fault_engine import (
    END,
    FaultEngineFactory,
    Script,
    chat_frames,
    frame,
    sse,
    usage_frame,
)
from fleet_testing.fix_proxy import ProxyFactory
from fleet_testing.waiting import eventually

from .conftest import MSG, TPM, Rig, RigFactory
from .money import billed, bucket_level, in_flight, metric, records

STALL_S = 0.5
"""The engine's pause mid-stream: the window in which the test cuts Redis."""
STORE_ERRORS = "fleet_rate_limiter_store_errors_total"
SHUTDOWN_WITHIN_S = DRAIN_S + 3.0
"""A behaviour deadline for a whole gateway shutdown with Redis down (hypercorn allows 60 s)."""


def _interrupted_stream() -> Script:
    first, rest = chat_frames(["fine"], finish=None), chat_frames([" thanks"])
    return [sse(), *first, STALL_S, *rest, usage_frame(3, 2), frame("[DONE]"), END]


@dataclass
class Cut:
    rig: Rig
    reserved: float
    """The tpm bucket's level once the stream was admitted: capacity minus its reservation."""


@pytest.fixture
async def cut(start_rig: RigFactory, redis_url: str, tcp_proxy: ProxyFactory) -> Cut:
    """A rig whose gateway reaches Redis through a proxy, and a stream interrupted as above."""
    target = servers.address_of(redis_url)
    proxy = tcp_proxy(target.host, target.port)
    rig = await start_rig(env={"FLEET_REDIS_URL": proxy.url_for(redis_url)}, read_timeout_s=5)
    rig.engine.then(_interrupted_stream())
    stream = asyncio.create_task(rig.send(stream=True))
    await eventually(
        lambda: rig.engine.hits == 1, within=5
    )  # admitted (Redis charged it) and streaming
    reserved = await bucket_level(redis_url, rig.books.tpm_key)
    assert reserved is not None
    assert reserved < TPM - 1000  # max_tokens 1000 + the prompt
    await asyncio.to_thread(proxy.cut)
    response = await stream
    assert response.status_code == 200, response.text
    assert '"error"' not in response.text  # the stream itself never needed Redis
    await eventually(lambda: _store_errors(rig.gw.url), within=10)  # its settlement failed
    await asyncio.to_thread(proxy.resume)
    return Cut(rig, reserved)


async def test_redis_cut_mid_stream_records_once_and_the_gateway_recovers(cut: Cut) -> None:
    """What holds today: one record billing what the engine reported, the gauge back to 0, no
    500, the failure counted, nothing charged twice, and the next request admitted and settled."""
    [record] = await records(cut.rig.gw.url)
    assert (record.status, record.outcome, billed(record)) == (200, "ok", 5)
    assert await in_flight(cut.rig.gw.url) == 0
    level = await bucket_level(cut.rig.books.redis_url, cut.rig.books.tpm_key)
    assert level is not None
    assert level >= cut.reserved  # never charged twice
    assert (await cut.rig.send()).status_code == 200  # Redis is back: admitted again
    assert len(await records(cut.rig.gw.url)) == 2
    assert await in_flight(cut.rig.gw.url) == 0
    assert 500 not in cut.rig.books.statuses


async def test_redis_cut_mid_stream_then_resumed_keeps_the_books_exact(cut: Cut) -> None:
    """The settlement that met a dead Redis is kept and sent again once Redis is back,
    so the tpm bucket comes back to capacity minus what the record bills."""
    await cut.rig.books.check(admitted=1)


@contextlib.asynccontextmanager
async def _gateway(engine_url: str, redis_url: str, prefix: str) -> AsyncIterator[str]:
    """A gateway on Redis (anonymous tpm=`TPM`) that this test stops itself: its URL."""
    env = {"FLEET_RATE_TPM": str(TPM), "FLEET_REDIS_URL": redis_url, "FLEET_REDIS_PREFIX": prefix}
    upstream = {"id": "m", "model": "m", "base_url": engine_url}
    config = msgspec.convert({"read_timeout_s": 5, "upstreams": [upstream]}, GatewayConfig)
    settings = GatewaySettings(
        config=config, log=LogSettings(access=False), admission=admission_from_env(env)
    )
    async with (
        open_resources(settings) as resources,
        serving(create_gateway_app(settings, resources)) as url,
    ):
        yield url


async def test_stopping_while_redis_is_down_and_a_settlement_awaits_its_retry_is_bounded(
    fault_engine: FaultEngineFactory,
    redis_url: str,
    redis_prefix: str,
    tcp_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The kept settlement's retry is asleep (backoff) and Redis refuses connections
    when the gateway stops: shutdown ends within its bound and names what it gave up on."""
    target = servers.address_of(redis_url)
    proxy = tcp_proxy(target.host, target.port)
    engine = await fault_engine()
    engine.then(_interrupted_stream())
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.ERROR, logger="fleet.admission")
    async with _gateway(engine.url, proxy.url_for(redis_url), redis_prefix) as url:
        body = {"model": "m", "messages": MSG, "max_tokens": 1000, "stream": True}
        async with httpx.AsyncClient(timeout=30) as http:
            stream = asyncio.create_task(http.post(f"{url}/v1/chat/completions", json=body))
            await eventually(lambda: engine.hits == 1, within=5)  # admitted while Redis was up
            await asyncio.to_thread(proxy.cut)
            assert (await stream).status_code == 200
        await eventually(lambda: _store_errors(url, at_least=2), within=10)  # retried once
        started = loop.time()
    assert loop.time() - started < SHUTDOWN_WITHIN_S
    given_up = [r.getMessage() for r in caplog.records if "settlement batches" in r.getMessage()]
    assert len(given_up) == 1
    assert given_up[0].startswith("shutting down with 1 settlement batches")


async def _store_errors(url: str, at_least: int = 1) -> bool:
    return await metric(url, STORE_ERRORS) >= at_least
