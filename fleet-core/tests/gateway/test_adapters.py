"""LoRA adapters in the gateway (ADR 0028): an adapter's name routes to its base's endpoints, the
engine is told which adapter (llama.cpp: the body's ``lora`` field; vLLM: the name), and the
adapter's name is the model in the usage record. The real engine's proof is
``e2e/tests/test_adapters_e2e.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleet_core.gateway.config import GatewayConfig, UpstreamConfig
from fleet_core.gateway.exchange.routing import adapters
from fleet_core.gateway.exchange.routing.adapters import AdapterOf
from fleet_core.gateway.exchange.routing.table import DiscoveredModel, build_table

from .conftest import GatewayFactory
from .test_openai_sdk import records_of

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
A, B = "http://10.0.0.1:8080", "http://10.0.0.2:8080"


def test_an_adapter_is_a_pool_of_its_bases_endpoints() -> None:
    gemma = DiscoveredModel("gemma", "llamacpp", (A, B), "c1", (("pirate", 0), ("poet", 1)))
    table = build_table(GatewayConfig(), [gemma], engine_key="k" * 40)
    pirate, poet, base = table.resolve("pirate"), table.resolve("poet"), table.resolve("gemma")
    assert (pirate.adapter, poet.adapter, base.adapter) == (
        AdapterOf("gemma", 0), AdapterOf("gemma", 1), None,
    )  # fmt: skip
    assert pirate.targets == base.targets  # same URLs, same cluster key
    assert pirate.engine == "llamacpp"


def test_a_name_taken_by_a_model_or_another_bases_adapter_keeps_its_pool() -> None:
    static = UpstreamConfig(id="s", model="poet", endpoints=("http://10.9.0.1:8000",))
    found = [
        DiscoveredModel("gemma", "llamacpp", (A,), "c1", (("pirate", 0), ("poet", 1))),
        DiscoveredModel("qwen", "llamacpp", (B,), "c1", (("pirate", 0),)),  # another base
        DiscoveredModel("gemma", "llamacpp", (B,), "c2", (("pirate", 0),)),  # same base and id
        DiscoveredModel("pirate-base", "vllm", ("http://10.3.0.1:8000",), "c1", (("gemma", 0),)),
    ]
    table = build_table(GatewayConfig(upstreams=(static,)), found)
    assert [t.url for t in table.resolve("pirate").targets] == [A, B]  # gemma's, both clusters
    assert table.resolve("pirate").adapter == AdapterOf("gemma", 0)
    assert [t.url for t in table.resolve("poet").targets] == ["http://10.9.0.1:8000"]
    assert table.resolve("poet").adapter is None
    assert table.resolve("gemma").adapter is None  # a model's own name is never an adapter's
    assert [t.url for t in table.resolve("gemma").targets] == [A, B]


@pytest.mark.parametrize(
    ("engine", "adapter", "loaded", "given", "sent"),
    [
        ("llamacpp", AdapterOf("gemma", 2), True, None, [{"id": 2, "scale": 1.0}]),
        ("llamacpp", AdapterOf("gemma", 0), True, [{"id": 1, "scale": 9}],
         [{"id": 0, "scale": 1.0}]),
        # the base, on engines loading adapters: all off, whatever the client said
        ("llamacpp", None, True, [{"id": 0, "scale": 1.0}], [{"id": 0, "scale": 0.0}]),
        ("llamacpp", None, True, None, [{"id": 0, "scale": 0.0}]),
        # engines without adapters: no id to name (llama-server refuses an unknown one)
        ("llamacpp", None, False, [{"id": 0, "scale": 1.0}], None),
        ("llamacpp", None, False, None, None),
        ("vllm", AdapterOf("qwen", 0), True, None, None),  # vLLM: the model name says it
        ("openai", None, False, "passed", "passed"),  # not ours to touch elsewhere
    ],
)  # fmt: skip
def test_the_gateway_owns_llama_servers_lora_field(
    engine: Any, adapter: AdapterOf | None, loaded: bool, given: Any, sent: Any
) -> None:
    body: dict[str, Any] = {"model": "m"} | ({} if given is None else {"lora": given})
    adapters.select(body, engine, adapter, loaded=loaded)
    assert body.get("lora") == sent


def test_a_base_pool_asks_for_no_adapter_only_when_every_endpoint_loads_some() -> None:
    static = UpstreamConfig(id="s", model="qwen", engine="llamacpp", endpoints=(B,))
    found = [
        DiscoveredModel("gemma", "llamacpp", (A,), "c1", (("pirate", 0),)),
        DiscoveredModel("qwen", "llamacpp", (A,), "c1", (("poet", 0),)),  # and B, static
        DiscoveredModel("phi", "llamacpp", (B,), "c1"),
    ]
    table = build_table(GatewayConfig(upstreams=(static,)), found)
    loaded = {name: pool.adapters_loaded for name, pool in table.pools.items()}
    assert loaded == {"gemma": True, "pirate": True, "qwen": False, "poet": True, "phi": False}


@given(base=st.text(min_size=1, max_size=8), name=st.text(min_size=1, max_size=8),
       index=st.integers(0, 15))  # fmt: skip
def test_an_adapter_is_rated_as_itself_first_then_as_its_base(
    base: str, name: str, index: int
) -> None:
    assert adapters.rated_as(name, None) == (name,)
    assert adapters.rated_as(name, AdapterOf(base, index)) == (name, base)


def recording_engine() -> tuple[Starlette, list[dict[str, Any]]]:
    """A llama-server's OpenAI surface that keeps every body it is sent."""
    bodies: list[dict[str, Any]] = []

    async def chat(request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        bodies.append(body)
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        message = {"role": "assistant", "content": "ahoy"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        answer = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"]}
        return JSONResponse(answer | {"choices": [choice], "usage": usage})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)]
    return Starlette(routes=routes), bodies


def discovery_app(engine_url: str) -> Starlette:
    """The control plane's ``GET /api/v1/endpoints``: gemma on llama.cpp with two adapters."""
    doc = {"models": [{"servedModelName": "gemma", "engine": "llamacpp", "clusterId": "c1",
                       "endpoints": [{"url": engine_url, "ready": True}],
                       "adapters": [{"name": "pirate", "index": 0},
                                    {"name": "poet", "index": 1}]}]}  # fmt: skip

    async def endpoints(request: Request) -> Response:
        return JSONResponse(doc, headers={"ETag": '"one"'})

    return Starlette(routes=[Route("/api/v1/endpoints", endpoints)])


async def test_adapters_are_routed_selected_and_recorded_under_their_names(
    start_gateway: GatewayFactory, serve_app: Any
) -> None:
    engine, bodies = recording_engine()
    engine_url = await serve_app(engine)
    cp = await serve_app(discovery_app(engine_url))
    gw = await start_gateway({"upstreams": []}, control_plane_url=cp, discovery_interval_s=0.1)
    client = gw.client()
    for _ in range(100):
        if {m.id for m in (await client.models.list()).data} == {"gemma", "pirate", "poet"}:
            break
        await asyncio.sleep(0.05)
    hostile = {"lora": [{"id": 0, "scale": 1.0}]}  # a client adapting the base's answer
    for model, extra in (("poet", {}), ("gemma", hostile), ("pirate", hostile)):
        reply = await client.chat.completions.create(
            model=model, messages=MSG, max_tokens=4, extra_body=extra
        )
        assert reply.model == model
    assert [(b["model"], b.get("lora")) for b in bodies] == [
        ("poet", [{"id": 1, "scale": 1.0}]),
        ("gemma", [{"id": 0, "scale": 0.0}]),
        ("pirate", [{"id": 0, "scale": 1.0}]),
    ]
    records = await records_of(gw.url)
    assert sorted((r["model"], r["servedModel"], r["endpoint"]) for r in records) == [
        ("gemma", "gemma", engine_url),
        ("pirate", "pirate", engine_url),
        ("poet", "poet", engine_url),
    ]
