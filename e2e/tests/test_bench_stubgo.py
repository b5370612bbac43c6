"""The benches' Go stub engine (``e2e/bench/stubgo``) behind a real ``fleet-gateway``.

The gateway and database benches run every row against this stub, so its answers must pass
through the gateway and satisfy both clients the benches and users run: the official OpenAI SDK
(plain and streamed, with usage) and the Go load generator. The gateway holds an engine key the
stub demands, and must see the stub healthy. The soak bench paces the stub's tokens
(``FLEET_STUB_TOKEN_DELAY_MS``) so that a client can leave a stream mid-way. Marked ``e2e``
(``make e2e``, where Go is required): without ``go`` this fails rather than skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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


def _binary() -> Path:
    binary = gobuild.binary(stub.SOURCE)
    assert isinstance(binary, Path), f"no Go stub: {binary}"
    return binary


@contextlib.contextmanager
def _stub(env: dict[str, str]) -> Iterator[str]:
    port = _port()
    process = subprocess.Popen(
        [str(_binary()), str(port), MODEL],
        env={**os.environ, **env},
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
def engine() -> Iterator[str]:
    with _stub({"FLEET_STUB_API_KEY": ENGINE_KEY}) as url:
        yield url


DELAY_MS = 60


@pytest.fixture(scope="module")
def paced() -> Iterator[str]:
    with _stub({"FLEET_STUB_TOKEN_DELAY_MS": str(DELAY_MS)}) as url:
        yield url


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


def test_every_answer_has_an_id_of_its_own(engine: str) -> None:
    """Answers are assembled from bytes made once; the id (vLLM's prefix, 32 hex digits) is not."""
    headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
    ids = []
    for path, body in [("chat/completions", _body(False)), ("completions", {"prompt": "hi"})] * 2:
        answer = httpx.post(f"{engine}/v1/{path}", json=body, headers=headers)
        ids.append(answer.json()["id"])
    assert len(set(ids)) == 4
    assert all(re.fullmatch(r"(chatcmpl|cmpl)-[0-9a-f]{32}", i) for i in ids), ids


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


def _body(stream: bool) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def test_a_paced_stream_sends_each_token_after_its_delay(paced: str) -> None:
    """The role frame goes at once and every token frame is flushed after its delay: from the
    first frame to [DONE] at least one delay per token after the first passes."""
    arrivals: list[tuple[float, str]] = []
    with httpx.stream("POST", paced + "/v1/chat/completions", json=_body(True)) as answer:
        assert answer.status_code == 200
        arrivals += [(time.monotonic(), line) for line in answer.iter_lines() if line]
    assert arrivals[-1][1] == "data: [DONE]"
    text = "".join(
        frame["choices"][0]["delta"].get("content") or ""
        for frame in (json.loads(line[6:]) for _, line in arrivals[:-1])
    )
    assert text == REPLY
    assert arrivals[-1][0] - arrivals[0][0] >= (WORDS - 1) * DELAY_MS / 1000


def test_a_paced_whole_reply_waits_one_delay_per_token(paced: str) -> None:
    started = time.monotonic()
    answer = httpx.post(paced + "/v1/chat/completions", json=_body(False), timeout=10)
    assert answer.json()["choices"][0]["message"]["content"] == REPLY
    assert time.monotonic() - started >= WORDS * DELAY_MS / 1000


def test_a_client_leaving_a_paced_stream_ends_the_request() -> None:
    """A second a token: the stream would last 11 s; the client's leaving ends it well before."""
    with _stub({"FLEET_STUB_TOKEN_DELAY_MS": "1000"}) as slow:
        with httpx.stream("POST", slow + "/v1/chat/completions", json=_body(True)) as answer:
            lines = answer.iter_lines()  # kept: a dropped iterator closes the response
            assert next(lines).startswith("data: ")  # the role frame; then the client leaves
            assert _running(slow) == 1
        deadline = time.monotonic() + 5
        while _running(slow) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _running(slow) == 0


def _running(url: str) -> int:
    text = httpx.get(url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("vllm:num_requests_running{"))
    return int(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_a_bad_token_delay_refuses_to_start_with_one_line(value: str) -> None:
    done = subprocess.run(
        [str(_binary()), str(_port()), MODEL],
        env={**os.environ, "FLEET_STUB_TOKEN_DELAY_MS": value},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f'stubgo: FLEET_STUB_TOKEN_DELAY_MS must be milliseconds from 0 to 60000, not "{value}"'
    ]
