"""The gateway as a user runs it: ``fleet-gateway``, one worker, on its default ASGI server.

The admission, routing and soak sections start ``python -m fleet_core.gateway`` without
``--server``, so they run whatever server the gateway ships with; ``server`` reads that default
from the gateway's own command-line parser, so a section names the server that ran and follows
a change of default without an edit here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fleet_core.gateway import main as gateway_main

__all__ = ["ENV", "command", "describe", "server"]

ENV = {"FLEET_ACCESS_LOG": "false"}
"""As the gateway section's rows run: no access line per request."""


def server() -> str:
    """The ASGI server ``fleet-gateway`` runs when ``--server`` is not given."""
    return str(gateway_main._gateway_args([]).server)


def command(config: Path, port: int) -> list[str]:
    """``fleet-gateway --config CONFIG --listen 127.0.0.1:PORT``, nothing else."""
    listen = f"127.0.0.1:{port}"
    return [sys.executable, "-m", "fleet_core.gateway", "--config", str(config), "--listen", listen]


def describe() -> str:
    """One sentence for a report: which gateway ran."""
    return f"Gateway: `fleet-gateway` as shipped (one worker, its default server, {server()})."
