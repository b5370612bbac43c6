"""Redis cut while a request is in flight, then resumed: the money must still come out exact.

The gateway reaches Redis through the TCP proxy fixture; the books (`money.Books`) read Redis
directly. A streaming chat is admitted while Redis is up, the proxy cuts Redis mid-stream, the
stream finishes (its settlement meets a dead Redis), and the proxy resumes.

The settlement made while Redis was down fails (logged and counted in
``fleet_rate_limiter_store_errors_total``), is kept, and is sent again with backoff once Redis is
back (issue 13), under the same batch id so that it is applied once: the books come out exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from fleet_testing import servers
from fleet_testing.fix_fault_engine import END, chat_frames, frame, sse, usage_frame
from fleet_testing.fix_proxy import ProxyFactory

from .conftest import TPM, Rig, RigFactory
from .money import billed, bucket_level, in_flight, metric, records

STALL_S = 0.5
"""The engine's pause mid-stream: the window in which the test cuts Redis."""
STORE_ERRORS = "fleet_rate_limiter_store_errors_total"


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
    first, rest = chat_frames(["fine"], finish=None), chat_frames([" thanks"])
    rig.engine.then([sse(), *first, STALL_S, *rest, usage_frame(3, 2), frame("[DONE]"), END])
    stream = asyncio.create_task(rig.send(stream=True))
    await _until(lambda: rig.engine.hits == 1)  # admitted (Redis charged it) and streaming
    reserved = await bucket_level(redis_url, rig.books.tpm_key)
    assert reserved is not None
    assert reserved < TPM - 1000  # max_tokens 1000 + the prompt
    await asyncio.to_thread(proxy.cut)
    response = await stream
    assert response.status_code == 200, response.text
    assert '"error"' not in response.text  # the stream itself never needed Redis
    await _until_async(lambda: _store_errors(rig.gw.url), within_s=10)  # its settlement failed
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
    """Issue 13: the settlement that met a dead Redis is kept and sent again once Redis is back,
    so the tpm bucket comes back to capacity minus what the record bills."""
    await cut.rig.books.check(admitted=1)


async def _store_errors(url: str) -> bool:
    return await metric(url, STORE_ERRORS) >= 1


async def _until(check: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


async def _until_async(check: Callable[[], Awaitable[bool]], within_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
