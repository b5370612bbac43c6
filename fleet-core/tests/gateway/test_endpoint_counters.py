"""``/health``'s cumulative per-endpoint counters (requests finished, errors), over real HTTP:
what the console's Fleet page turns into rates."""

from __future__ import annotations

import httpx

from .conftest import MSG, GatewayFactory, StubFactory

K, E = 5, 3


async def test_health_counts_each_endpoints_requests_and_errors(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    good = await start_stub(model="m")
    bad = await start_stub(model="b", fail_after_tokens=0)  # non-streams 500, streams cut
    flaky = await start_stub(model="c", fail_after_tokens=0)  # fails over to m
    gw = await start_gateway(
        {
            "upstreams": [
                {"id": "m", "model": "m", "base_url": good.url},
                {"id": "b", "model": "b", "base_url": bad.url},
                {"id": "c", "model": "c", "base_url": flaky.url, "fallbacks": ["m"]},
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
        saved = await http.post("/v1/chat/completions", json={"model": "c", "messages": MSG})
        assert saved.status_code == 200, saved.text  # c failed, its fallback m answered
        health = (await http.get("/health")).json()["upstreams"]
    (m,), (b,), (c,) = (health[name]["endpoints"] for name in "mbc")
    assert (m["url"], m["finished"], m["errors"]) == (good.url, K + 1, 0)
    assert (c["url"], c["finished"], c["errors"]) == (flaky.url, 1, 1)  # each attempt its own
    assert (b["url"], b["finished"], b["errors"]) == (bad.url, E, E)
    assert bad.stats().requests_failed == E  # the engine failed exactly those
