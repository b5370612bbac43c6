"""What every server entry point shares: the listen socket, the ASGI server, signals, the loop.

Each deployable has its own entry module (``gateway/main.py``, ``apiserver/main.py``,
``stub_engine/main.py``, ``registry/cli.py``) so that a process imports only what it serves; this
module is the part they have in common and imports none of them.

Two ASGI servers are supported (ADR 0002): uvicorn with its httptools parser, the gateway's
default because it costs the least CPU per request, and hypercorn, which the control plane uses
and which ``fleet-gateway --server hypercorn`` keeps available. Both get the same socket (bound
here, so a busy port is one line, not a traceback), the same drain on ``stop`` (stop accepting,
let in-flight requests finish for up to ``grace_s``, then cancel them) and run the app's lifespan.
Both bound what a client may send before the app sees it (`http_limits.HttpLimits`: the head's
size, its fields, the time to send head and body), each in the place that server allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Coroutine, Iterator
from typing import Any, Literal

import hypercorn.asyncio
import hypercorn.config
import uvicorn

from fleet_core.shared import hypercorn_guard
from fleet_core.shared.errors import ConfigError
from fleet_core.shared.http_limits import (
    KEEP_ALIVE_DEFAULT_S,
    GuardedApp,
    HttpLimits,
    uvicorn_protocol,
)

__all__ = [
    "SERVERS",
    "Server",
    "listening_socket",
    "parse_listen",
    "run",
    "serve_app",
    "serve_socket",
    "settle_heap",
    "stop_on_signals",
]

Server = Literal["uvicorn", "hypercorn"]
SERVERS: tuple[Server, ...] = ("uvicorn", "hypercorn")
KEEP_ALIVE_S = KEEP_ALIVE_DEFAULT_S
_BACKLOG = 1024
YOUNG_GC_THRESHOLD = 7000
"""Allocations between two young-generation collections once serving (CPython's default: 700)."""


def settle_heap() -> None:
    """Once started, before serving: what start-up built (modules, settings, the app, its pools)
    lives as long as the process, so it is collected once and frozen out of every later
    collection, and young collections run a tenth as often. A request allocates a few hundred
    objects and frees nearly all of them by reference count, so at the default threshold the
    collector ran every few requests, walking the same long-lived objects: a seventh of a
    gateway's CPU (ADR 0002). Cycles are still collected, only later."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"listen address {value!r} is not HOST:PORT (e.g. 127.0.0.1:8080)")
    return (host.strip("[]") or "0.0.0.0"), int(port)


async def serve_app(
    app: object,
    listen: str,
    *,
    grace_s: float,
    stop: asyncio.Event,
    reuse_port: bool = False,
    server: Server = "hypercorn",
    limits: HttpLimits | None = None,
) -> None:
    """Serve until ``stop`` is set, then stop accepting and drain for up to ``grace_s``.
    ``reuse_port``: bind with SO_REUSEPORT, so that several worker processes share the port.
    ``server``: hypercorn unless the caller chooses (the gateway's ``--server``).
    ``limits``: what a request may send before the app sees it (the defaults unless given)."""
    sock = listening_socket(*parse_listen(listen), reuse_port=reuse_port)
    await serve_socket(app, sock, grace_s=grace_s, stop=stop, server=server, limits=limits)


async def serve_socket(
    app: object,
    sock: socket.socket,
    *,
    grace_s: float,
    stop: asyncio.Event,
    server: Server,
    limits: HttpLimits | None = None,
) -> None:
    """`serve_app` on a socket already listening (`listening_socket`), which the server closes."""
    bounds = limits or HttpLimits()
    if server == "uvicorn":
        await _serve_uvicorn(app, sock, grace_s=grace_s, stop=stop, limits=bounds)
    else:
        await _serve_hypercorn(app, sock, grace_s=grace_s, stop=stop, limits=bounds)


def listening_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound, listening TCP socket; with ``reuse_port`` (SO_REUSEPORT) the kernel spreads new
    connections over every worker's socket on the port. ConfigError when it cannot bind."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock


async def _serve_hypercorn(
    app: object, sock: socket.socket, *, grace_s: float, stop: asyncio.Event, limits: HttpLimits
) -> None:
    config = hypercorn.config.Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) the socket from here
    config.graceful_timeout = grace_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    hypercorn_guard.with_limits(config, limits)  # the head's size and time, the keep-alive
    hypercorn_guard.install()
    guarded = GuardedApp(app, limits)  # type: ignore[arg-type]
    await hypercorn.asyncio.serve(guarded, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


async def _serve_uvicorn(
    app: object, sock: socket.socket, *, grace_s: float, stop: asyncio.Event, limits: HttpLimits
) -> None:
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        http=uvicorn_protocol(limits),  # httptools, bounded
        ws="none",
        lifespan="on",
        interface="asgi3",
        loop="none",  # the running loop: uvloop, from `run`
        log_config=None,  # our handlers (logs.setup_logging), not uvicorn's
        access_log=False,  # RequestContextMiddleware writes the access line, with the request id
        proxy_headers=False,  # as with hypercorn: the peer is the peer
        server_header=False,
        timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]  # a float works
        timeout_graceful_shutdown=grace_s,  # type: ignore[arg-type]  # a float works (wait_for)
    )
    server = _Uvicorn(config)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    stopping = asyncio.ensure_future(stop.wait())
    quiet = _CancelledAtShutdown()
    logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True  # stop accepting, drain, then the lifespan's shutdown
        await serving
    finally:
        stopping.cancel()
        logging.getLogger("uvicorn.error").removeFilter(quiet)
        sock.close()


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: ``stop`` (our loop's SIGTERM/SIGINT handlers,
    `stop_on_signals`) decides when to drain, as with hypercorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _CancelledAtShutdown(logging.Filter):
    """When the grace runs out uvicorn cancels the requests still open and logs each one as
    "Exception in ASGI application" with a traceback; that is the drain doing what it was told,
    so it becomes one line without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            record.msg = "a request was cancelled: the shutdown grace ran out before it finished"
            record.args, record.exc_info = None, None
        return True


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, in the running loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop (a dependency; plain asyncio where it cannot load)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; this guards odd platforms
        asyncio.run(main)
    else:
        uvloop.run(main)
