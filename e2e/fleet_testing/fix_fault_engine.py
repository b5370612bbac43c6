"""A scriptable misbehaving engine: a real loopback server speaking raw bytes over TCP.

A stub engine built on an HTTP framework can only misbehave in the ways the framework allows. This
one writes the bytes itself, so it can refuse, reset, send a garbage status line or
``Content-Length: abc``, cut a body short, stall before or after its headers or between frames,
and send its usage frame late. Each POST plays the next queued `Script` (or the default one);
``GET /health`` always answers 200, so the gateway keeps the endpoint in rotation and every fault
is met by a request, not by the health checker. ``POST /tokenize`` answers 404 without taking a
script (an engine that cannot count), so a gateway asking it leaves the scripts and ``hits`` be.

A script is a sequence of steps: ``bytes`` are written, a ``float`` is a pause in seconds,
`RESET` aborts the connection with a TCP reset, and the connection is closed when the script
ends. Helpers build the usual answers (`answer`, `sse`, `chat_frames`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

__all__ = [
    "END",
    "OK_CHAT",
    "RESET",
    "FaultEngine",
    "FaultEngineFactory",
    "Script",
    "answer",
    "chat_frames",
    "chunked",
    "fault_engine",
    "frame",
    "sse",
    "usage_frame",
]

RESET = object()
"""A step: abort the connection with RST (SO_LINGER 0) instead of a clean close."""

Step = bytes | float | object
Script = Sequence[Step]


def answer(
    status: int, body: bytes | dict[str, Any] = b"", *, headers: dict[str, str] | None = None
) -> bytes:
    """A whole HTTP/1.1 answer with a correct Content-Length."""
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    head = {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}
    return _head(status, head) + data


def _head(status: int, headers: dict[str, str]) -> bytes:
    fields = (f"{name}: {value}" for name, value in headers.items())
    lines = [f"HTTP/1.1 {status} X", "Connection: close", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def sse() -> bytes:
    """The head of a streamed answer: chunked event stream."""
    return _head(200, {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"})


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


END = b"0\r\n\r\n"
"""The last chunk of a chunked body."""


def frame(value: dict[str, Any] | str) -> bytes:
    """One SSE frame, already chunked."""
    data = value.encode() if isinstance(value, str) else msgspec.json.encode(value)
    return chunked(b"data: " + data + b"\n\n")


def chat_frames(
    words: Iterable[str], *, finish: str | None = "stop", delta: str = "content"
) -> list[bytes]:
    """Chat chunks, one per word (in ``delta``'s field), then one ending the choice."""
    frames = [frame({"choices": [{"index": 0, "delta": {delta: w}}]}) for w in words]
    if finish:
        frames.append(frame({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    return frames


def usage_frame(prompt: int, completion: int) -> bytes:
    total = prompt + completion
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
    return frame({"choices": [], "usage": usage})


@dataclass
class FaultEngine:
    """The server; queue scripts with `then`, read what it received in ``bodies``."""

    default: Script
    scripts: deque[Script] = field(default_factory=deque)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    aborted: int = 0
    """Answers the other side hung up on before the script ended."""
    url: str = ""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def hits(self) -> int:
        return len(self.bodies)

    def then(self, *scripts: Script) -> None:
        """Play these for the next POSTs, in order; then the default again."""
        self.scripts.extend(scripts)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            method, target, body = await _read_request(reader)
            script: Script
            if target == "/tokenize":
                script = [answer(404, {"error": "no tokenizer here"})]
            elif method == "POST":
                self.bodies.append(msgspec.json.decode(body) if body else {})
                script = self.scripts.popleft() if self.scripts else self.default
            else:
                script = [answer(200, b"ok")]
            await self._play(script, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.aborted += 1
        except asyncio.CancelledError:  # stopped; asyncio's callback would log a re-raise
            return
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _play(self, script: Script, writer: asyncio.StreamWriter) -> None:
        for step in script:
            if step is RESET:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            if isinstance(step, float | int):
                await asyncio.sleep(step)
            elif isinstance(step, bytes):
                writer.write(step)
                await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, *_ = [*lines[0].split(" "), "", ""]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return method, target, await reader.readexactly(length) if length else b""


FaultEngineFactory = Callable[..., Awaitable[FaultEngine]]

OK_CHAT = answer(
    200,
    {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine thanks"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    },
)
"""A well-formed non-stream chat answer (3 prompt + 2 completion tokens)."""


@pytest.fixture
async def fault_engine() -> AsyncIterator[FaultEngineFactory]:
    """``await fault_engine(default_script=OK_CHAT)``: a started `FaultEngine`, stopped after."""
    engines: list[FaultEngine] = []

    async def start(default: Script = (OK_CHAT,)) -> FaultEngine:
        engine = FaultEngine(default=default)
        await engine.start()
        engines.append(engine)
        return engine

    try:
        yield start
    finally:
        for engine in engines:
            await engine.stop()
