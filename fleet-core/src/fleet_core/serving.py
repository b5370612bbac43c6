"""What every server entry point shares: the listen address, the ASGI server, signals, the loop.

Each deployable has its own entry module (``gateway/main.py``, ``apiserver/main.py``,
``stub_engine/main.py``, ``registry/cli.py``) so that a process imports only what it serves; this
module is the part they have in common and imports none of them.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Coroutine
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from fleet_core.errors import ConfigError

__all__ = ["parse_listen", "run", "serve_app", "stop_on_signals"]


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"listen address {value!r} is not HOST:PORT (e.g. 127.0.0.1:8080)")
    return (host.strip("[]") or "0.0.0.0"), int(port)


async def serve_app(
    app: object, listen: str, *, grace_s: float, stop: asyncio.Event, reuse_port: bool = False
) -> None:
    """Serve until ``stop`` is set, then stop accepting and drain for up to ``grace_s``.
    ``reuse_port``: bind with SO_REUSEPORT, so that several worker processes share the port."""
    host, port = parse_listen(listen)
    config = HypercornConfig()
    config.bind = [f"fd://{_shared_socket(host, port)}" if reuse_port else f"{host}:{port}"]
    config.graceful_timeout = grace_s
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
    await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


def _shared_socket(host: str, port: int) -> int:
    """A bound TCP socket with SO_REUSEPORT, as a descriptor hypercorn takes over (``fd://``):
    the kernel spreads new connections over every worker's listening socket on the port."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock.detach()


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
