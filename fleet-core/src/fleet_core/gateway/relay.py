"""Relaying an engine's SSE stream to the client frame by frame, metering as it goes.

Every complete frame is sent as soon as the read that completed it returns (frames that arrived
together leave together, in one write; nothing waits for a later read). The relay
reads every frame's text for the gateway's own count (P6), keeps the engine's usage frame, and
removes it — and the ``"usage":null`` the engine adds to every chunk once asked — when the gateway
asked for usage on the client's behalf, so the client gets exactly the frames it asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import msgspec

from fleet_core.errors import ErrorBody, ErrorEnvelope
from fleet_core.gateway.wire import StreamChunk, Usage

__all__ = ["StreamMeter", "relay_frames"]

_chunk_decoder = msgspec.json.Decoder(StreamChunk)
_STREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


@dataclass
class StreamMeter:
    """What one stream carried, filled in while it is relayed."""

    strip_usage: bool
    text: list[str] = field(default_factory=list)
    usage: Usage | None = None
    broken: str | None = None
    finished: bool = False

    def take(self, frame: bytes) -> bytes | None:
        """The frame to send on (possibly rewritten), or None to drop it."""
        payload = _data(frame)
        if payload is None or payload == b"[DONE]":
            return frame
        try:
            chunk = _chunk_decoder.decode(payload)
        except msgspec.DecodeError:
            return frame  # not ours to judge: relay what the engine said
        if chunk.usage is not None and not chunk.choices:
            self.usage = chunk.usage
            return None if self.strip_usage else frame
        if chunk.usage is not None:
            self.usage = chunk.usage  # continuous usage stats: keep the latest
        self.text.append(chunk.text())
        if self.strip_usage and b'"usage":null' in frame:
            frame = frame.replace(b',"usage":null', b"").replace(b'"usage":null,', b"")
        return frame


def _data(frame: bytes) -> bytes | None:
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


def error_frame(message: str, code: str) -> bytes:
    envelope = ErrorEnvelope(ErrorBody(message, "upstream_error", None, code))
    return b"data: " + msgspec.json.encode(envelope) + b"\n\n"


async def relay_frames(
    response: aiohttp.ClientResponse, meter: StreamMeter
) -> AsyncIterator[bytes]:
    """Yield the client's frames; a break after the first byte ends with an error frame."""
    buffer = b""
    try:
        async for chunk in response.content.iter_any():
            buffer += chunk
            if b"\r" in buffer:
                buffer = buffer.replace(b"\r\n", b"\n")
            ready = []
            while (end := buffer.find(b"\n\n")) >= 0:
                frame, buffer = buffer[: end + 2], buffer[end + 2 :]
                out = meter.take(frame)
                if out is not None:
                    ready.append(out)
            if ready:  # every complete frame that arrived goes out now, in one write
                yield b"".join(ready)
        if buffer.strip():
            yield buffer
        meter.finished = True
    except _STREAM_ERRORS as exc:
        meter.broken = f"the engine's stream broke: {type(exc).__name__}"
        yield error_frame(meter.broken + "; the response is incomplete", "stream_interrupted")
