"""Client mistakes get OpenAI envelopes naming the parameter: never a 500 or a router page."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .conftest import GatewayFactory, StubFactory


@pytest.fixture
async def gw(start_stub: StubFactory, start_gateway: GatewayFactory) -> Any:
    engine = await start_stub(model="m")
    return await start_gateway(
        {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}, max_body_bytes=4096
    )


def assert_envelope(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    return error  # type: ignore[no-any-return]


CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, b"{not json", None),
        (CHAT, b"[1, 2]", None),
        (CHAT, b'{"model": "m"}', "messages"),
        (CHAT, b'{"model": "m", "messages": "hi"}', "messages"),
        (CHAT, b'{"model": "m", "messages": []}', "messages"),
        (CHAT, b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', "model"),
        (CHAT, b'{"model": "m", "messages": [{"content": "x"}]}', "messages[0].role"),
        (CHAT, b'{"model": "m", "stream": "yes", "messages": [{"role": "user"}]}', "stream"),
        (CHAT, b'{"model": "m", "max_tokens": "9", "messages": [{"role": "u"}]}', "max_tokens"),
        (CHAT, b'{"model": "m", "max_tokens": 0, "messages": [{"role": "u"}]}', "max_tokens"),
        ("/v1/completions", b'{"model": "m"}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": {"a": 1}}', "prompt"),
        ("/v1/embeddings", b'{"model": "m"}', "input"),
        ("/v1/embeddings", b'{"model": "m", "input": 3.5}', "input"),
    ],
)
async def test_malformed_bodies_are_400_naming_the_parameter(
    gw: Any, path: str, body: bytes, param: str | None
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            gw.url + path, content=body, headers={"content-type": "application/json"}
        )
    error = assert_envelope(response, 400, param)
    assert error["type"] == "invalid_request_error"


async def test_oversized_body_is_413(gw: Any) -> None:
    async with httpx.AsyncClient() as http:
        big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}'
        response = await http.post(gw.url + CHAT, content=big)
        assert_envelope(response, 413)

        async def chunks() -> Any:  # no Content-Length: the limit is enforced while reading
            for _ in range(10):
                yield b"x" * 1000

        response = await http.post(gw.url + CHAT, content=chunks())
        assert_envelope(response, 413)


async def test_unknown_paths_and_methods_get_envelopes(gw: Any) -> None:
    async with httpx.AsyncClient() as http:
        assert_envelope(await http.get(gw.url + "/v1/nothing-here"), 404)
        assert_envelope(await http.post(gw.url + "/v1/audio/speech", json={}), 404)
        error = assert_envelope(await http.get(gw.url + CHAT), 405)
        assert "GET" in error["message"]
        assert_envelope(await http.delete(gw.url + "/v1/models"), 405)


async def test_no_model_without_a_default_is_400(gw: Any) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            gw.url + CHAT, json={"messages": [{"role": "user", "content": "x"}]}
        )
    assert_envelope(response, 400, "model")


async def test_no_model_goes_to_the_default(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    engine = await start_stub(model="served")
    gw = await start_gateway(
        {
            "default_model": "nice",
            "upstreams": [
                {"id": "a", "model": "served", "aliases": ["nice"], "base_url": engine.url}
            ],
        }
    )
    async with httpx.AsyncClient() as http:
        response = await http.post(
            gw.url + CHAT, json={"messages": [{"role": "user", "content": "x"}]}
        )
    assert response.status_code == 200
    assert response.json()["model"] == "served"


async def test_the_client_request_id_is_echoed_and_kept_but_never_the_key(gw: Any) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(
            gw.url + CHAT,
            headers={"X-Request-Id": "trace-42"},
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        )
        assert response.headers["x-request-id"] == "trace-42"
        minted = response.headers["x-fleet-request-id"]
        assert minted.startswith("req_")
        assert len(minted) == 36
        records = (await http.get(gw.url + "/api/v1/requests")).json()["data"]
        assert records[0]["requestId"] == minted
        assert records[0]["clientRequestId"] == "trace-42"
        # too long to keep (a control byte never gets this far: httptools refuses it, a 400)
        generated = await http.get(gw.url + "/healthz", headers={"X-Request-Id": "x" * 129})
        assert generated.headers["x-request-id"] == generated.headers["x-fleet-request-id"]
        assert len(generated.headers["x-request-id"]) == 36
