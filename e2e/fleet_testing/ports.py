"""Loopback ports for servers a test or a benchmark starts later, in another process or task.

A port handed out here comes from below the kernel's ephemeral range. A port from that range
(what binding port 0 gives) is free only until the server binds it: in between, any outgoing
connection on the machine, a database pool's say, may take it as its local port, and the server
then fails with "Address already in use" (seen once in a stack of five processes). Below the range
no outgoing connection is ever given the port, and no port is handed out twice by one process.

Where the server can bind port 0 itself and say which port it got (an in-process server, a
process that prints its address), prefer that: nothing can race it.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

__all__ = ["free_block", "free_port", "free_ports"]

PICK_FROM = 8192
"""How many ports below the ephemeral range `free_port` picks from."""
_ATTEMPTS = 200
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port free now, below the ephemeral range, never handed out before."""
    return free_ports(1)[0]


def free_ports(count: int, *, also: int | None = None) -> list[int]:
    """``count`` distinct ports as `free_port` gives them; with ``also``, each port + ``also``
    must be free too (and is reserved with it), for servers that derive a second port from the
    first (SeaweedFS puts gRPC on port + 10000)."""
    offsets = (0,) if also is None else (0, also)
    return [_pick(offsets) for _ in range(count)]


def free_block(size: int) -> int:
    """The first of ``size`` consecutive free ports, all reserved (``make dev`` numbers its
    servers from one base port)."""
    return _pick(tuple(range(size)))


def _pick(offsets: tuple[int, ...]) -> int:
    """A port ``p`` such that every ``p + offset`` is free, below the ephemeral range and not
    handed out before; all of them are reserved."""
    low = _ephemeral_low() - PICK_FROM - max(offsets)
    for _ in range(_ATTEMPTS):
        port = low + secrets.randbelow(PICK_FROM)
        group = [port + offset for offset in offsets]
        if not _handed_out.isdisjoint(group) or not all(_bindable(p) for p in group):
            continue
        _handed_out.update(group)
        return port
    raise AssertionError(f"no free loopback ports in {low}-{low + PICK_FROM + max(offsets)}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default, 32768, elsewhere)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    except OSError:
        return 32768
    return max(int(text.split()[0]), 1024 + PICK_FROM + 10000)
