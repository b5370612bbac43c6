"""/v1/embeddings in both encodings; the SDK asks for base64 unless told otherwise."""

from __future__ import annotations

import base64
import struct

import httpx
import openai
from starlette.applications import Starlette

MODEL = "stub-model"


def client(app: Starlette) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{app.state.base_url}/v1", api_key="k", max_retries=0)


async def test_float_and_base64_carry_the_same_vectors(stub: Starlette) -> None:
    async with client(stub) as sdk:
        floats = await sdk.embeddings.create(
            model=MODEL, input=["hello world", "bye"], encoding_format="float"
        )
        default = await sdk.embeddings.create(model=MODEL, input=["hello world", "bye"])
    assert [d.index for d in floats.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in floats.data)
    assert floats.data[0].embedding != floats.data[1].embedding
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
    assert floats.usage.prompt_tokens == 3
    assert floats.usage.total_tokens == 3
    assert floats.model == MODEL


async def test_base64_is_little_endian_float32(stub: Starlette, http: httpx.AsyncClient) -> None:
    url = f"{stub.state.base_url}/v1/embeddings"
    as_floats = await http.post(url, json={"model": MODEL, "input": "abc"})
    as_b64 = await http.post(
        url, json={"model": MODEL, "input": "abc", "encoding_format": "base64"}
    )
    vector = as_floats.json()["data"][0]["embedding"]
    encoded = as_b64.json()["data"][0]["embedding"]
    assert isinstance(encoded, str)
    assert list(struct.unpack("<8f", base64.b64decode(encoded))) == vector
    body = as_floats.json()
    assert body["object"] == "list"
    assert body["data"][0]["object"] == "embedding"
    assert body["usage"] == {"prompt_tokens": 1, "total_tokens": 1}  # no completion tokens


async def test_embedding_errors(stub: Starlette, http: httpx.AsyncClient) -> None:
    url = f"{stub.state.base_url}/v1/embeddings"
    unknown = await http.post(url, json={"model": "other", "input": "x"})
    mixed = await http.post(url, json={"model": MODEL, "input": ["x", 1]})
    missing = await http.post(url, json={"model": MODEL})
    assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "NotFoundError")
    assert (mixed.status_code, mixed.json()["error"]["param"]) == (400, "input")
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "input")
