"""The benches' Go stub engine (``bench/stubgo``) behind a real ``fleet-gateway``.

The gateway and database benches run every row against this stub, so its answers must pass
through the gateway and satisfy both clients the benches and users run: the official OpenAI SDK
(plain and streamed, with usage) and the Go load generator. The gateway holds an engine key the
stub demands, and must see the stub healthy. The soak bench paces the stub's tokens
(``FLEET_STUB_TOKEN_DELAY_MS``) so that a client can leave a stream mid-way. Marked ``e2e``
(``make e2e``, where Go is required): without ``go`` this fails rather than skips.
"""

from __future__ import annotations

import contextlib
import io
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
from fleet_testing import processes
from fleet_testing.ports import free_port
from fleet_testing.waiting import until_answers

pytestmark = pytest.mark.e2e

MODEL = "bench"
ENGINE_KEY = "stubgo-engine-key-for-tests"
REPLY = "Hello from the Fleet stub engine: this is a canned reply."
WORDS = len(REPLY.split())


def _binary() -> Path:
    binary = gobuild.binary(stub.SOURCE)
    assert isinstance(binary, Path), f"no Go stub: {binary}"
    return binary


@contextlib.contextmanager
def _stub(env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [str(_binary()), str(port), MODEL],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        until_answers(url + "/health", process, within=30, what="the Go stub")
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
    upstream = {"id": "bench", "model": MODEL, "engine": "vllm", "base_url": engine}
    with processes.processes(tmp_path_factory.mktemp("stubgo")) as procs:
        yield processes.gateway_in_front(procs, upstream | {"api_key": ENGINE_KEY})


@pytest.fixture
def client(gateway: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def test_the_stub_refuses_a_request_without_its_engine_key(engine: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(engine + "/v1/chat/completions", json=body).status_code == 401
    assert httpx.get(engine + "/health").status_code == 200


def test_the_stub_counts_every_generation_request_it_receives(engine: str) -> None:
    """What a bench divides a server's work by: every generation request, counted."""

    def served() -> int:
        text = httpx.get(engine + "/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("stub_requests_total "))
        return int(line.split()[1])

    before = served()
    headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
    for path, body in [("chat/completions", _body(False)), ("completions", {"prompt": "hi"})]:
        assert httpx.post(f"{engine}/v1/{path}", json=body, headers=headers).status_code == 200
    assert httpx.post(engine + "/v1/completions", json={}).status_code == 401  # not received
    httpx.get(engine + "/v1/models", headers=headers)
    assert served() == before + 2


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
        [str(_binary()), str(free_port()), MODEL],
        env={**os.environ, "FLEET_STUB_TOKEN_DELAY_MS": value},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f'stubgo: FLEET_STUB_TOKEN_DELAY_MS must be milliseconds from 0 to 60000, not "{value}"'
    ]


# The stub's own HTTP/1.1 server (bench/stubgo/server.go), on a raw socket: what net/http's
# server took care of before, and what the gateway's client and the SDKs rely on.


@pytest.fixture(scope="module")
def bare() -> Iterator[tuple[str, int]]:
    with _stub({}) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


class _Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> dict[str, object]:
        parsed = json.loads(self.body)
        assert isinstance(parsed, dict)
        return parsed


def _read_answer(stream: io.BufferedReader) -> _Answer:
    """One HTTP/1.1 answer: its status, headers (names lower-cased) and body (de-chunked)."""
    status = int(stream.readline().split(b" ")[1])
    headers: dict[str, str] = {}
    while (line := stream.readline().rstrip(b"\r\n")) != b"":
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    if headers.get("transfer-encoding") != "chunked":
        return _Answer(status, headers, stream.read(int(headers["content-length"])))
    body = b""
    while size := int(stream.readline().strip(), 16):
        body += stream.read(size)
        assert stream.read(2) == b"\r\n"
    assert stream.readline() == b"\r\n"
    return _Answer(status, headers, body)


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: stub", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _completion(prompt: str, max_tokens: int = 2) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}).encode()


@contextlib.contextmanager
def _socket(address: tuple[str, int]) -> Iterator[tuple[socket.socket, io.BufferedReader]]:
    with socket.create_connection(address, timeout=10) as sock, sock.makefile("rb") as stream:
        yield sock, stream


def _closed(sock: socket.socket, stream: io.BufferedReader) -> bool:
    """True when the stub closed the connection (nothing more comes, end of stream)."""
    return stream.read(1) == b""


def test_pipelined_requests_are_answered_in_order(bare: tuple[str, int]) -> None:
    with _socket(bare) as (sock, stream):
        sock.sendall(
            _post("/v1/completions", _completion("one two three", 1))
            + b"GET /health HTTP/1.1\r\nHost: stub\r\n\r\n"
            + _post("/v1/chat/completions", json.dumps(_body(True)).encode())
        )
        first, second, third = (_read_answer(stream) for _ in range(3))
    assert first.status == 200
    assert first.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert (second.status, second.body) == (200, b"")
    assert third.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert third.body.endswith(b"data: [DONE]\n\n")


def test_a_request_split_across_reads_is_read_whole(bare: tuple[str, int]) -> None:
    request = _post("/v1/completions", _completion("split in many pieces"))
    with _socket(bare) as (sock, stream):
        for piece in (request[:3], request[3:20], request[20:-5], request[-5:]):
            sock.sendall(piece)
            time.sleep(0.05)  # each piece its own read on the stub's side
        answer = _read_answer(stream)
    assert answer.status == 200
    assert answer.json()["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


def test_a_body_larger_than_one_read_is_read_whole(bare: tuple[str, int]) -> None:
    words = 60_000  # ~300 KB: many times the stub's first read buffer
    with _socket(bare) as (sock, stream):
        sock.sendall(_post("/v1/completions", _completion("word " * words)))
        answer = _read_answer(stream)
        assert answer.json()["usage"] == {
            "prompt_tokens": words,
            "completion_tokens": 2,
            "total_tokens": words + 2,
        }
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: stub\r\n\r\n")  # the connection goes on
        assert _read_answer(stream).status == 200


def test_a_chunked_request_body_is_read(bare: tuple[str, int]) -> None:
    body = _completion("chunked body of six words here")
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:]))
    head = b"POST /v1/completions HTTP/1.1\r\nHost: stub\r\nTransfer-Encoding: chunked\r\n\r\n"
    with _socket(bare) as (sock, stream):
        sock.sendall(head + chunks + b"0\r\n\r\n")
        answer = _read_answer(stream)
    assert answer.json()["usage"] == {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}


def test_a_body_over_the_limit_is_refused_and_the_connection_closed(bare: tuple[str, int]) -> None:
    with _socket(bare) as (sock, stream):
        sock.sendall(_post("/v1/completions", b"x" * 1_100_000))
        answer = _read_answer(stream)
        assert answer.status == 400
        assert answer.json()["message"] == (
            "The request body is not valid JSON: http: request body too large"
        )
        assert answer.headers["connection"] == "close"
        assert _closed(sock, stream)


@pytest.mark.parametrize(
    "request_line",
    [b"GARBAGE", b"GET /health", b"GET health HTTP/1.1", b"GET /health HTTP/2.0", b"GET  HTTP/1.1"],
)
def test_a_malformed_request_gets_400_and_the_connection_closed(
    bare: tuple[str, int], request_line: bytes
) -> None:
    with _socket(bare) as (sock, stream):
        sock.sendall(request_line + b"\r\nHost: stub\r\n\r\n")
        answer = _read_answer(stream)
        assert (answer.status, answer.headers["connection"]) == (400, "close")
        assert _closed(sock, stream)


@pytest.mark.parametrize("header", [b"Content-Length: ten", b"no colon here"])
def test_a_malformed_header_gets_400(bare: tuple[str, int], header: bytes) -> None:
    with _socket(bare) as (sock, stream):
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\n" + header + b"\r\n\r\n")
        assert _read_answer(stream).status == 400
        assert _closed(sock, stream)


@pytest.mark.parametrize(
    ("version", "connection"),
    [("HTTP/1.1", "Connection: close"), ("HTTP/1.0", "Host: stub")],
)
def test_the_stub_closes_when_asked_or_on_http_1_0(
    bare: tuple[str, int], version: str, connection: str
) -> None:
    with _socket(bare) as (sock, stream):
        sock.sendall(f"GET /health {version}\r\n{connection}\r\n\r\n".encode())
        answer = _read_answer(stream)
        assert (answer.status, answer.headers["connection"]) == (200, "close")
        assert _closed(sock, stream)


def test_http_1_0_with_keep_alive_stays_open(bare: tuple[str, int]) -> None:
    with _socket(bare) as (sock, stream):
        for _ in range(2):
            sock.sendall(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            answer = _read_answer(stream)
            assert answer.status == 200
            assert "connection" not in answer.headers


def test_unknown_paths_and_methods_get_net_http_s_answers(bare: tuple[str, int]) -> None:
    with _socket(bare) as (sock, stream):
        sock.sendall(b"GET /nowhere HTTP/1.1\r\n\r\nGET /v1/completions HTTP/1.1\r\n\r\n")
        missing, wrong_method = _read_answer(stream), _read_answer(stream)
    assert (missing.status, missing.body) == (404, b"404 page not found\n")
    assert (wrong_method.status, wrong_method.body) == (405, b"Method Not Allowed\n")


def test_a_request_pipelined_behind_a_held_answer_is_answered_after_it(paced: str) -> None:
    """A whole reply held one delay per token; the health check sent behind it on the same
    connection waits for it, answers go in order, and the connection goes on."""
    host, port = paced.removeprefix("http://").split(":")
    started = time.monotonic()
    with _socket((host, int(port))) as (sock, stream):
        sock.sendall(
            _post("/v1/chat/completions", json.dumps(_body(False)).encode())
            + b"GET /health HTTP/1.1\r\nHost: stub\r\n\r\n"
        )
        held = _read_answer(stream)
        health = _read_answer(stream)
        assert time.monotonic() - started >= WORDS * DELAY_MS / 1000
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: stub\r\n\r\n")
        again = _read_answer(stream)
    assert held.json()["choices"][0]["message"]["content"] == REPLY  # type: ignore[index]
    assert (health.status, again.status) == (200, 200)
