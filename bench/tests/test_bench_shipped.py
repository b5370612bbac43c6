"""The benches that run ``fleet-gateway`` as shipped name the server it runs by default.

``bench.shipped`` reads the default from the gateway's own parser rather than spelling it, so
that the admission, routing and soak sections follow a change of default; this fails if that
reading breaks or names a server the gateway cannot run.
"""

from __future__ import annotations

from pathlib import Path

from bench import shipped
from fleet_core.shared.asgi_server import SERVERS


def test_the_default_server_is_one_the_gateway_serves_on() -> None:
    assert shipped.server() in SERVERS
    assert f", {shipped.server()})." in shipped.describe()


def test_the_command_leaves_the_server_to_the_gateway() -> None:
    command = shipped.command(Path("fleet.yaml"), 8080)
    assert command[-4:] == ["--config", "fleet.yaml", "--listen", "127.0.0.1:8080"]
    assert "--server" not in command
