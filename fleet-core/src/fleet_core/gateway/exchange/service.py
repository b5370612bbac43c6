"""Serving one OpenAI request: parse, route, admit, open upstream, relay, meter, settle.

The HTTP edge (``routes``) hands the parsed request here. Everything from admission to the last
byte of the answer runs inside one context manager, `GatewayService.admitted`, whose ``finally``
writes the request's one usage record and settles its one reservation. No path through the
exchange records or settles on its own: a branch only notes what it learned (status, outcome,
the engine's usage, the text relayed) on the `Exchange`, and the ``finally`` turns that into
the record. Every way out — an answer, the engine's 4xx, a refused or exhausted failover, a
timeout, a malformed answer, a broken stream, a client that left, a task cancelled at shutdown, a
bug — passes that one ``finally`` exactly once, so "one record and one settlement per admitted
request" is a property of the structure, not of each branch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import msgspec

from fleet_core.gateway.admission.budget_book import Amounts
from fleet_core.gateway.admission.key_ring import ANONYMOUS, Principal
from fleet_core.gateway.admission.service import Admission, Reservation
from fleet_core.gateway.config import RoutingConfig
from fleet_core.gateway.edge.wire import Kind, ParsedRequest, StreamChunk, prompt_text
from fleet_core.gateway.exchange import lengths, tokenize
from fleet_core.gateway.exchange.proxy import Opened, Proxy, engine_timeout
from fleet_core.gateway.exchange.relay import Relay, StreamMeter
from fleet_core.gateway.exchange.routing import adapters, affinity
from fleet_core.gateway.exchange.routing.endpoints import Ticket
from fleet_core.gateway.exchange.routing.table import Pool, RoutingTable
from fleet_core.gateway.exchange.tokenizers import RegistryTokenizers, registry_id
from fleet_core.gateway.metering import bounds
from fleet_core.gateway.metering.counting import ESTIMATE, Counter, load_counter
from fleet_core.gateway.metering.records import (
    EngineUsage,
    GatewayCount,
    Outcome,
    UsageRecord,
    UsageSink,
)
from fleet_core.shared.errors import FleetError, UpstreamError
from fleet_core.shared.pricing import Rates

__all__ = ["PATHS", "Admitted", "ClientLeft", "Exchange", "GatewayService"]

PATHS: dict[Kind, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
_chunk_decoder = msgspec.json.Decoder(StreamChunk)


class ClientLeft(Exception):
    """The client went away before its answer was complete (recorded as 499)."""


@dataclass(slots=True)
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
    client_request_id: str | None = None
    affinity_key: str | None = None
    """Session or prompt-prefix key, for pools routed by ``prefix_affinity``."""
    reservation: Reservation | None = None
    attempt: str | None = None
    """The endpoint the request was last sent to (before its answer is known)."""
    turned_down: list[str] = field(default_factory=list)
    """Endpoints that failed the request before it moved on to the next (failover)."""
    opened: Opened | None = None
    relay: Relay | None = None
    first_byte_at: float | None = None
    status: int | None = None
    outcome: Outcome | None = None
    engine: EngineUsage | None = None
    generated: list[str] = field(default_factory=list)
    recounted: int | None = None
    """The engine's own count of the generated text, asked for when it sent no usage."""

    def note(self, status: int, outcome: Outcome) -> None:
        """How the exchange ended, as the code that saw it end knows it (first word wins)."""
        if self.outcome is None:
            self.status, self.outcome = status, outcome

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, FleetError):
            self.note(exc.status, "refused" if self.reservation is None else "upstream_error")
        elif isinstance(exc, ClientLeft | asyncio.CancelledError):
            self.note(499, "client_disconnected")
        else:  # a bug: still recorded and settled, then the app renders its 500
            self.note(500, "upstream_error")


class Reply(msgspec.Struct, frozen=True):
    """A buffered answer for the edge to send: status, body, content type."""

    status: int
    body: bytes
    content_type: str


class RequestMetrics(Protocol):
    def request_started(self, model: str) -> None: ...

    def request_finished(self, model: str) -> None: ...

    def observe(self, record: UsageRecord) -> None: ...

    def refusal(self, record: UsageRecord) -> None: ...


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
        usage_grace_s: float = 2.0,
        routing: RoutingConfig | None = None,
        priority: Callable[[str], int] | None = None,
    ) -> None:
        self._table = table
        self._routing = routing or RoutingConfig()
        self._priority = priority or _equal
        self._proxy = proxy
        self._sink = sink
        self._admission = admission
        self._metrics = metrics
        self._counters: dict[str | None, Counter] = {}
        self._tokenizers = tokenizers
        self._usage_grace_s = usage_grace_s
        self._live = 0
        self._idle = asyncio.Event()
        self._idle.set()

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
        client_request_id: str | None,
        received_at: float,
        session: str | None = None,
    ) -> Exchange:
        """Route the request and count its prompt; raises for an unknown model.

        ``request_id`` is the gateway's own (`logs.mint_request_id`): the ledger's key.
        ``client_request_id`` is the client's ``X-Request-Id``, kept beside it, never a key.
        ``session`` is the client's ``X-Session-Id`` (affinity only; untrusted, bounded).
        """
        table = self._table()
        pool = table.resolve(request.model)
        lengths.check(request)
        counter = self.counter(pool)
        text, given_ids = prompt_text(request)
        prompt_tokens = counter.count(text) + given_ids
        key = self._affinity_key(pool, request, session, text)
        return Exchange(
            request_id,
            request,
            pool,
            table.fallback_chain(pool),
            counter,
            prompt_tokens,
            received_at,
            principal,
            client_request_id,
            key,
        )

    def _affinity_key(
        self, pool: Pool, request: ParsedRequest, session: str | None, text: str
    ) -> str | None:
        if pool.routing != "prefix_affinity":
            return None
        routing = self._routing
        user = request.body.get("user") if routing.session_from_user else None
        chosen = session or (user if isinstance(user, str) else None)
        return affinity.key_of(chosen[:256] if chosen else None, text, chars=routing.prefix_chars)

    def _ticket(self, exchange: Exchange) -> Ticket:
        tenant = exchange.principal.tenant
        return Ticket(
            tenant,
            cost=float(exchange.prompt_tokens + self._completion_reserve(exchange.request)),
            priority=self._priority(tenant),
            key=exchange.affinity_key,
        )

    def admitted(self, exchange: Exchange) -> Admitted:
        """Admit the request, and whatever happens inside, record and settle it once."""
        return Admitted(self, exchange)

    def _enter(self) -> None:
        """One more exchange not yet recorded and settled, for `drain`."""
        self._live += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._live -= 1
        if self._live == 0:
            self._idle.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until every exchange has recorded and settled."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    def _rates(self, pool: Pool) -> Rates | None:
        """The pool's model rate; an adapter without one is rated as its base (ADR 0028)."""
        for name in adapters.rated_as(pool.name, pool.adapter):
            if (rates := self._admission.rates(name)) is not None:
                return rates
        return None

    def _completion_reserve(self, request: ParsedRequest) -> int:
        """Every sequence the request may generate, in full (what is reserved for it)."""
        if request.kind == "embeddings":
            return 0
        most = request.max_tokens or self._admission.default_max_tokens
        return bounds.completion_cap(most, request.sequences)

    async def _admit(self, exchange: Exchange) -> None:
        """Reserve the request's worst case (P5): every sequence it may generate, in full."""
        request = exchange.request
        completion = self._completion_reserve(request)
        prompt = exchange.prompt_tokens
        rates = self._rates(exchange.pool)
        units = rates.micro_units(fresh=prompt, cached=0, output=completion) if rates else 0
        demand = Amounts(prompt, completion, 0, units)  # by position: per request, cheaper
        exchange.reservation = await self._admission.admit(exchange.principal, demand)
        self._metrics.request_started(request.model or exchange.pool.name)

    async def open(self, exchange: Exchange) -> Opened:
        request = exchange.request
        default_max = self._admission.default_max_tokens

        def body_for(pool: Pool) -> bytes:
            return lengths.forward_body(request, pool, default_max_tokens=default_max)

        def attempt(url: str | None) -> None:
            if url is None and exchange.attempt is not None:
                exchange.turned_down.append(exchange.attempt)
            exchange.attempt = url

        exchange.opened = await self._proxy.open(
            exchange.chain,
            PATHS[request.kind],
            body_for,
            request_id=exchange.request_id,
            on_attempt=attempt,
            ticket=self._ticket(exchange),
        )
        return exchange.opened

    async def buffered(self, exchange: Exchange) -> Reply:
        """Read a whole non-stream (or error) response and meter it."""
        assert exchange.opened is not None
        response = exchange.opened.response
        try:
            body = await response.read()
        except TimeoutError as exc:
            raise _timeout(exchange) from exc
        except Exception as exc:  # aiohttp's payload errors: cut short, bad framing
            raise UpstreamError(
                f"the engine's answer broke off: {type(exc).__name__}",
                code="engine_malformed_answer",
            ) from exc
        exchange.first_byte_at = time.time()
        ctype = response.headers.get("Content-Type", "application/json")
        if response.status >= 400:
            exchange.note(response.status, "client_error")
            return _engine_error(response.status, body, ctype)
        exchange.engine, text = _read_usage(body)
        exchange.generated.append(text)
        exchange.note(response.status, "ok")
        return Reply(response.status, body, ctype)

    async def stream(self, exchange: Exchange) -> AsyncGenerator[tuple[bytes, bool], None]:
        """Relay a stream: each read's frames and whether more may follow (`Relay.frames`);
        what it carried is noted on the exchange as it goes."""
        assert exchange.opened is not None
        request = exchange.request
        meter = StreamMeter(strip_usage=not request.wants_usage, choices=request.choices)
        exchange.relay = Relay(exchange.opened.response, meter)
        status = exchange.opened.response.status
        async for frames, more in exchange.relay.frames():
            if meter.output and exchange.first_byte_at is None:  # the engine's, not ours
                exchange.first_byte_at = time.time()
            yield frames, more
            if meter.done and not meter.broken:
                exchange.note(status, "ok")  # [DONE] delivered: a client leaving now left nothing
        exchange.note(status, "upstream_error" if meter.broken else "ok")

    async def _close(self, exchange: Exchange) -> None:
        """Give the engine connection back; first, if the client left after the last choice
        ended, read the engine's usage frame for a moment (it is all generated already)."""
        opened, relay = exchange.opened, exchange.relay
        if opened is None:
            return
        clean = relay.meter.finished if relay else exchange.outcome in ("ok", "client_error")
        try:
            if relay is not None and not relay.meter.finished:
                await relay.usage_after_leaving(self._usage_grace_s)
        finally:
            opened.close(clean=clean)
        usage = relay.meter.usage if relay else exchange.engine
        if usage is None and exchange.counter.method == ESTIMATE:  # else nothing better to ask
            text = "".join(relay.meter.text if relay else exchange.generated)
            target, model = opened.lease.target, opened.pool.name
            if text:
                exchange.recounted = await tokenize.engine_count(
                    self._proxy.session, target, model, text
                )

    def _finish(self, exchange: Exchange) -> None:
        """Write the request's one usage record, settle its reservation, count it."""
        exchange.note(499, "client_disconnected")  # nothing noted: nobody saw it end
        if exchange.reservation is None and exchange.outcome != "refused":
            return  # gone while being admitted: neither admitted nor refused, nothing to record
        record = self._record(exchange)
        self._sink.record(record)
        self._count(exchange, record)
        if exchange.reservation is None:
            self._metrics.refusal(record)
            return
        self._metrics.request_finished(record.model)
        self._metrics.observe(record)
        prompt, completion, cached = record.billed_tokens()
        used = Amounts(prompt, completion, cached, record.units or 0)  # (input, output, ...)
        self._admission.settle(exchange.reservation, used, request_id=record.request_id)

    def _count(self, exchange: Exchange, record: UsageRecord) -> None:
        """The endpoints' counters on ``/health``: every attempt once, here and nowhere else."""
        registry = self._proxy.registry
        for url in exchange.turned_down:
            registry.count(url, failed=True)
        if record.endpoint is not None:
            registry.count(record.endpoint, failed=record.outcome == "upstream_error")

    def _record(self, exchange: Exchange) -> UsageRecord:
        opened, relay = exchange.opened, exchange.relay
        engine, generated = exchange.engine, exchange.generated
        if relay is not None:
            engine = _engine_usage(relay.meter.usage) if relay.meter.usage else None
            generated = relay.meter.text
        principal = exchange.principal
        assert exchange.status is not None
        assert exchange.outcome is not None
        record = UsageRecord(
            request_id=exchange.request_id,
            client_request_id=exchange.client_request_id,
            kind=exchange.request.kind,
            model=exchange.request.model or exchange.pool.name,
            served_model=opened.pool.name if opened else exchange.pool.name,
            endpoint=opened.lease.target.url if opened else exchange.attempt,
            status=exchange.status,
            outcome=exchange.outcome,
            stream=exchange.request.stream,
            received_at=exchange.received_at,
            first_byte_at=exchange.first_byte_at,
            done_at=time.time(),
            engine=engine,
            gateway=_gateway_count(exchange, generated),
            tenant=principal.tenant,
            project=principal.project,
            key_id=principal.key_id,
            prompt_cap=bounds.prompt_cap(
                exchange.prompt_tokens,
                exchange.request.body,
                None if engine is None else engine.prompt_tokens,
            ),
            completion_cap=self._completion_reserve(exchange.request),
        )
        rates = self._rates(opened.pool if opened else exchange.pool)
        if rates is not None:
            # Rated in place, before the record leaves here: the record is still being built
            # (nothing else holds it yet), so a second record via ``replace`` would only cost.
            msgspec.structs.force_setattr(record, "units", rates.billed(record.billed_tokens()))
        return record


class Admitted:
    """`GatewayService.admitted`: ``async with`` it around the whole exchange. Entering admits
    (or refuses: then it records and raises); leaving, however it happens, writes the one record
    and settles the one reservation. A class, not ``contextlib.asynccontextmanager``: its
    generator and the exception thrown through it cost a few per cent of a plain request."""

    __slots__ = ("_exchange", "_service")

    def __init__(self, service: GatewayService, exchange: Exchange) -> None:
        self._service, self._exchange = service, exchange

    async def __aenter__(self) -> Exchange:
        self._service._enter()
        try:
            await self._service._admit(self._exchange)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self._exchange

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        service, exchange = self._service, self._exchange
        if exc is not None:
            exchange.failed(exc)
        try:
            await service._close(exchange)
        finally:
            try:
                service._finish(exchange)
            finally:
                service._leave()


def _gateway_count(exchange: Exchange, generated: list[str]) -> GatewayCount:
    """The gateway's count; the completion the engine's ``/tokenize`` counted when it could."""
    if exchange.recounted is not None:
        return GatewayCount(exchange.prompt_tokens, exchange.recounted, tokenize.METHOD)
    completion = exchange.counter.count("".join(generated))
    return GatewayCount(exchange.prompt_tokens, completion, exchange.counter.method)


def _equal(tenant: str) -> int:
    return 1


def _timeout(exchange: Exchange) -> UpstreamError:
    assert exchange.opened is not None
    return engine_timeout(exchange.opened.lease.target.url)


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
