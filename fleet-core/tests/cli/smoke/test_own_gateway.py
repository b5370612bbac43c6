"""The smoke command's own gateway (``--own-gateway``) starts on a port no outgoing connection can
have taken first: one below the kernel's ephemeral range, picked afresh for every run."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from fleet_core.cli.smoke import limited


def _ephemeral_first() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_the_port_is_below_the_ephemeral_range_and_free() -> None:
    ports = {limited._unclaimable_port() for _ in range(20)}
    assert all(1024 <= port < _ephemeral_first() for port in ports)
    assert len(ports) > 1, "picked afresh each time, not a fixed port"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))


async def test_the_own_gateway_serves_on_such_a_port_with_auth_on() -> None:
    async with limited.own_gateway("t") as gateway, httpx.AsyncClient() as http:
        port = int(gateway.url.rsplit(":", 1)[1])
        assert port < _ephemeral_first()
        anonymous = await http.get(f"{gateway.url}/v1/models")
        keyed = await http.get(
            f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {gateway.other}"}
        )
    assert anonymous.status_code == 401
    assert keyed.status_code == 200
