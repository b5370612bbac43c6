"""A stateful property test over request lifecycles: the books balance after every step.

Hypothesis interleaves many requests' lives — admit (or be refused), open (directly, or failing
over from a dead endpoint to the fallback pool), stream frame by frame, leave at any frame, finish
— through the gateway's real service, proxy and admission on a raw-socket engine over loopback,
against the memory store (on a frozen clock, so exactly) and against Redis. After every step:

- the tpm bucket holds capacity minus what the finished requests' records bill, minus what the
  live ones reserved;
- ``fleet_requests_in_flight`` equals the number of live admitted requests;
- every finished request has exactly one record, under its own minted id.

The requests are driven the way the HTTP edge drives them: ``service.admitted`` entered, the
answer produced inside it, and left normally or with the client gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from prometheus_client.parser import text_string_to_metric_families

from fleet_core.gateway.admission.batching_store import BatchingStore
from fleet_core.gateway.admission.directory import StaticDirectory
from fleet_core.gateway.admission.key_ring import ANONYMOUS
from fleet_core.gateway.admission.limits import Bucket, Charge, LimitStore
from fleet_core.gateway.admission.memory_store import MemoryStore
from fleet_core.gateway.admission.rate_policy import Limits, RatePolicy
from fleet_core.gateway.admission.service import Admission
from fleet_core.gateway.admission.store import open_redis_store
from fleet_core.gateway.config import GatewayConfig
from fleet_core.gateway.edge.wire import parse_request
from fleet_core.gateway.exchange.proxy import Proxy
from fleet_core.gateway.exchange.router import Router
from fleet_core.gateway.exchange.routing.endpoints import EndpointRegistry
from fleet_core.gateway.exchange.service import ClientLeft, Exchange, GatewayService
from fleet_core.gateway.metering.metrics import GatewayMetrics
from fleet_core.gateway.metering.records import RingSink
from fleet_core.shared.errors import FleetError
from fleet_core.shared.logs import mint_request_id
from fleet_testing.fix_fault_engine import END, FaultEngine, chat_frames, frame, sse, usage_frame

from .money import billed, bucket_level
from .test_failover import dead_url

TPM = 3000
WORDS = ["one", " two", " three", " four"]
STREAM = [sse(), *itertools.chain(*((f, 0.005) for f in chat_frames(WORDS)))]
STREAM += [usage_frame(3, len(WORDS)), frame("[DONE]"), END]
BUCKET_KEY = "fleet:rl:{anonymous}:tenant:tpm"


@dataclass
class Life:
    exchange: Exchange
    scope: AbstractAsyncContextManager[Exchange]
    frames: AsyncGenerator[bytes, None] | None = None
    ended: bool = False


StoreFactory = Callable[[], Any]


class Lifecycles(RuleBasedStateMachine):
    """One gateway service; ``open_store`` (a coroutine function) gives its limit store."""

    open_store: StoreFactory
    redis_url: str | None = None
    prefix: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.lives: list[Life] = []
        self.finished = 0
        self.started = time.monotonic()
        if self.redis_url is not None:  # a fresh bucket for every example
            self.prefix = f"{type(self).prefix}{secrets.token_hex(4)}:"
        self.run(self._start())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def _start(self) -> None:
        self.stack = contextlib.AsyncExitStack()
        self.engine = FaultEngine(default=STREAM)
        await self.engine.start()
        self.stack.push_async_callback(self.engine.stop)
        self.store: LimitStore = await type(self).open_store()
        self.stack.push_async_callback(self.store.aclose)
        session = await self.stack.enter_async_context(aiohttp.ClientSession())
        config = msgspec.convert(
            {
                "upstreams": [
                    {"id": "m", "model": "m", "base_url": dead_url(), "fallbacks": ["s"]},
                    {"id": "s", "model": "s", "base_url": self.engine.url},
                ],
                "health": {"eject_after": 1000},
            },
            GatewayConfig,
        )
        registry = EndpointRegistry(eject_after=1000)
        router = Router(config, registry)
        self.metrics = GatewayMetrics()
        policy = RatePolicy(default=Limits(tpm=TPM))
        self.admission = Admission(
            directory=StaticDirectory(keys=None, policy=policy),
            store=self.store,
            metrics=self.metrics,
            prefix=self.prefix,
        )
        self.ring = RingSink()
        self.service = GatewayService(
            table=router.current,
            proxy=Proxy(session, registry, queue_timeout=1),
            sink=self.ring,
            admission=self.admission,
            metrics=self.metrics,
            usage_grace_s=0.5,
        )

    def teardown(self) -> None:
        for life in list(self.lives):
            self.run(self._end(life, gone=True))
        self.run(self.admission.drain())
        self.run(self.stack.aclose())
        self.loop.close()

    # -- rules ---------------------------------------------------------------------------------

    @rule(model=st.sampled_from(["m", "s"]), max_tokens=st.integers(1, 1200))
    def admit(self, model: str, max_tokens: int) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        request = parse_request("chat", msgspec.json.encode({**body, "max_tokens": max_tokens}))
        exchange = self.service.begin(
            request,
            principal=ANONYMOUS,
            request_id=mint_request_id(),
            client_request_id="the-same-for-all",
            received_at=0.0,
        )
        scope = self.service.admitted(exchange)
        try:
            self.run(scope.__aenter__())
        except FleetError:
            self.finished += 1  # refused: recorded on the way out, nothing reserved
            return
        self.lives.append(Life(exchange, scope))

    @precondition(lambda self: self.lives)
    @rule(pick=st.integers(0, 100))
    def open(self, pick: int) -> None:
        self._open(self.lives[pick % len(self.lives)])

    def _open(self, life: Life) -> AsyncGenerator[bytes, None]:
        if life.frames is None:
            self.run(self.service.open(life.exchange))
            life.frames = self.service.stream(life.exchange)
        return life.frames

    @precondition(lambda self: any(life.frames for life in self.lives))
    @rule(pick=st.integers(0, 100))
    def read_frame(self, pick: int) -> None:
        opened = [life for life in self.lives if life.frames is not None]
        life = opened[pick % len(opened)]
        assert life.frames is not None
        if not life.ended:
            try:
                self.run(anext(life.frames))
            except StopAsyncIteration:
                life.ended = True

    @precondition(lambda self: self.lives)
    @rule(pick=st.integers(0, 100))
    def leave(self, pick: int) -> None:
        self.run(self._end(self.lives[pick % len(self.lives)], gone=True))

    @precondition(lambda self: self.lives)
    @rule(pick=st.integers(0, 100))
    def finish(self, pick: int) -> None:
        life = self.lives[pick % len(self.lives)]
        frames = self._open(life)
        if not life.ended:
            self.run(_drain(frames))
        self.run(self._end(life, gone=False))

    async def _end(self, life: Life, *, gone: bool) -> None:
        self.lives.remove(life)
        self.finished += 1
        if life.frames is not None:
            await life.frames.aclose()
        if gone:
            await life.scope.__aexit__(ClientLeft, ClientLeft(), None)
        else:
            await life.scope.__aexit__(None, None, None)

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def one_record_each(self) -> None:
        records = self.ring.recent(10_000)
        assert len(records) == self.finished
        assert len({r.request_id for r in records}) == self.finished

    @invariant()
    def gauge_counts_the_live(self) -> None:
        text, _ = self.metrics.render(None)
        families = text_string_to_metric_families(text.decode())
        found = sum(
            s.value for f in families if f.name == "fleet_requests_in_flight" for s in f.samples
        )
        assert found == len(self.lives)

    @invariant()
    def bucket_balances(self) -> None:
        self.run(self.admission.drain())
        used = sum(billed(r) for r in self.ring.recent(10_000))
        held = sum(r.tokens for life in self.lives if (r := life.exchange.reservation))
        self.run(self._check_level(TPM - used - held))

    async def _check_level(self, expected: int) -> None:
        bucket = Bucket(f"{self.prefix}{BUCKET_KEY}", "tenant", "tpm", TPM)
        if self.redis_url is None:  # a frozen clock: probe the exact level, and put it back
            if expected > 0:
                assert (await self.store.reserve([Charge(bucket, expected)])).admitted
                await self.store.settle([Charge(bucket, -expected)])
            assert not (await self.store.reserve([Charge(bucket, max(expected, 0) + 1)])).admitted
            return
        level = await bucket_level(self.redis_url, bucket.key)
        level = TPM if level is None else level
        refill = TPM / 60 * (time.monotonic() - self.started)
        assert expected - 1e-6 <= level <= min(TPM, expected + refill) + 1e-6, (level, expected)


async def _drain(frames: AsyncGenerator[bytes, None]) -> None:
    async for _ in frames:
        pass


SETTINGS = settings(
    max_examples=15,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_lifecycles_balance_on_the_memory_store() -> None:
    class OnMemory(Lifecycles):
        @staticmethod
        async def open_store() -> LimitStore:
            return MemoryStore(clock=lambda: 1000.0)

    run_state_machine_as_test(OnMemory, settings=SETTINGS)


def test_lifecycles_balance_on_redis(redis_url: str, redis_prefix: str) -> None:
    class OnRedis(Lifecycles):
        @staticmethod
        async def open_store() -> LimitStore:
            return BatchingStore(await open_redis_store(redis_url, timeout_s=5))

    OnRedis.redis_url = redis_url
    OnRedis.prefix = redis_prefix
    run_state_machine_as_test(OnRedis, settings=SETTINGS)
