"""The ``fleet-stub-engine`` console script as a real process: start, answer, stop on a signal."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from fleet_core.devtools.stub_engine import StubSettings, main

SCRIPT = Path(sys.executable).parent / "fleet-stub-engine"
READY = re.compile(r"^fleet-stub-engine: (\w+) (\S+) on (http://127\.0\.0\.1:\d+)$")


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VLLM_API_KEY", "LLAMA_API_KEY"}}
    return {**env, **extra}


@asynccontextmanager
async def engine(
    *args: str, env: Mapping[str, str]
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    assert SCRIPT.exists(), f"{SCRIPT} missing: reinstall fleet-core (uv pip install -e)"
    process = await asyncio.create_subprocess_exec(
        SCRIPT, "--port", "0", *args, env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 15)).decode().strip()
        ready = READY.match(line)
        assert ready, line
        yield process, ready.group(3)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_serves_until_a_signal_then_exits_zero(signum: signal.Signals) -> None:
    args = ("--model", "cli-model", "--reply", "three word reply", "--latency-ms", "1")
    async with engine(*args, env=environment()) as (process, url):
        async with httpx.AsyncClient(timeout=5) as http:
            health = await http.get(f"{url}/health")
            models = await http.get(f"{url}/v1/models")
            chat = await http.post(
                f"{url}/v1/chat/completions", json={"model": "cli-model", "messages": []}
            )
        assert (health.status_code, health.content) == (200, b"")
        assert models.json()["data"][0]["id"] == "cli-model"
        assert chat.json()["choices"][0]["message"]["content"] == "three word reply"
        process.send_signal(signum)
        assert await asyncio.wait_for(process.wait(), 10) == 0


def test_flags_map_onto_settings_and_a_flag_key_beats_the_environment() -> None:
    argv = ["--model", "m", "--token-delay-ms", "5", "--fail-after-tokens", "0"]
    plain = main.settings_from(main.parser().parse_args(argv), {"VLLM_API_KEY": "env"})
    assert plain == StubSettings(model="m", token_delay_ms=5, fail_after_tokens=0, api_key="env")
    flagged = main.parser().parse_args([*argv, "--api-key", "flag", "--profile", "llamacpp"])
    assert main.settings_from(flagged, {"VLLM_API_KEY": "env"}).api_key == "flag"
    llama = main.parser().parse_args([*argv, "--profile", "llamacpp"])
    assert main.settings_from(llama, {"VLLM_API_KEY": "env"}).api_key is None  # not its variable


@pytest.mark.parametrize(
    ("profile", "variable"), [("vllm", "VLLM_API_KEY"), ("llamacpp", "LLAMA_API_KEY")]
)
async def test_api_key_comes_from_the_profiles_variable(profile: str, variable: str) -> None:
    env = environment(**{variable: "from-env"})
    async with engine("--model", "m", "--profile", profile, env=env) as (process, url):
        async with httpx.AsyncClient(timeout=5) as http:
            refused = await http.get(f"{url}/v1/models")
            allowed = await http.get(
                f"{url}/v1/models", headers={"Authorization": "Bearer from-env"}
            )
        assert (refused.status_code, allowed.status_code) == (401, 200)
        assert allowed.json()["data"][0]["owned_by"] == profile
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_a_configuration_that_cannot_work_refuses_to_start() -> None:
    process = await asyncio.create_subprocess_exec(
        SCRIPT,
        "--model",
        "m",
        "--latency-ms",
        "-5",
        env=environment(),
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 2
    assert stderr.decode().strip().splitlines() == [
        "fleet-stub-engine: latency_ms and token_delay_ms must be >= 0"
    ]
