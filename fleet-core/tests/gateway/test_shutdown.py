"""SIGTERM mid-stream against a real gateway process: the cut request is still billed and settled.

The gateway runs as its own process in database mode with Redis buckets; the control plane runs
in-process to create the tenant (tpm 6,000) and its key. A stream is open when SIGTERM arrives and
the shutdown grace is shorter than the stream, so shutdown cancels it. After the process has
exited, the ledger holds exactly one row for the stream, and the tenant's Redis bucket is back to
its capacity minus what that row bills: the settlement reached Redis before its client closed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from fleet_core.devtools.stub_engine import StubSettings, create_app
from fleet_testing.asgi import serving
from fleet_testing.ports import free_port
from fleet_testing.waiting import eventually

from .conftest import issue_tenant_key
from .money import bucket_level

TPM = 6000


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
async def test_sigterm_mid_stream_settles_before_redis_closes(
    server: str,
    control_plane: httpx.AsyncClient,
    postgres_url: str,
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    key = await issue_tenant_key(control_plane, tpm=TPM)
    reply = " ".join(["word"] * 200)
    async with serving(
        create_app(StubSettings(model="m", token_delay_ms=50, reply=reply))
    ) as engine:
        config = tmp_path / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: m\n    model: m\n    base_url: {engine}\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "FLEET_DATABASE_URL": postgres_url,
            "FLEET_REDIS_URL": redis_url,
            "FLEET_REDIS_PREFIX": redis_prefix,
            "FLEET_LEDGER_SPOOL": str(tmp_path / "spool.jsonl"),
            "FLEET_SHUTDOWN_GRACE_S": "0.5",
            "FLEET_ACCESS_LOG": "false",
        }
        listen = ["--listen", f"127.0.0.1:{port}", "--server", server]
        proc = _gateway(["--config", str(config), *listen], env)
        try:
            await _until_ready(url, proc)
            started = time.monotonic()
            frames = await _stream_until_sigterm(url, key, proc)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert frames >= 3
    assert proc.stderr is not None
    with proc.stderr:
        output = proc.stderr.read()
    # the server logs the request it cancels when the grace runs out; nothing of ours may fail
    # on the way down
    assert f"({server})" in output, output
    assert "fleet_core/" not in output, output
    assert "unhandled error" not in output, output
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cursor = await conn.execute("SELECT prompt_tokens + completion_tokens, status FROM ledger")
        [(billed, status)] = await cursor.fetchall()
    assert status != 500
    assert 3 <= billed < 200  # cut short, and billed for what was relayed
    level = await bucket_level(redis_url, f"{redis_prefix}fleet:rl:{{acme}}:tenant:tpm")
    assert level is not None
    refill = TPM / 60 * (time.monotonic() - started)
    assert TPM - billed - 1e-6 <= level <= TPM - billed + refill  # 4,096 reserved, refunded


def _gateway(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "fleet_core.gateway", *argv]
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)


async def _until_ready(url: str, proc: subprocess.Popen[str], within_s: float = 20) -> None:
    """Ready, polled without blocking this loop (it serves the stub engine the gateway checks)."""
    async with httpx.AsyncClient() as http:

        async def ready() -> bool:
            assert proc.poll() is None, "the gateway exited"
            with contextlib.suppress(httpx.HTTPError):
                return (await http.get(f"{url}/readyz")).status_code == 200
            return False

        await eventually(ready, within=within_s, what="the gateway ready")


async def _stream_until_sigterm(url: str, key: str, proc: subprocess.Popen[str]) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    frames = 0
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        assert response.status_code == 200
        try:
            async for line in response.aiter_lines():
                frames += line.startswith("data:")
                if frames == 3:
                    proc.send_signal(signal.SIGTERM)
        except httpx.HTTPError:
            pass  # the server went away mid-stream: that is the point
    return frames
