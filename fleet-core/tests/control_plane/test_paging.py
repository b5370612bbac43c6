"""Keyset pagination of the control plane's lists, over HTTP on a real Postgres.

Property: paging through a list with random page sizes while rows are inserted between pages
(before and after the cursor, with tied ``created_at``) shows every row that was there from the
start exactly once, in a strictly increasing order; rows inserted meanwhile appear at most once.
Bad ``limit`` and ``after`` values are 400 envelopes naming the parameter, never a 500.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_core.shared import paging

from .conftest import ApiserverFactory, envelope
from .test_inventory import report

T0 = datetime(2026, 9, 1, tzinfo=UTC)
_KEY = (
    "INSERT INTO api_keys (id, project_id, label, prefix, secret_hash, created_at)"
    " VALUES (%s, 'acme/chat', 'k', 'fk_x', sha256(%s::bytea), %s)"
)
_RULE = (
    'INSERT INTO budget_rules (id, scope_kind, scope_id, dimension, "limit", window_s, created_at)'
    " VALUES (%s, 'project', 'acme/chat', 'tokens_total', 10, 60, %s)"
)


def _step() -> st.SearchStrategy[tuple[int, list[tuple[str, int]]]]:
    """A page size, then rows to insert before the next page: (id, second of created_at)."""
    new_rows = st.lists(st.tuples(st.text("abcxyz", min_size=1, max_size=3), st.integers(0, 4)))
    return st.tuples(st.integers(1, 7), new_rows)


Arrivals = Callable[[list[tuple[str, int]]], Awaitable[None]]


async def _walk(
    http: httpx.AsyncClient,
    path: str,
    steps: list[tuple[int, list[tuple[str, int]]]],
    arrive: Arrivals,
    **where: str,
) -> list[dict[str, Any]]:
    """Every page of ``path`` with the steps' page sizes, rows arriving after each page."""
    seen: list[dict[str, Any]] = []
    after, step = None, 0
    while True:
        limit, inserts = steps[step % len(steps)]
        step += 1
        query = {**where, "limit": str(limit), **({"after": after} if after else {})}
        response = await http.get(path, params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["data"]) <= limit
        seen.extend(body["data"])
        await arrive(inserts)
        if "next" not in body:
            return seen
        assert len(body["data"]) == limit
        after = body["next"]


async def _pages(
    http: httpx.AsyncClient, path: str, steps: list[tuple[int, list[tuple[str, int]]]], url: str
) -> list[dict[str, Any]]:
    async def arrive(inserts: list[tuple[str, int]]) -> None:
        await asyncio.to_thread(_insert, url, inserts)

    return await _walk(http, path, steps, arrive)


def _insert(url: str, inserts: list[tuple[str, int]]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for name, second in inserts:
            at = T0 + timedelta(seconds=second)
            conn.execute(_KEY + " ON CONFLICT DO NOTHING", (f"new-{name}", name, at))
            conn.execute(_RULE + " ON CONFLICT DO NOTHING", (f"new-{name}", at))
            conn.execute(
                "INSERT INTO tenants (id, name) VALUES (%s, 'n') ON CONFLICT DO NOTHING",
                (f"new-{name}",),
            )


def _seed(url: str, keys: list[tuple[str, int]]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE tenants, projects, api_keys, budget_rules CASCADE")
        conn.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'Acme')")
        conn.execute("INSERT INTO projects (id, tenant_id, name) VALUES ('acme/chat', 'acme', 'c')")
        for name, second in keys:
            conn.execute(_KEY, (f"old-{name}", name, T0 + timedelta(seconds=second)))
            conn.execute(_RULE, (f"old-{name}", T0 + timedelta(seconds=second)))
            conn.execute("INSERT INTO tenants (id, name) VALUES (%s, 'o')", (f"old-{name}",))


def _check(seen: list[dict[str, Any]], start: set[str], key: Any) -> None:
    ids = [row["id"] for row in seen]
    assert len(ids) == len(set(ids)), "a row was shown twice"
    assert set(ids) >= start, "a row there from the start was never shown"
    orders = [key(row) for row in seen]
    assert orders == sorted(orders)


async def test_every_row_is_seen_once_across_pages_while_rows_arrive(
    start_apiserver: ApiserverFactory, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    control_plane_url = await start_apiserver(database_url=postgres_url)
    ids = st.text("abcdefghij", min_size=1, max_size=4)
    loop = asyncio.get_running_loop()

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        keys=st.lists(st.tuples(ids, st.integers(0, 4)), unique_by=lambda k: k[0], max_size=25),
        steps=st.lists(_step(), min_size=1, max_size=5),
    )
    def check(keys: list[tuple[str, int]], steps: list[tuple[int, list[tuple[str, int]]]]) -> None:
        asyncio.run_coroutine_threadsafe(_example(keys, steps), loop).result()

    async def _example(
        keys: list[tuple[str, int]], steps: list[tuple[int, list[tuple[str, int]]]]
    ) -> None:
        await asyncio.to_thread(_seed, postgres_url, keys)
        async with httpx.AsyncClient(headers=admin_headers, base_url=control_plane_url) as http:
            listed = await _pages(http, "/api/v1/keys", steps, postgres_url)
            _check(listed, {f"old-{k}" for k, _ in keys}, lambda r: (r["createdAt"], r["id"]))
            await asyncio.to_thread(_seed, postgres_url, keys)
            tenants = await _pages(http, "/api/v1/tenants", steps, postgres_url)
            _check(tenants, {"acme", *(f"old-{k}" for k, _ in keys)}, lambda r: r["id"])
            await asyncio.to_thread(_seed, postgres_url, keys)
            rules = await _pages(http, "/api/v1/budget-rules", steps, postgres_url)
            _check(rules, {f"old-{k}" for k, _ in keys}, lambda r: (r["createdAt"], r["id"]))

    await asyncio.to_thread(check)


def _cursor(values: object) -> str:
    return base64.urlsafe_b64encode(repr(values).encode()).decode()


BAD = [
    ("limit", "0"),
    ("limit", "501"),
    ("limit", "-1"),
    ("limit", "ten"),
    ("limit", "1" * 40),
    ("after", "%%%"),
    ("after", "not-a-cursor"),
    ("after", paging.cursor(["a", "b", "c"])),  # the wrong shape for every list here
    ("after", paging.cursor(["2026-13-45T00:00:00Z", "k"])),
    ("after", paging.cursor(["-infinity", "k"])),  # keys, models, credentials: not a time
    ("after", paging.cursor(["x\x00y"])),
    ("after", _cursor({"id": 1})),
    ("after", "a" * 5000),
]


@pytest.mark.parametrize(
    "path", ["/api/v1/tenants", "/api/v1/projects", "/api/v1/keys", "/api/v1/models",
             "/api/v1/cost-rates", "/api/v1/cost-periods", "/api/v1/credentials",
             "/api/v1/budget-rules", "/api/v1/inventory"],
)  # fmt: skip
async def test_a_bad_limit_or_cursor_is_a_400_naming_it(
    path: str,
    start_apiserver: ApiserverFactory,
    postgres_url: str,
    admin_headers: dict[str, str],
) -> None:
    control_plane_url = await start_apiserver(database_url=postgres_url)
    async with httpx.AsyncClient(headers=admin_headers, base_url=control_plane_url) as http:
        for name, value in BAD:
            error = envelope(await http.get(path, params={name: value}), 400)
            assert error["param"] == name, (path, name, value)
        assert (await http.get(path, params={"limit": "500"})).status_code == 200


async def test_a_page_of_a_list_that_fits_keeps_the_old_shape(
    control_plane_url: str, admin_headers: dict[str, str]
) -> None:
    """Without a database too (credentials in memory): two pages, then the old shape."""
    async with httpx.AsyncClient(headers=admin_headers, base_url=control_plane_url) as http:
        for n in range(3):
            body = {"role": "finance", "label": f"f{n}"}
            assert (await http.post("/api/v1/credentials", json=body)).status_code == 201
        first = (await http.get("/api/v1/credentials", params={"limit": "2"})).json()
        assert len(first["data"]) == 2
        rest = await http.get("/api/v1/credentials", params={"after": first["next"]})
        assert set(rest.json()) == {"object", "data"}  # no next: the last page
        ids = [c["id"] for c in first["data"] + rest.json()["data"]]
        assert len(ids) == len(set(ids)) == 4  # the bootstrap admin and three more


async def test_every_cluster_is_seen_once_across_pages_while_clusters_report(
    control_plane_url: str, admin_headers: dict[str, str]
) -> None:
    """The Cluster page's list (one summary per cluster) pages by cluster id, in memory and on
    Postgres, while other clusters report their first inventory between pages."""
    loop, runs = asyncio.get_running_loop(), iter(range(10_000))
    names = st.text("abcdefghij", min_size=1, max_size=4)

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        first=st.lists(names, unique=True, max_size=12),
        steps=st.lists(_step(), min_size=1, max_size=4),
    )
    def check(first: list[str], steps: list[tuple[int, list[tuple[str, int]]]]) -> None:
        asyncio.run_coroutine_threadsafe(_example(first, steps), loop).result()

    async def _example(first: list[str], steps: list[tuple[int, list[tuple[str, int]]]]) -> None:
        run = f"r{next(runs)}"
        async with httpx.AsyncClient(headers=admin_headers, base_url=control_plane_url) as http:

            async def put(cluster: str) -> None:
                body = report(clusterId=cluster, deployments=[])  # nodes only: no binding
                assert (await http.put("/api/v1/inventory", json=body)).status_code == 200

            async def arrive(inserts: list[tuple[str, int]]) -> None:
                for name, _ in inserts:
                    await put(f"{run}-new-{name}")

            for name in first:
                await put(f"{run}-old-{name}")
            seen = await _walk(http, "/api/v1/inventory", steps, arrive)
        rows = [{**c, "id": c["clusterId"]} for c in seen]
        _check(rows, {f"{run}-old-{name}" for name in first}, lambda r: r["id"])

    await asyncio.to_thread(check)


async def test_tenants_and_projects_are_searched_by_id_or_name_on_the_server(
    start_apiserver: ApiserverFactory, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    """The create forms' pickers: ``q`` is a case-insensitive substring of the id or the name,
    paged like the whole list; a ``q`` too long or with a control character is a 400."""
    control_plane_url = await start_apiserver(database_url=postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("TRUNCATE tenants, projects CASCADE")
        for tenant, name in [("acme", "Acme"), ("beta", "ACME Beta"), ("gamma", "G"),
                             ("delta", "50%_off")]:  # fmt: skip
            conn.execute("INSERT INTO tenants (id, name) VALUES (%s, %s)", (tenant, name))
            conn.execute(
                "INSERT INTO projects (id, tenant_id, name)"
                " VALUES (%s, %s, 'chat'), (%s, %s, 'acmebot')",
                (f"{tenant}/chat", tenant, f"{tenant}/acmebot", tenant),
            )
    async with httpx.AsyncClient(headers=admin_headers, base_url=control_plane_url) as http:

        async def ids(path: str, **query: str) -> list[str]:
            listed = await _walk(http, path, [(1, [])], _nothing, **query)
            return [row["id"] for row in listed]

        assert await ids("/api/v1/tenants", q="AcM") == ["acme", "beta"]
        assert await ids("/api/v1/tenants", q="%") == ["delta"]  # no LIKE wildcards
        assert await ids("/api/v1/tenants", q="_") == ["delta"]
        assert await ids("/api/v1/tenants", q="nothing") == []
        assert await ids("/api/v1/projects", q="BOT") == [
            "acme/acmebot", "beta/acmebot", "delta/acmebot", "gamma/acmebot"
        ]  # fmt: skip
        assert await ids("/api/v1/projects", q="gamma/") == ["gamma/acmebot", "gamma/chat"]
        assert await ids("/api/v1/projects", q="chat", tenantId="beta") == ["beta/chat"]
        for path in ("/api/v1/tenants", "/api/v1/projects"):
            for bad in ("a" * (paging.MAX_SEARCH + 1), "a\x00", "a\nb"):
                error = envelope(await http.get(path, params={"q": bad}), 400)
                assert error["param"] == "q"
            assert (await http.get(path, params={"q": "a" * paging.MAX_SEARCH})).status_code == 200


async def _nothing(inserts: list[tuple[str, int]]) -> None:
    assert not inserts
