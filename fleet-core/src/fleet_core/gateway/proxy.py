"""Opening a response from an engine, with failover across endpoints and fallback pools (P3).

Failover happens only before the first response byte: connection refused or reset, a connect
timeout, or a 5xx status move on to the next endpoint of the pool, then to each fallback pool, every
endpoint at most once. A 4xx is the client's answer and is returned as it is. Once a 2xx body has
started nothing is retried, because the client already holds bytes of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import msgspec

from fleet_core.errors import UpstreamError
from fleet_core.gateway.routing.endpoints import EndpointRegistry, Lease
from fleet_core.gateway.routing.table import Pool

__all__ = ["Opened", "Proxy"]

log = logging.getLogger("fleet.gateway.proxy")

_CONNECT_ERRORS = (
    aiohttp.ClientConnectorError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    aiohttp.ServerTimeoutError,
    asyncio.TimeoutError,
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


class Proxy:
    def __init__(
        self, session: aiohttp.ClientSession, registry: EndpointRegistry, *, queue_timeout: float
    ) -> None:
        self._session = session
        self._registry = registry
        self._queue_timeout = queue_timeout

    async def open(
        self,
        chain: list[Pool],
        path: str,
        body_for: Callable[[Pool], bytes],
        *,
        request_id: str,
    ) -> Opened:
        """The first usable response along ``chain``; UpstreamError when every endpoint failed."""
        failures: list[_Failure] = []
        for pool in chain:
            tried: set[str] = set()
            body = body_for(pool)
            while lease := await self._registry.acquire(pool, tried, wait_s=self._queue_timeout):
                tried.add(lease.target.url)
                opened = await self._try(pool, lease, path, body, request_id, failures)
                if opened is not None:
                    return opened
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
        except BaseException:  # cancelled (the client left): the slot must not leak
            lease.release()
            raise
        self._registry.record_success(lease.state)
        if response.status >= 500:
            failures.append(
                _Failure(
                    target.url,
                    f"HTTP {response.status}",
                    response.status,
                    await _read_quietly(response),
                )
            )
            response.release()
            lease.release()
            log.warning("endpoint %s answered %s; trying the next", target.url, response.status)
            return None
        return Opened(pool, lease, response)


async def _read_quietly(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except aiohttp.ClientError:
        return b""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
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
    return UpstreamError(
        f"every endpoint of model {pool.name!r} failed ({len(failures)} tried); last: {detail}",
        status=last.status or 502,
    )
