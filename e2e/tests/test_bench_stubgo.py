"""The benches' Go stub engine (``e2e/bench/stubgo``) behind a real ``fleet-gateway``.

The gateway and database benches run every row against this stub, so its answers must pass
through the gateway and satisfy both clients the benches and users run: the official OpenAI SDK
(plain and streamed, with usage) and the Go load generator. The gateway holds an engine key the
stub demands, and must see the stub healthy. Marked ``e2e`` (``make e2e``, where Go is required):
without ``go`` this fails rather than skips.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench import generator, gobuild, stub
from fleet_testing.gateway_process import fleet_gateway

pytestmark = pytest.mark.e2e

MODEL = "bench"
ENGINE_KEY = "stubgo-engine-key-for-tests"
REPLY = "Hello from the Fleet stub engine: this is a canned reply."
WORDS = len(REPLY.split())


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _until(url: str, process: subprocess.Popen[bytes], *, ok: str | None = None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{process.args!r} exited"
        try:
            answer = httpx.get(url, timeout=2)
            if answer.status_code == 200 and (ok is None or ok in answer.text.lower()):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered as expected")


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    binary = gobuild.binary(stub.SOURCE)
    assert isinstance(binary, Path), f"no Go stub: {binary}"
    port = _port()
    process = subprocess.Popen(
        [str(binary), str(port), MODEL],
        env={**os.environ, "FLEET_STUB_API_KEY": ENGINE_KEY},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _until(url + "/health", process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def gateway(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("stubgo") / "fleet.yaml"
    config.write_text(
        f"upstreams:\n  - id: bench\n    model: {MODEL}\n    engine: vllm\n"
        f"    base_url: {engine}\n    api_key: {ENGINE_KEY}\n"
    )
    with fleet_gateway(config) as (url, process):
        _until(url + "/health", process, ok="true")  # the gateway's health round passed
        yield url


@pytest.fixture
def client(gateway: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def test_the_stub_refuses_a_request_without_its_engine_key(engine: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(engine + "/v1/chat/completions", json=body).status_code == 401
    assert httpx.get(engine + "/health").status_code == 200


def test_chat_through_the_gateway_carries_the_reply_and_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "benchmark me"}], max_tokens=16
    )
    assert reply.choices[0].message.content == REPLY
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (2, WORDS)


def test_chat_stream_through_the_gateway_ends_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "benchmark me"}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == REPLY
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == WORDS


def test_completion_stream_is_cut_by_max_tokens(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="one two three",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello from the"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 3)


def test_the_models_list_names_the_stub_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


@pytest.mark.parametrize("cell", ["plain c=4", "stream c=4"])
def test_the_load_generator_counts_no_errors(gateway: str, cell: str) -> None:
    figures = generator.run(gateway, cell, None, 1.0)
    assert figures["requests"] > 0
    assert figures["errors"] == 0
