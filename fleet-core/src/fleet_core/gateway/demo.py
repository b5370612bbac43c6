"""``fleet-gateway --demo``: a stub engine serving ``demo``, so the gateway runs with nothing else.

The stub runs as a child process (``python -m fleet_core.devtools.stub_engine --port 0``) rather
than in the gateway's own process: the gateway's entry point imports no stub engine code (an
import-linter contract), and with ``--workers N`` every worker proxies to the one stub.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
from collections.abc import Iterator

import msgspec

from fleet_core.gateway.config import GatewayConfig, UpstreamConfig, validate
from fleet_core.shared.errors import ConfigError

__all__ = ["demo_engine", "with_demo"]


@contextlib.contextmanager
def demo_engine(*, token_delay_ms: float) -> Iterator[str]:
    """Start the demo stub engine; its base URL until the block ends, then stop it."""
    command = [
        sys.executable,
        "-m",
        "fleet_core.devtools.stub_engine",
        "--port",
        "0",
        "--model",
        "demo",
    ]
    command += ["--token-delay-ms", str(token_delay_ms)]
    # Its own session: Ctrl-C in a terminal reaches the gateway, which drains, then stops it.
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_die_with_parent,  # safe: no threads yet, the gateway starts it first
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "fleet-stub-engine: vllm demo on http://127.0.0.1:PORT"
        if " on http" not in line:
            raise ConfigError("--demo: the stub engine did not start (see its error above)")
        yield line.rsplit(" on ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _die_with_parent() -> None:
    """In the child: SIGTERM when the gateway dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG),
    so a killed gateway leaves no stub engine behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def with_demo(config: GatewayConfig, url: str) -> GatewayConfig:
    """``config`` plus an upstream ``demo`` at ``url`` (and ``demo`` as the default model)."""
    demo = UpstreamConfig(id="demo", model="demo", engine="vllm", base_url=url)
    merged = msgspec.structs.replace(
        config, default_model=config.default_model or "demo", upstreams=(*config.upstreams, demo)
    )
    validate(merged, source="--demo")
    return merged
