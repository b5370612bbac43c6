"""The engine-specific edges: /v1/models, /health, /metrics, /props, unknown paths, per profile."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

MODEL = "stub-model"
Launch = Callable[..., Awaitable[Starlette]]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "four words of prompt"}]}


def samples(text: str) -> dict[str, tuple[dict[str, str], float]]:
    return {
        sample.name: (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_models_vllm_profile(stub: Starlette) -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{stub.state.base_url}/v1", api_key="k", max_retries=0
    ) as sdk:
        page = await sdk.models.list()
    (card,) = page.data
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "vllm")
    assert card.model_extra is not None
    assert card.model_extra["max_model_len"] == 4096
    assert card.created > 0


async def test_models_llamacpp_profile(launch: Launch, http: httpx.AsyncClient) -> None:
    app = await launch(profile="llamacpp")
    body = (await http.get(f"{app.state.base_url}/v1/models")).json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["owned_by"] == "llamacpp"
    assert "max_model_len" not in card


async def test_health_per_profile(launch: Launch, http: httpx.AsyncClient) -> None:
    vllm = await http.get(f"{(await launch()).state.base_url}/health")
    llama = await http.get(f"{(await launch(profile='llamacpp')).state.base_url}/health")
    assert (vllm.status_code, vllm.content) == (200, b"")
    assert (llama.status_code, llama.json()) == (200, {"status": "ok"})


async def test_llama_server_props_name_its_slot_count_and_vllm_has_none(
    launch: Launch, http: httpx.AsyncClient
) -> None:
    llama = await http.get(
        f"{(await launch(profile='llamacpp', max_num_seqs=3)).state.base_url}/props"
    )
    assert (llama.status_code, llama.json()["total_slots"]) == (200, 3)
    assert (await http.get(f"{(await launch()).state.base_url}/props")).status_code == 404


async def test_unknown_v1_path_and_wrong_method_get_envelopes(
    launch: Launch, http: httpx.AsyncClient
) -> None:
    vllm = (await launch()).state.base_url
    llama = (await launch(profile="llamacpp")).state.base_url
    missing = await http.post(f"{vllm}/v1/responses", json={})
    wrong = await http.get(f"{vllm}/v1/chat/completions")
    llama_missing = await http.get(f"{llama}/v1/nothing")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"message": "Not Found", "type": "NotFoundError", "param": None, "code": 404}
    }
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (405, 405)
    assert (llama_missing.status_code, llama_missing.json()["error"]["type"]) == (
        404,
        "not_found_error",
    )


async def test_vllm_metrics_count_tokens_and_expose_kv_usage(
    stub: Starlette, http: httpx.AsyncClient
) -> None:
    base = stub.state.base_url
    await http.post(f"{base}/v1/chat/completions", json={**CHAT, "max_tokens": 5})
    await http.post(f"{base}/v1/chat/completions", json={**CHAT, "max_tokens": 2})
    found = samples((await http.get(f"{base}/metrics")).text)
    label = {"model_name": MODEL}
    assert found["vllm:prompt_tokens_total"] == (label, 8.0)
    assert found["vllm:generation_tokens_total"] == (label, 7.0)
    assert found["vllm:num_requests_running"] == (label, 0.0)
    assert found["vllm:num_requests_waiting"] == (label, 0.0)
    assert found["vllm:gpu_cache_usage_perc"] == (label, 0.0)
    assert found["vllm:kv_cache_usage_perc"] == (label, 0.0)


async def test_llamacpp_metrics_have_its_names_and_no_occupancy(
    launch: Launch, http: httpx.AsyncClient
) -> None:
    base = (await launch(profile="llamacpp")).state.base_url
    await http.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "a b c"})
    text = (await http.get(f"{base}/metrics")).text
    found = samples(text)
    assert found["llamacpp:prompt_tokens_total"] == ({}, 3.0)
    assert found["llamacpp:tokens_predicted_total"][1] > 0
    assert found["llamacpp:requests_processing"] == ({}, 0.0)
    assert found["llamacpp:requests_deferred"] == ({}, 0.0)
    assert all(name.startswith("llamacpp:") for name in found)
    assert "kv" not in text
    assert "cache" not in text


async def test_stubs_in_one_process_share_no_metrics(
    launch: Launch, http: httpx.AsyncClient
) -> None:
    busy, idle = await launch(), await launch()
    await http.post(f"{busy.state.base_url}/v1/chat/completions", json=CHAT)
    assert (
        samples((await http.get(f"{busy.state.base_url}/metrics")).text)[
            "vllm:prompt_tokens_total"
        ][1]
        == 4.0
    )
    assert (
        samples((await http.get(f"{idle.state.base_url}/metrics")).text)[
            "vllm:prompt_tokens_total"
        ][1]
        == 0.0
    )
