"""Opening a response from an engine, with failover across endpoints and fallback pools (P3).

Failover happens only before the first response byte, and only where the engine cannot have
generated anything for the request: connection refused, a connect timeout, a connection reset or
closed before any status line, or a 429/5xx status move on to the next endpoint of the pool, then to
each fallback pool, every endpoint at most once per request (an endpoint a fallback pool shares
with a pool already tried is not tried again). A refused or reset connection counts toward the
endpoint's passive ejection; a status answer does not (the engine is alive and said no).

An engine that accepted the request and then went silent past ``read_timeout_s`` is not a
connection failure: it may be generating still, so retrying would generate twice and ejecting it
would take a working (slow) endpoint out. That is a 504 (`EngineTimeout`), never retried. An answer
that is not HTTP (a garbage status line, ``Content-Length: abc``) is a 502, also never retried. Any
other 4xx is the client's answer and is returned as it is. Once a 2xx body has started nothing is
retried, because the client already holds bytes of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import msgspec

from fleet_core.gateway.exchange.routing.endpoints import (
    ANY_TICKET,
    EndpointRegistry,
    Lease,
    Ticket,
)
from fleet_core.gateway.exchange.routing.table import Pool
from fleet_core.shared.errors import UpstreamError

__all__ = ["Opened", "Proxy", "engine_timeout", "malformed"]

log = logging.getLogger("fleet.gateway.proxy")

# Errors that prove the engine never took the request: safe to retry elsewhere, and evidence the
# endpoint is down. ConnectionTimeoutError is the connect timeout only (sock_connect); the read
# timeout (SocketTimeoutError) is handled apart, below.
_CONNECT_ERRORS = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
)
_RETRY_STATUSES = frozenset({429})  # and every 5xx


def engine_timeout(url: str) -> UpstreamError:
    """The engine accepted the request, then sent nothing for ``read_timeout_s``: 504."""
    return UpstreamError(
        f"the engine at {url} accepted the request and then did not answer within the read "
        "timeout (FLEET read_timeout_s); it was not retried elsewhere",
        status=504,
        code="engine_timeout",
    )


def malformed(url: str, exc: BaseException) -> UpstreamError:
    """The engine's answer was not valid HTTP: 502."""
    detail = getattr(exc, "message", None) or type(exc).__name__
    return UpstreamError(
        f"the engine at {url} sent a malformed answer ({detail})", code="engine_malformed_answer"
    )


@dataclass
class Opened:
    """An engine response whose status line has arrived; the caller reads and releases it."""

    pool: Pool
    lease: Lease
    response: aiohttp.ClientResponse

    def close(self, *, clean: bool) -> None:
        """Give the connection back (clean) or abort it so the engine stops generating."""
        if clean:
            self.response.release()
        else:
            self.response.close()
        self.lease.release()


@dataclass
class _Failure:
    url: str
    reason: str
    status: int | None = None
    body: bytes = b""
    retry_after: str | None = None


class Proxy:
    def __init__(
        self, session: aiohttp.ClientSession, registry: EndpointRegistry, *, queue_timeout: float
    ) -> None:
        self._session = session
        self._registry = registry
        self._queue_timeout = queue_timeout

    @property
    def registry(self) -> EndpointRegistry:
        return self._registry

    @property
    def session(self) -> aiohttp.ClientSession:
        """The engines' HTTP client (``exchange.tokenize`` asks them to count on it too)."""
        return self._session

    async def open(
        self,
        chain: list[Pool],
        path: str,
        body_for: Callable[[Pool], bytes],
        *,
        request_id: str,
        on_attempt: Callable[[str | None], None] | None = None,
        ticket: Ticket = ANY_TICKET,
    ) -> Opened:
        """The first usable response along ``chain``; UpstreamError when every endpoint failed.

        ``on_attempt`` hears each endpoint's URL just before the request is sent to it, and
        None once that endpoint turned the request down (it generated nothing). ``ticket``
        carries what routing weighs: tenant and cost for the fair queue, the affinity key.
        """
        attempt = on_attempt or _ignore
        failures: list[_Failure] = []
        tried: set[str] = set()  # across the chain: a fallback pool may share an endpoint
        for pool in chain:
            body = body_for(pool)
            while lease := await self._registry.acquire(
                pool, tried, wait_s=self._queue_timeout, ticket=ticket
            ):
                tried.add(lease.target.url)
                attempt(lease.target.url)
                opened = await self._try(pool, lease, path, body, request_id, failures)
                if opened is not None:
                    return opened
                attempt(None)
        raise _exhausted(chain[0], failures)

    async def _try(
        self,
        pool: Pool,
        lease: Lease,
        path: str,
        body: bytes,
        request_id: str,
        failures: list[_Failure],
    ) -> Opened | None:
        target = lease.target
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if target.api_key:
            headers["Authorization"] = f"Bearer {target.api_key}"
        try:
            response = await self._session.post(target.url + path, data=body, headers=headers)
        except _CONNECT_ERRORS as exc:
            lease.release()
            reason = _describe(exc)
            self._registry.record_failure(lease.state, reason)
            failures.append(_Failure(target.url, reason))
            log.warning("endpoint %s failed before responding: %s", target.url, reason)
            return None
        except (TimeoutError, aiohttp.ClientError) as exc:  # accepted, then timed out or garbled
            lease.release()
            self._registry.record_success(lease.state)  # it answered the connection: not down
            if isinstance(exc, TimeoutError):
                raise engine_timeout(target.url) from exc
            raise malformed(target.url, exc) from exc
        except BaseException:  # cancelled (the client left): the slot must not leak
            lease.release()
            raise
        self._registry.record_success(lease.state)
        if response.status >= 500 or response.status in _RETRY_STATUSES:
            failures.append(await _refused(target.url, response))
            lease.release()
            log.warning("endpoint %s answered %s; trying the next", target.url, response.status)
            return None
        return Opened(pool, lease, response)


def _ignore(url: str | None) -> None:
    pass


async def _refused(url: str, response: aiohttp.ClientResponse) -> _Failure:
    """A 429/5xx answer, read and released: it is retried elsewhere, or reported."""
    try:
        body = await _read_quietly(response)
    finally:
        response.release()
    retry_after = response.headers.get("Retry-After")
    return _Failure(url, f"HTTP {response.status}", response.status, body, retry_after)


async def _read_quietly(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except (aiohttp.ClientError, TimeoutError):
        return b""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection failed ({exc.os_error.strerror or exc.os_error})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _EngineMessage(msgspec.Struct):
    message: str = ""


class _EngineError(msgspec.Struct):
    error: _EngineMessage | str | None = None


def _exhausted(pool: Pool, failures: list[_Failure]) -> UpstreamError:
    if not failures:
        return UpstreamError(
            f"no endpoint of model {pool.name!r} is ready", status=503, code="no_ready_endpoint"
        )
    last = failures[-1]
    detail = last.reason
    if last.body:
        try:
            err = msgspec.json.decode(last.body, type=_EngineError).error
            detail = err if isinstance(err, str) else (err.message if err else detail)
        except msgspec.DecodeError:
            pass
    busy = last.status in (429, 503)
    retry_after = next((f.retry_after for f in reversed(failures) if f.retry_after), None)
    return UpstreamError(
        f"every endpoint of model {pool.name!r} failed ({len(failures)} tried); last: {detail}",
        status=last.status or 502,
        code="engine_overloaded" if busy else None,
        headers={"Retry-After": _seconds(retry_after or "1")} if busy else None,
    )


def _seconds(retry_after: str) -> str:
    """An engine's Retry-After passed on when it is whole seconds (bounded), else 1."""
    text = retry_after.strip()
    return str(min(int(text), 3600)) if text.isdigit() else "1"
