"""A ``fleet-gateway`` process on a free loopback port, for tests that put one in front of a real
engine (llama-server, the Go bench stub). The caller waits for the readiness it needs."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["fleet_gateway"]


@contextlib.contextmanager
def fleet_gateway(config: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start the gateway on ``config`` (access log off); its URL and process; stopped on exit."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = Path(sys.executable).parent / "fleet-gateway"
    process = subprocess.Popen(
        [str(script), "--config", str(config), "--listen", f"127.0.0.1:{port}"],
        env={**os.environ, "FLEET_ACCESS_LOG": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.terminate()
        process.wait(timeout=30)
