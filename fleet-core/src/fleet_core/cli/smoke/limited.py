"""The gateway the authentication, rate-limit and metrics rows run against, with known limits.

Two ways to get one:
- ``own_gateway`` (``--own-gateway``, what ``make smoke`` uses against ``make dev``): a second
  ``fleet-gateway --demo`` of the smoke command's own, on a free loopback port below the
  kernel's ephemeral range (no outgoing connection can take it before the gateway binds it), with
  auth on and keys, limits and a metrics token it chose (passed in its environment, never its
  argv), stopped when the run ends;
- ``deployed``: the gateway under test itself (database mode), with throwaway tenants whose limits
  the control plane sets, and the admin credential (or ``--metrics-token-file``) for /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from fleet_core.cli.smoke.context import Context, SetupFailed

__all__ = ["RPM", "TPM", "Limited", "deployed", "limited_gateway", "own_gateway"]

RPM = 3
"""The request ceiling of the ``limited`` tenant (per minute)."""
TPM = 200
"""The token ceiling of the ``tokens`` tenant, whose request ceiling is ``TOKEN_TENANT_RPM``."""
TOKEN_TENANT_RPM = 20
_START_S = 30.0
_PORTS_BELOW = 8192
_PORT_TRIES = 100


@dataclass(frozen=True)
class Limited:
    url: str
    shared: tuple[str, str]
    """Two keys of tenant ``limited_tenant`` (ceiling ``RPM`` requests a minute)."""
    limited_tenant: str
    tokens: str
    """A key of ``tokens_tenant`` (ceiling ``TPM`` tokens and ``TOKEN_TENANT_RPM`` requests)."""
    tokens_tenant: str
    other: str
    """A key of ``other_tenant``, which has no limits."""
    other_tenant: str
    metrics_token: str | None

    @property
    def secrets(self) -> tuple[str, ...]:
        return (*self.shared, self.tokens, self.other)


async def limited_gateway(ctx: Context) -> Limited:
    """The run's limited gateway: made once, by whichever area asks first."""
    if ctx.limited is None:
        ctx.limited = await (ctx.make_limited or deployed)(ctx)
    assert isinstance(ctx.limited, Limited)
    return ctx.limited


async def deployed(ctx: Context) -> Limited:
    limited = await ctx.tenant("limited", keys=2, request_limit=RPM)
    tokens = await ctx.tenant("tokens", request_limit=TOKEN_TENANT_RPM, token_limit=TPM)
    other = await ctx.tenant("other")
    return Limited(
        url=ctx.gateway,
        shared=(limited.keys[0], limited.keys[1]),
        limited_tenant=limited.id,
        tokens=tokens.keys[0],
        tokens_tenant=tokens.id,
        other=other.keys[0],
        other_tenant=other.id,
        metrics_token=ctx.metrics_token or ctx.admin,
    )


def _unclaimable_port() -> int:
    """A free loopback port below the kernel's ephemeral range, for the gateway to bind next.

    A port from that range (what binding port 0 gives) stays free only until the gateway binds it:
    meanwhile any outgoing connection on the machine may be given it as its local port, and the
    gateway then refuses to start with "Address already in use". Below the range only a server
    that asks for the port by number can take it.
    """
    first = _ephemeral_first()
    for _ in range(_PORT_TRIES):
        port = first - 1 - secrets.randbelow(_PORTS_BELOW)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise SetupFailed(f"no free loopback port in {first - _PORTS_BELOW}-{first - 1}")


def _ephemeral_first() -> int:
    """The first port the kernel hands outgoing connections (Linux's setting, else 49152, the
    start of the range IANA reserves for them and macOS uses)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    except OSError:
        return 49152
    return max(int(text.split()[0]), 1024 + _PORTS_BELOW)


def _gateway_program() -> list[str]:
    beside = Path(sys.executable).parent / "fleet-gateway"
    found = str(beside) if beside.is_file() else shutil.which("fleet-gateway")
    if found is None:
        raise SetupFailed("--own-gateway needs the fleet-gateway command (pip install fleet-core)")
    return [found]


def own_environment(run: str) -> tuple[dict[str, str], Limited]:
    """The second gateway's environment and what the checks may expect of it."""

    def key(tenant: str) -> str:
        return (
            f"{run}-{tenant}/smoke/{secrets.token_urlsafe(18).replace('-', 'x').replace('_', 'y')}"
        )

    limited, tokens, other = f"{run}-limited", f"{run}-tokens", f"{run}-other"
    shared = (key("limited"), key("limited"))
    keys = (*shared, key("tokens"), key("other"))
    metrics = secrets.token_urlsafe(24)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(
        FLEET_AUTH_REQUIRED="true",
        FLEET_API_KEYS=";".join(keys),
        FLEET_RATE_TENANTS=f"{limited}|rpm={RPM};{tokens}|rpm={TOKEN_TENANT_RPM},tpm={TPM}",
        FLEET_METRICS_TOKEN=metrics,
        FLEET_DEMO_TOKEN_DELAY_MS="20",
        FLEET_LOG_LEVEL="warning",
        FLEET_ACCESS_LOG="false",
    )
    found = Limited("", shared, limited, keys[2], tokens, keys[3], other, metrics)
    return env, found


@contextlib.asynccontextmanager
async def own_gateway(run: str) -> AsyncIterator[Limited]:
    """``fleet-gateway --demo`` with auth on, on a free port, until the block ends."""
    env, limited = own_environment(run)
    port = _unclaimable_port()
    argv = [*_gateway_program(), "--demo", "--listen", f"127.0.0.1:{port}"]
    # stderr to a file, not a pipe: a pipe nobody reads would stall the gateway once full
    with tempfile.TemporaryFile() as said:
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=said
        )
        try:
            await _until_up(process, port, said)
            yield dataclasses.replace(limited, url=f"http://127.0.0.1:{port}")
        finally:
            await _stop(process)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), timeout=15)
    except TimeoutError:
        process.kill()
        await process.wait()


async def _until_up(process: asyncio.subprocess.Process, port: int, said: IO[bytes]) -> None:
    deadline = time.monotonic() + _START_S
    while True:
        if process.returncode is not None:
            said.seek(0)
            last = said.read().decode(errors="replace").strip()[-300:]
            raise SetupFailed(f"the smoke command's own gateway exited: {last}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if time.monotonic() > deadline:
            raise SetupFailed(f"the smoke command's own gateway did not listen within {_START_S} s")
        await asyncio.sleep(0.1)
