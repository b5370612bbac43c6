"""A client on raw sockets, for tests of what a server does with what no HTTP library sends:
unfinished heads, huge header blocks, bodies that never end. Each answer is read off the socket as
a client sees it: a status and body, or a connection closed without an answer."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

__all__ = [
    "CLOSED_WITHIN_S",
    "Answer",
    "answer_of",
    "connect",
    "envelope",
    "rss_mb",
    "send_slowly",
    "unfinished_head",
]

CLOSED_WITHIN_S = 3.0
"""A bound's slack for a loaded machine (two cores shared by several test runs)."""


class Answer(msgspec.Struct):
    status: int | None
    """None: the connection was closed without an answer."""
    body: bytes


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    return await asyncio.open_connection(parts.hostname, parts.port)


async def answer_of(reader: asyncio.StreamReader, within: float = CLOSED_WITHIN_S) -> Answer:
    """Everything the server sends until it closes the connection (or ``within`` runs out)."""
    data = b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                data += chunk
    if not data:
        return Answer(None, b"")
    head, _, body = data.partition(b"\r\n\r\n")
    return Answer(int(head.split(b" ", 2)[1]), body)


def envelope(answer: Answer, status: int) -> dict[str, Any]:
    assert answer.status == status, answer
    error: dict[str, Any] = msgspec.json.decode(answer.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


async def send_slowly(writer: asyncio.StreamWriter, data: bytes, size: int) -> None:
    """Write ``data`` in ``size`` pieces, stopping quietly when the server closes."""
    with contextlib.suppress(ConnectionError):
        for start in range(0, len(data), size):
            writer.write(data[start : start + size])
            await writer.drain()


async def unfinished_head(url: str, head: bytes, within: float) -> tuple[Answer, float]:
    """Send ``head`` and never finish it: the answer, and the seconds until the server closed."""
    reader, writer = await connect(url)
    started = time.monotonic()
    writer.write(head)
    answer = await answer_of(reader, within=within)
    writer.close()
    return answer, time.monotonic() - started


def rss_mb() -> float:
    """This process's resident memory in MB (the servers under test run in it), after a
    collection, so that garbage left by earlier tests does not read as growth."""
    gc.collect()
    status = Path("/proc/self/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024
