"""Serving one OpenAI request: parse, route, open upstream, relay, meter.

The HTTP edge (``routes``) hands the raw body here; this module owns the request's life from the
routing decision to the usage record, on every path: success, the engine's 4xx, failover
exhaustion, a broken stream, and a client that went away.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from fleet_core.admission.budgets import Amounts
from fleet_core.admission.keys import ANONYMOUS, Principal
from fleet_core.admission.service import Admission, Reservation
from fleet_core.errors import FleetError, UpstreamError
from fleet_core.gateway.proxy import Opened, Proxy
from fleet_core.gateway.relay import StreamMeter, relay_frames
from fleet_core.gateway.routing.table import Pool, RoutingTable
from fleet_core.gateway.tokenizers import RegistryTokenizers, registry_id
from fleet_core.gateway.wire import Kind, ParsedRequest, StreamChunk, prompt_text
from fleet_core.metering.counting import Counter, load_counter
from fleet_core.metering.records import EngineUsage, GatewayCount, Outcome, UsageRecord, UsageSink

__all__ = ["PATHS", "Exchange", "GatewayService"]

PATHS: dict[Kind, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
_chunk_decoder = msgspec.json.Decoder(StreamChunk)


@dataclass
class Exchange:
    """A request in progress: what is known about it so far, for its usage record."""

    request_id: str
    request: ParsedRequest
    pool: Pool
    chain: list[Pool]  # the pool and its fallbacks, from the one table this request saw
    counter: Counter
    prompt_tokens: int
    received_at: float
    principal: Principal = ANONYMOUS
    reservation: Reservation | None = None
    opened: Opened | None = None
    first_byte_at: float | None = None
    recorded: bool = False


@dataclass(frozen=True)
class Reply:
    """A buffered answer for the edge to send: status, body, content type."""

    status: int
    body: bytes
    content_type: str


class RequestMetrics(Protocol):
    def request_started(self, model: str) -> None: ...

    def request_finished(self, model: str) -> None: ...

    def observe(self, record: UsageRecord) -> None: ...


class GatewayService:
    def __init__(
        self,
        *,
        table: Callable[[], RoutingTable],
        proxy: Proxy,
        sink: UsageSink,
        admission: Admission,
        metrics: RequestMetrics,
        tokenizers: RegistryTokenizers | None = None,
    ) -> None:
        self._table = table
        self._proxy = proxy
        self._sink = sink
        self._admission = admission
        self._metrics = metrics
        self._counters: dict[str | None, Counter] = {}
        self._tokenizers = tokenizers

    def counter(self, pool: Pool) -> Counter:
        model_id = registry_id(pool.tokenizer)
        if model_id is not None:  # loaded in the background; the estimate until then
            found = self._tokenizers.get(model_id) if self._tokenizers else None
            return found or self.counter_for(None)
        return self.counter_for(pool.tokenizer)

    def counter_for(self, tokenizer: str | None) -> Counter:
        if tokenizer not in self._counters:
            self._counters[tokenizer] = load_counter(tokenizer)
        return self._counters[tokenizer]

    def begin(
        self,
        request: ParsedRequest,
        *,
        principal: Principal,
        request_id: str,
        received_at: float,
    ) -> Exchange:
        """Route the request and count its prompt; raises for an unknown model."""
        table = self._table()
        pool = table.resolve(request.model)
        counter = self.counter(pool)
        text, given_ids = prompt_text(request)
        prompt_tokens = counter.count(text) + given_ids
        chain = table.fallback_chain(pool)
        return Exchange(
            request_id, request, pool, chain, counter, prompt_tokens, received_at, principal
        )

    async def admit(self, exchange: Exchange) -> None:
        """Reserve the request's worst case (P5); from here on it is in flight.

        A refusal is recorded (outcome ``refused``, nothing billed) before it is raised.
        """
        request = exchange.request
        completion = 0
        if request.kind != "embeddings":
            completion = request.max_tokens or self._admission.default_max_tokens
        prompt = exchange.prompt_tokens
        rates = self._admission.rates(exchange.pool.name)
        units = rates.micro_units(fresh=prompt, cached=0, output=completion) if rates else 0
        demand = Amounts(tokens_input=prompt, tokens_output=completion, units=units)
        try:
            exchange.reservation = await self._admission.admit(exchange.principal, demand)
        except FleetError as exc:
            self.finish(exchange, status=exc.status, outcome="refused")
            raise
        self._metrics.request_started(request.model or exchange.pool.name)

    async def open(self, exchange: Exchange) -> Opened:
        request = exchange.request

        def body_for(pool: Pool) -> bytes:
            return _forward_body(request, pool)

        try:
            exchange.opened = await self._proxy.open(
                exchange.chain,
                PATHS[request.kind],
                body_for,
                request_id=exchange.request_id,
            )
        except UpstreamError as exc:
            self.finish(exchange, status=exc.status, outcome="upstream_error")
            raise
        except asyncio.CancelledError:
            self.finish(exchange, status=499, outcome="client_disconnected")
            raise
        return exchange.opened

    async def buffered(self, exchange: Exchange) -> Reply:
        """Read a whole non-stream (or error) response and meter it."""
        assert exchange.opened is not None
        response = exchange.opened.response
        clean = False
        try:
            body = await response.read()
            clean = True
        finally:
            exchange.opened.close(clean=clean)
            if not clean:
                self.finish(exchange, status=response.status, outcome="client_disconnected")
        exchange.first_byte_at = time.time()
        ctype = response.headers.get("Content-Type", "application/json")
        if response.status >= 400:
            self.finish(exchange, status=response.status, outcome="client_error")
            return _engine_error(response.status, body, ctype)
        engine, completion = _read_usage(body)
        self.finish(
            exchange,
            status=response.status,
            outcome="ok",
            engine=engine,
            completion_tokens=exchange.counter.count(completion),
        )
        return Reply(response.status, body, ctype)

    async def stream(self, exchange: Exchange) -> AsyncIterator[bytes]:
        """Relay a stream; the usage record is written however it ends."""
        assert exchange.opened is not None
        meter = StreamMeter(strip_usage=not exchange.request.wants_usage)
        outcome: Outcome = "client_disconnected"
        try:
            async for frame in relay_frames(exchange.opened.response, meter):
                if exchange.first_byte_at is None:
                    exchange.first_byte_at = time.time()
                yield frame
            outcome = "upstream_error" if meter.broken else "ok"
        finally:
            exchange.opened.close(clean=meter.finished)
            engine = _engine_usage(meter.usage) if meter.usage else None
            self.finish(
                exchange,
                status=exchange.opened.response.status,
                outcome=outcome,
                engine=engine,
                completion_tokens=exchange.counter.count("".join(meter.text)),
            )

    def abandon(self, exchange: Exchange) -> None:
        """The response ended before the relay could account for it: abort and record."""
        if exchange.opened is not None and not exchange.recorded:
            exchange.opened.close(clean=False)
        self.finish(exchange, status=499, outcome="client_disconnected")

    def finish(
        self,
        exchange: Exchange,
        *,
        status: int,
        outcome: Outcome,
        engine: EngineUsage | None = None,
        completion_tokens: int = 0,
    ) -> None:
        """Write the request's one usage record, settle its reservation, count it."""
        if exchange.recorded:
            return
        exchange.recorded = True
        record = self._record(
            exchange,
            status=status,
            outcome=outcome,
            engine=engine,
            completion_tokens=completion_tokens,
        )
        self._sink.record(record)
        if exchange.reservation is not None:
            self._metrics.request_finished(record.model)
            self._metrics.observe(record)
            nothing_sent = outcome == "upstream_error" and exchange.first_byte_at is None
            used = Amounts()
            if not nothing_sent:
                used = Amounts(
                    tokens_input=record.prompt_tokens,
                    tokens_output=record.completion_tokens,
                    tokens_cached=record.cached_tokens,
                    units=record.units or 0,
                )
            self._admission.settle(exchange.reservation, used, request_id=record.request_id)

    def _record(
        self,
        exchange: Exchange,
        *,
        status: int,
        outcome: Outcome,
        engine: EngineUsage | None,
        completion_tokens: int,
    ) -> UsageRecord:
        opened = exchange.opened
        principal = exchange.principal
        record = UsageRecord(
            request_id=exchange.request_id,
            kind=exchange.request.kind,
            model=exchange.request.model or exchange.pool.name,
            served_model=opened.pool.name if opened else exchange.pool.name,
            endpoint=opened.lease.target.url if opened else None,
            status=status,
            outcome=outcome,
            stream=exchange.request.stream,
            received_at=exchange.received_at,
            first_byte_at=exchange.first_byte_at,
            done_at=time.time(),
            engine=engine,
            gateway=GatewayCount(
                exchange.prompt_tokens, completion_tokens, exchange.counter.method
            ),
            tenant=principal.tenant,
            project=principal.project,
            key_id=principal.key_id,
        )
        rates = self._admission.rates(record.served_model)
        if rates is None:
            return record
        units = rates.micro_units(
            fresh=record.fresh_tokens, cached=record.cached_tokens, output=record.completion_tokens
        )
        return msgspec.structs.replace(record, units=units)


def _forward_body(request: ParsedRequest, pool: Pool) -> bytes:
    body: dict[str, Any] = {**request.body, "model": pool.name}
    if request.stream and not request.wants_usage:
        options = body.get("stream_options") or {}
        body["stream_options"] = {**options, "include_usage": True}
    return msgspec.json.encode(body)


def _engine_usage(usage: Any) -> EngineUsage:
    completion = usage.completion_tokens or 0
    return EngineUsage(usage.prompt_tokens, completion, usage.cached)


def _read_usage(body: bytes) -> tuple[EngineUsage | None, str]:
    try:
        chunk = _chunk_decoder.decode(body)
    except msgspec.DecodeError:
        return None, ""
    return (_engine_usage(chunk.usage) if chunk.usage else None), chunk.text()


def _engine_error(status: int, body: bytes, ctype: str) -> Reply:
    """An engine's 4xx is the client's answer, verbatim; a non-JSON one gets an envelope."""
    try:
        msgspec.json.decode(body)
        return Reply(status, body, ctype)
    except msgspec.DecodeError:
        pass
    text = body.decode("utf-8", "replace").strip()[:2000] or f"HTTP {status}"
    error = UpstreamError(
        f"the engine answered {status}: {text}", status=status, code="engine_error"
    )
    return Reply(status, msgspec.json.encode(error.envelope()), "application/json")
