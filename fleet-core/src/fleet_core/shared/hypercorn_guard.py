"""hypercorn's connections bounded like uvicorn's: the head's bytes and its time (ADR 0022).

hypercorn runs one timer per connection, its keep-alive, which also closes a connection whose head
never finishes: with the 75 s keep-alive a load balancer needs, a client could hold a connection
for 75 s by sending a head a byte at a time, and a head past h11's limit was answered with a
plain-text 431. So each connection is served by `GuardedTCPServer`, which counts the head's bytes
as they are read (431 past `HttpLimits.max_head_bytes`, an OpenAI-style envelope, before the rest
is buffered) and times the head from the connection's start, or a kept-alive request's first byte,
to the end of the head (408 past `HttpLimits.head_timeout_s`; a connection that sent nothing is
closed without an answer). The keep-alive timer is left to what its name says: idle connections.

hypercorn builds each connection's server from the name ``TCPServer`` in ``hypercorn.asyncio.run``;
`install` points that name at `GuardedTCPServer` once. A connection whose config carries no
limits (`with_limits` was not called: the stub engine's server) is served as hypercorn's own.
"""

from __future__ import annotations

import asyncio
import logging
from ssl import SSLError

import hypercorn.asyncio.run
import hypercorn.config
from hypercorn.asyncio.tcp_server import MAX_RECV, TCPServer
from hypercorn.events import Closed, Event, RawData, Updated

from fleet_core.shared.errors import FleetError
from fleet_core.shared.http_limits import (
    HttpLimits,
    answer,
    head_ends_within,
    too_large,
    too_slow,
)

__all__ = ["GuardedTCPServer", "install", "with_limits"]

log = logging.getLogger("fleet.server")

_ATTRIBUTE = "fleet_http_limits"


def with_limits(config: hypercorn.config.Config, limits: HttpLimits) -> None:
    """Have every connection served under ``config`` bounded by ``limits``."""
    setattr(config, _ATTRIBUTE, limits)
    # Ours refuses a long head first, with an envelope; h11's own limit stays as a backstop.
    config.h11_max_incomplete_size = 2 * limits.max_head_bytes
    config.keep_alive_timeout = limits.keep_alive_s


def install() -> None:
    """Serve hypercorn's connections with `GuardedTCPServer` (idempotent)."""
    hypercorn.asyncio.run.TCPServer = GuardedTCPServer  # type: ignore[attr-defined]


class GuardedTCPServer(TCPServer):
    """hypercorn's connection server, with the head's size and time bounded."""

    async def run(self) -> None:
        self._limits: HttpLimits | None = getattr(self.config, _ATTRIBUTE, None)
        self._in_head, self._head_bytes = True, 0
        self._timer: asyncio.TimerHandle | None = None
        if self._limits is not None:
            self._arm(self._limits)
        try:
            await super().run()
        except asyncio.CancelledError:
            # The shutdown grace ran out with this connection open: hypercorn cancels its task,
            # and on Python 3.11 asyncio's stream callback logs that as an error with a
            # traceback. The drain did what it was told: one line, as on uvicorn.
            log.info("a connection was cancelled: the shutdown grace ran out before it finished")
        finally:
            self._disarm()

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            # idle=False: h11 has the whole head; idle=True: the answer went out, and the
            # connection waits for its next request under the keep-alive timer.
            self._disarm()
            self._in_head, self._head_bytes = event.idle, 0
        await super().protocol_send(event)

    async def _read_data(self) -> None:
        """hypercorn's read loop, with each read of a head counted before h11 buffers it."""
        while not self.reader.at_eof():
            try:
                data = await asyncio.wait_for(self.reader.read(MAX_RECV), self.config.read_timeout)
            except (ConnectionError, OSError, TimeoutError, SSLError):
                break
            if self._limits is not None and self._in_head and data and not self._counted(data):
                self._refuse(too_large(self._limits))
                break
            await self.protocol.handle(RawData(data))
        await self.protocol.handle(Closed())

    def _counted(self, data: bytes) -> bool:
        """Count ``data`` into the head; False once the head is past its limit."""
        assert self._limits is not None
        if self._head_bytes == 0 and self._timer is None:
            self._arm(self._limits)  # a kept-alive connection's next request has begun
        self._head_bytes += len(data)
        if self._head_bytes <= self._limits.max_head_bytes:
            return True
        return head_ends_within(data, self._head_bytes, self._limits.max_head_bytes)

    def _arm(self, limits: HttpLimits) -> None:
        self._disarm()
        self._timer = self.loop.call_later(limits.head_timeout_s, self._late, limits)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self, limits: HttpLimits) -> None:
        self._timer = None
        if not self._in_head or self.writer.is_closing():
            return
        if self._head_bytes == 0:
            self.writer.close()  # connected, sent nothing: nobody to answer
        else:
            self._refuse(too_slow("head", limits.head_timeout_s))

    def _refuse(self, error: FleetError) -> None:
        self._in_head = False
        self.writer.write(answer(error))
        self.writer.close()
