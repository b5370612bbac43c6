"""The OpenAI POST routes skip Starlette's stack (`gateway/dispatch.py`): whichever way a
request goes — straight to its handler, or through Starlette when it carries an Origin header —
it gets the same answer, the same error envelope and the same request-id headers."""

from __future__ import annotations

from typing import Any

import httpx

from .conftest import GatewayFactory, StubFactory

LOOPBACK = "http://127.0.0.1:5173"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/chat/completions", {"json": CHAT}),
    ("POST", "/v1/chat/completions", {"content": b"{not json"}),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "model": "nope"}}),
    ("POST", "/v1/embeddings", {"json": {"model": "m"}}),
    ("POST", "/v1/completions", {"content": b"x" * 2048}),
    ("GET", "/v1/chat/completions", {}),
]


async def test_both_paths_answer_alike(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    engine = await start_stub(model="m")
    gw = await start_gateway(
        {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}, max_body_bytes=1024
    )
    async with httpx.AsyncClient() as http:
        for method, path, body in CASES:
            direct = await http.request(method, gw.url + path, **body)
            routed = await http.request(method, gw.url + path, headers={"Origin": LOOPBACK}, **body)
            assert direct.status_code == routed.status_code, (path, body)
            for answer in (direct, routed):
                assert answer.headers["x-fleet-request-id"].startswith("req_")
                assert answer.headers["x-request-id"] == answer.headers["x-fleet-request-id"]
            assert "access-control-allow-origin" not in direct.headers  # CORS only when asked
            assert routed.headers["access-control-allow-origin"] == LOOPBACK
            if direct.status_code == 200:
                assert direct.json()["choices"][0]["message"]["content"]
                assert routed.json()["choices"][0]["message"]["content"]
            else:
                assert direct.json()["error"] == routed.json()["error"], (path, body)
    statuses = [(await http_status(gw.url, method, path, body)) for method, path, body in CASES]
    assert statuses == [200, 400, 404, 400, 413, 405]


async def http_status(url: str, method: str, path: str, body: dict[str, Any]) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.request(method, url + path, **body)).status_code
