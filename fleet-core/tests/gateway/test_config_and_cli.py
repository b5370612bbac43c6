"""fleet.yaml validation, the CLI's refusals, --demo, token counting, and draining on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import msgspec
import openai
import pytest

from fleet_core.gateway.config import load_config
from fleet_core.gateway.metering.counting import ESTIMATE, load_counter
from fleet_core.shared.errors import ConfigError
from fleet_testing.ports import free_port
from fleet_testing.waiting import until_answers

from .conftest import GatewayFactory, StubFactory
from .test_openai_sdk import records_of

GOOD = """
listen: "127.0.0.1:8080"
default_model: qwen
upstreams:
  - id: qwen-7b
    model: Qwen/Qwen2.5-7B-Instruct
    aliases: [qwen]
    engine: vllm
    endpoints: [http://127.0.0.1:8001, http://127.0.0.1:8002]
    slots: 64
    fallbacks: [llama-3b]
  - id: llama-3b
    model: llama-3b
    engine: llamacpp
    base_url: http://127.0.0.1:8003
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_a_good_file_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.upstreams[0].urls() == ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
    assert config.upstreams[1].urls() == ("http://127.0.0.1:8003",)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("slots: 64", "slots: 0"), "upstreams[0].slots"),
        (("slots: 64", "slot: 64"), "unknown field `slot`"),
        (("engine: vllm", "engine: tgi"), "upstreams[0].engine"),
        (("fallbacks: [llama-3b]", "fallbacks: [nope]"), "fallbacks names 'nope'"),
        (("default_model: qwen", "default_model: gpt"), "default_model 'gpt'"),
        (("    base_url: http://127.0.0.1:8003", ""), "needs endpoints"),
        (("http://127.0.0.1:8001", "ftp://x"), "not an http(s) URL"),
        (("id: llama-3b", "id: qwen-7b"), "id is used twice"),
        (("aliases: [qwen]", "aliases: [llama-3b]"), "alias 'llama-3b'"),
        (("listen:", "listen: [1, 2]\nx:"), "$.listen"),
        (("slots: 64", "slots: 64\n    routing: fastest"), "upstreams[0].routing"),
        (("listen:", "routing: {kv_threshold: 1.5}\nlisten:"), "$.routing.kv_threshold"),
        (("listen:", "tenants: {acme: {priority: 0}}\nlisten:"), "$.tenants[...].priority"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_key(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, GOOD.replace(*change)))
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_broken_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "upstreams: [\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet_core.gateway", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_cli_refuses_a_bad_config_with_one_line(tmp_path: Path) -> None:
    result = run_cli("--config", str(write(tmp_path, GOOD.replace("slots: 64", "slots: -1"))))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("fleet-gateway: ")
    assert "slots" in result.stderr


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, "no upstreams"),
        (("--demo", "--listen", "nowhere"), {}, "not HOST:PORT"),
        (("--demo",), {"FLEET_MAX_BODY_BYTES": "lots"}, "FLEET_MAX_BODY_BYTES"),
        (("--demo",), {"FLEET_LOG_FORMAT": "xml"}, "FLEET_LOG_FORMAT"),
        (("--demo",), {"FLEET_HTTP_HEAD_TIMEOUT_S": "0"}, "FLEET_HTTP_HEAD_TIMEOUT_S=0 would"),
        (("--demo",), {"FLEET_HTTP_MAX_HEADERS": "many"}, "FLEET_HTTP_MAX_HEADERS"),
        (("--demo",), {"FLEET_AUTH_REQUIRED": "true"}, "FLEET_API_KEYS is empty"),
        (("--demo",), {"FLEET_API_KEYS": "a/b/c"}, "FLEET_AUTH_REQUIRED is not true"),
        (
            ("--demo",),
            {"FLEET_RATE_TENANTS": "a|rpm=1", "FLEET_RATE_PROJECTS": "a/b|rpm=2"},
            "above tenant a's rpm=1",
        ),
    ],
)
def test_cli_refuses_what_cannot_work(
    args: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    result = run_cli(*args, env=env)
    assert result.returncode == 2
    assert expected in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
def test_demo_serves_and_sigterm_drains_an_open_stream(server: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    listen = ["--listen", f"127.0.0.1:{port}"]
    server_args = [] if server == "uvicorn" else ["--server", server]  # uvicorn: the default
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet_core.gateway", "--demo", *listen, *server_args],
        env={**os.environ, "FLEET_LOG_FORMAT": "json", "FLEET_DEMO_TOKEN_DELAY_MS": "30"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        until_answers(url + "/healthz", proc, what="fleet-gateway")
        with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
            reply = client.chat.completions.create(
                model="demo",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Request-Id": "trace-7"},
            )
            assert reply.choices[0].message.content
            stream = client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            first = next(iter(stream))
            proc.send_signal(signal.SIGTERM)
            rest = list(stream)
        assert first.choices[0].delta.role == "assistant"
        assert rest[-1].choices[0].finish_reason == "stop"  # finished, not cut
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    with proc.stderr:
        output = proc.stderr.read()
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "fleet.access"]
    assert access
    assert all(len(line["request_id"]) == 36 for line in access)  # minted: req_ + 32 hex
    assert [line["client_request_id"] for line in access if "client_request_id" in line] == [
        "trace-7"
    ]
    assert any("stopped" in line["msg"] for line in lines)
    assert any(f"({server})" in line["msg"] for line in lines)  # served by the server asked for


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
def test_the_http_limits_are_read_from_the_environment(server: str) -> None:
    """FLEET_HTTP_MAX_HEADERS=8 on a real process: twelve fields are a 431, three pass."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet_core.gateway", "--demo", "--listen", f"127.0.0.1:{port}",
         "--server", server],
        env={**os.environ, "FLEET_HTTP_MAX_HEADERS": "8"},
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        until_answers(url + "/healthz", proc, what="fleet-gateway")
        many = {f"X-F{i}": "v" for i in range(12)}
        with httpx.Client(base_url=url, timeout=10) as http:
            refused = http.get("/v1/models", headers=many)
            passed = http.get("/v1/models")
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert refused.status_code == 431, refused.text
    assert refused.json()["error"]["code"] == "request_headers_too_large"
    assert passed.status_code == 200, passed.text


def test_a_port_in_use_is_refused_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--demo", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(
        f"fleet-gateway: cannot listen on 127.0.0.1:{port}"
    )


def test_estimate_and_tokenizer_counting(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    counter = load_counter(str(path))
    assert counter.method == "tokenizer:tokenizer.json"
    assert counter.count("hello world hello again") == 4
    estimate = load_counter(None)
    assert estimate.method == ESTIMATE
    assert estimate.count("12345678") == 9  # an upper bound: one a byte, plus one
    assert estimate.count("123456789") == 10


async def test_a_pool_with_a_tokenizer_counts_with_it(
    tmp_path: Path, start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # the stub: one word, one token
    tok.save(str(tmp_path / "tokenizer.json"))
    engine = await start_stub(model="m")
    gw = await start_gateway(
        {
            "upstreams": [
                {
                    "id": "a",
                    "model": "m",
                    "base_url": engine.url,
                    "tokenizer": str(tmp_path / "tokenizer.json"),
                }
            ]
        }
    )
    async with httpx.AsyncClient() as http:
        await http.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "one two three cached"}]},
        )
    [record] = await records_of(gw.url)
    assert record["gateway"] == {  # "role", "user", "content" stand for the template's framing
        "promptTokens": 7,
        "completionTokens": record["engine"]["completionTokens"],
        "method": "tokenizer:tokenizer.json",
    }
    assert record["engine"]["cachedTokens"] == 2  # kept apart from the fresh ones


def test_a_missing_tokenizer_file_refuses_to_start(tmp_path: Path) -> None:
    from fleet_core.gateway.config import GatewayConfig, validate

    config = msgspec.convert(
        {
            "upstreams": [
                {
                    "id": "m",
                    "model": "m",
                    "base_url": "http://127.0.0.1:9",
                    "tokenizer": str(tmp_path / "missing.json"),
                }
            ]
        },
        GatewayConfig,
    )
    with pytest.raises(ConfigError, match=r"upstreams\[0\] \(m\): tokenizer .* is not a file"):
        validate(config)
