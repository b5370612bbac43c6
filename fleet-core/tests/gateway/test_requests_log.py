"""``GET /api/v1/requests`` pages through the gateway's recent records by cursor, newest first."""

from __future__ import annotations

import httpx

from fleet_core.shared import paging

from .conftest import GatewayFactory, StubFactory
from .test_openai_sdk import gateway_with_stub


async def test_the_log_pages_newest_first_and_each_record_once(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    _, gw = await gateway_with_stub(start_stub, start_gateway)
    client = gw.client()
    for n in range(5):
        await client.completions.create(model="qwen", prompt=f"p{n}", max_tokens=1)
    async with httpx.AsyncClient(base_url=gw.url) as http:
        everything = (await http.get("/api/v1/requests")).json()
        assert set(everything) == {"object", "data"}  # one page: the shape it always had
        first = (await http.get("/api/v1/requests", params={"limit": "2"})).json()
        await client.completions.create(model="qwen", prompt="later", max_tokens=1)
        seen, page = list(first["data"]), first
        while "next" in page:
            page = (await http.get("/api/v1/requests", params={"after": page["next"]})).json()
            seen.extend(page["data"])
        bad = await http.get("/api/v1/requests", params={"after": "garbage"})
        never = paging.cursor(["-infinity", "x"])  # a start only cost rates may hold
        not_a_time = await http.get("/api/v1/requests", params={"after": never})
        too_many = await http.get("/api/v1/requests", params={"limit": "1001"})
    ids = [r["requestId"] for r in seen]
    assert ids == [r["requestId"] for r in everything["data"]]  # the later one is not shown
    done = [r["doneAt"] for r in seen]
    assert done == sorted(done, reverse=True)
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "after")
    assert (not_a_time.status_code, not_a_time.json()["error"]["param"]) == (400, "after")
    assert (too_many.status_code, too_many.json()["error"]["param"]) == (400, "limit")
