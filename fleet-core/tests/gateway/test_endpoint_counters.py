"""``/health``'s cumulative per-endpoint counters (requests finished, errors), over real HTTP:
what the console's Fleet page turns into rates (issue 18)."""

from __future__ import annotations

import httpx

from .conftest import MSG, GatewayFactory, StubFactory

K, E = 5, 3


async def test_health_counts_each_endpoints_requests_and_errors(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    good = await start_stub(model="m")
    bad = await start_stub(model="b", fail_after_tokens=0)  # non-streams 500, streams cut
    gw = await start_gateway(
        {
            "upstreams": [
                {"id": "m", "model": "m", "base_url": good.url},
                {"id": "b", "model": "b", "base_url": bad.url},
            ]
        }
    )
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
        for _ in range(K):
            ok = await http.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
            assert ok.status_code == 200, ok.text
        for n in range(E):  # the last one streamed: cut after its status line, still an error
            body = {"model": "b", "messages": MSG, "max_tokens": 4, "stream": n == E - 1}
            failed = await http.post("/v1/chat/completions", json=body)
            assert failed.status_code >= 500 or n == E - 1, failed.text
        health = (await http.get("/health")).json()["upstreams"]
    (m,), (b,) = health["m"]["endpoints"], health["b"]["endpoints"]
    assert (m["url"], m["finished"], m["errors"]) == (good.url, K, 0)
    assert (b["url"], b["finished"], b["errors"]) == (bad.url, E, E)
    assert bad.stats().requests_failed == E  # the engine failed exactly those
