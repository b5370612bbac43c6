"""Keys, two-level limits reserved then settled (P5), refusals, metrics and CORS at the gateway.

The limit behaviour runs twice, against process memory and against a real Redis, because both
stores must behave the same.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet_core.gateway.settings import admission_from_env
from fleet_core.shared.errors import ConfigError
from fleet_testing.fix_redis_process import RedisProcess
from fleet_testing.waiting import eventually

from .conftest import GatewayFactory, StubFactory

ACME_A = "acme/research/team-a"
ACME_B = "acme/batch/worker"
GLOBEX = "globex/main/k1"
KEYS = f"{ACME_A};{ACME_B};{GLOBEX}"
MSG = [{"role": "user", "content": "hello there"}]
SCRAPE = "scrape-secret-of-at-least-32-characters"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"FLEET_AUTH_REQUIRED": "true"}, "FLEET_API_KEYS is empty"),
        ({"FLEET_API_KEYS": ACME_A}, "FLEET_AUTH_REQUIRED is not true"),
        ({"FLEET_AUTH_REQUIRED": "true", "FLEET_API_KEYS": "acme/research"}, "not tenant/project"),
        (
            {"FLEET_AUTH_REQUIRED": "true", "FLEET_API_KEYS": f"{ACME_A}|rpm=5"},
            "FLEET_RATE_TENANTS",
        ),
        (
            {"FLEET_RATE_TENANTS": "acme|rpm=10", "FLEET_RATE_PROJECTS": "acme/x|rpm=11"},
            "above tenant acme's rpm=10",
        ),
        ({"FLEET_RATE_TPM": "100", "FLEET_RATE_PROJECTS": "acme/x|tpm=200"}, "tpm=100"),
        ({"FLEET_RATE_TENANTS": "acme|rpm=0"}, "not a positive integer"),
        ({"FLEET_RATE_TENANTS": "acme|rpm=ten"}, "not a positive integer"),
        ({"FLEET_RATE_TENANTS": "acme|rpm=1.5"}, "not a positive integer"),
        ({"FLEET_RATE_TENANTS": "acme|qps=3"}, "not rpm=N or tpm=N"),
        ({"FLEET_RATE_RPM": "-4"}, "FLEET_RATE_RPM"),
        ({"FLEET_DEFAULT_MAX_TOKENS": "0"}, "FLEET_DEFAULT_MAX_TOKENS"),
        ({"FLEET_RATE_PROJECTS": "research|rpm=5"}, "is not tenant/project"),
        ({"FLEET_RATE_ON_STORE_ERROR": "maybe"}, "FLEET_RATE_ON_STORE_ERROR"),
    ],
)
def test_configurations_that_cannot_work_are_refused(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        admission_from_env(env)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert "team-a" not in message  # a key never reaches an error line


def test_a_project_within_an_undeclared_dimension_is_fine() -> None:
    settings = admission_from_env(
        {"FLEET_RATE_TENANTS": "acme|rpm=10", "FLEET_RATE_PROJECTS": "acme/x|rpm=10,tpm=999999"}
    )
    assert settings.policy.projects["acme/x"].tpm == 999999


@pytest.fixture(params=["memory", "redis"])
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "memory":
        return {}
    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    return {"FLEET_REDIS_URL": url, "FLEET_REDIS_PREFIX": prefix}


@pytest.fixture
def limited(
    start_stub: StubFactory, start_gateway: GatewayFactory, store_env: dict[str, str]
) -> Any:
    async def start(**env: str) -> Any:
        engine = await start_stub(model="m")
        admission = admission_from_env(
            {"FLEET_AUTH_REQUIRED": "true", "FLEET_API_KEYS": KEYS, **store_env, **env}
        )
        return await start_gateway(
            {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}, admission=admission
        )

    return start


async def chat(gw: Any, key: str | None, **body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient() as http:
        return await http.post(
            f"{gw.url}/v1/chat/completions",
            headers=headers,
            json={"model": "m", "messages": MSG, **body},
        )


async def test_missing_and_unknown_keys_are_401(limited: Any) -> None:
    gw = await limited()
    for key in (None, "acme/research/nope", ACME_A + "x"):
        response = await chat(gw, key)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["type"] == "authentication_error"
        assert "team-a" not in response.text
    assert (await chat(gw, ACME_A)).status_code == 200
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{gw.url}/healthz")).status_code == 200
        health = await http.get(f"{gw.url}/health")
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}  # no engine URLs for anyone
        assert "http" not in health.text
        keyed = await http.get(f"{gw.url}/health", headers={"Authorization": f"Bearer {GLOBEX}"})
        assert set(keyed.json()) == {"status"}  # nor for a tenant's key
        ready = await http.get(f"{gw.url}/readyz")
        assert set(ready.json()) == {"status"}
        assert (await http.get(f"{gw.url}/v1/models")).status_code == 401
        models = await http.get(
            f"{gw.url}/v1/models", headers={"Authorization": f"Bearer {GLOBEX}"}
        )
        assert models.status_code == 200


async def test_of_two_authorization_headers_the_first_counts(limited: Any) -> None:
    gw = await limited()
    body = {"model": "m", "messages": MSG}
    async with httpx.AsyncClient() as http:
        for keys, status in (((ACME_A, "nope/x/y"), 200), (("nope/x/y", ACME_A), 401)):
            headers = [("Authorization", f"Bearer {key}") for key in keys]
            response = await http.post(f"{gw.url}/v1/chat/completions", headers=headers, json=body)
            assert response.status_code == status, keys


async def test_tenant_rpm_is_shared_by_its_keys_and_spares_other_tenants(limited: Any) -> None:
    gw = await limited(FLEET_RATE_TENANTS="acme|rpm=3;globex|rpm=3")
    statuses = [(await chat(gw, key)).status_code for key in (ACME_A, ACME_B, ACME_A)]
    assert statuses == [200, 200, 200]
    refused = await chat(gw, ACME_B)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert "tenant 'acme' rpm" in error["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 20  # 1 of 3 per minute refills in 20 s
    assert (await chat(gw, GLOBEX)).status_code == 200


async def test_project_partition_bites_inside_the_envelope(limited: Any) -> None:
    gw = await limited(FLEET_RATE_TENANTS="acme|rpm=10", FLEET_RATE_PROJECTS="acme/research|rpm=2")
    assert [(await chat(gw, ACME_A)).status_code for _ in range(2)] == [200, 200]
    refused = await chat(gw, ACME_A)
    assert refused.status_code == 429
    assert "project 'acme/research' rpm" in refused.json()["error"]["message"]
    assert (await chat(gw, ACME_B)).status_code == 200  # a sibling project has no limit of its own


async def test_the_token_limit_bites_before_the_request_limit(limited: Any) -> None:
    # 191 reserved (31 prompt, the upper estimate of the message, + 160); about 14 used
    gw = await limited(FLEET_RATE_TENANTS="acme|rpm=100,tpm=200")
    assert (await chat(gw, ACME_A, max_tokens=160)).status_code == 200
    refused = await chat(gw, ACME_A, max_tokens=160)
    assert refused.status_code == 429
    assert "tpm" in refused.json()["error"]["message"]


async def test_settlement_refunds_what_was_not_used(limited: Any) -> None:
    # Each request reserves 3 prompt + 150 tokens but uses 3 + 11: without the refund the
    # second could not fit in 200; with it, it does.
    gw = await limited(FLEET_RATE_TENANTS="acme|tpm=200")
    assert (await chat(gw, ACME_A, max_tokens=150)).status_code == 200
    await asyncio.sleep(0.3)  # settlement runs after the response, in the background
    assert (await chat(gw, ACME_A, max_tokens=150)).status_code == 200


async def test_a_client_that_leaves_is_settled_on_what_was_relayed(
    start_stub: StubFactory, start_gateway: GatewayFactory, store_env: dict[str, str]
) -> None:
    # 111 reserved (31 prompt, the upper estimate of the message, + 80); the full reply would
    # use 63 (the engine's count), leaving a level of 97, too little for the next 111. Leaving
    # after two words uses about 41 (the gateway's upper estimate), and the next one fits.
    engine = await start_stub(model="m", token_delay_ms=50, reply=" ".join(["word"] * 60))
    admission = admission_from_env(
        {
            "FLEET_AUTH_REQUIRED": "true",
            "FLEET_API_KEYS": KEYS,
            "FLEET_RATE_TENANTS": "acme|tpm=160",
            **store_env,
        }
    )
    gw = await start_gateway(
        {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}, admission=admission
    )
    async with (
        httpx.AsyncClient() as http,
        http.stream(
            "POST",
            f"{gw.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {ACME_A}"},
            json={"model": "m", "messages": MSG, "stream": True, "max_tokens": 80},
        ) as response,
    ):
        frames = 0
        async for line in response.aiter_lines():
            frames += line.startswith("data:")
            if frames == 3:
                break
    await asyncio.sleep(0.5)  # the gateway notices, records and settles
    assert (await chat(gw, ACME_A, max_tokens=80)).status_code == 200


async def test_a_reservation_that_can_never_fit_is_400(limited: Any) -> None:
    gw = await limited(FLEET_RATE_TENANTS="acme|tpm=1000")
    response = await chat(gw, ACME_A, max_tokens=5000)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"
    assert response.json()["error"]["code"] == "reservation_exceeds_capacity"


async def test_the_default_max_tokens_is_what_an_unbounded_request_reserves(limited: Any) -> None:
    gw = await limited(FLEET_RATE_TENANTS="acme|tpm=1000", FLEET_DEFAULT_MAX_TOKENS="2000")
    assert (await chat(gw, ACME_A)).status_code == 400
    assert (await chat(gw, ACME_A, max_tokens=100)).status_code == 200


def metric_samples(text: str) -> list[Any]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


async def test_metrics_need_the_metrics_credential_and_attribute_usage(limited: Any) -> None:
    """A tenant's key reads no other tenant's series: /metrics is 403 for it."""
    gw = await limited(FLEET_METRICS_TOKEN=SCRAPE)
    assert (await chat(gw, ACME_A)).status_code == 200
    async with httpx.AsyncClient() as http:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=GLOBEX, max_retries=0)
        await client.embeddings.create(model="m", input="embed these words")
        await client.close()
        assert (await http.get(f"{gw.url}/metrics")).status_code == 401
        by_token = await http.get(
            f"{gw.url}/metrics", headers={"Authorization": f"Bearer {SCRAPE}"}
        )
        by_key = await http.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {ACME_B}"})
    assert by_token.status_code == 200
    async with httpx.AsyncClient() as http:
        detail = await http.get(f"{gw.url}/health", headers={"Authorization": f"Bearer {SCRAPE}"})
    assert detail.json()["upstreams"]["m"]["endpoints"][0]["url"].startswith("http://127.0.0.1")
    assert by_key.status_code == 403
    assert by_key.json()["error"]["type"] == "permission_error"
    assert "fleet_requests_total" not in by_key.text
    assert by_token.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = metric_samples(by_token.text)
    for sample in samples:
        for value in sample.labels.values():
            assert "team-a" not in value
            assert "/" not in value or value.startswith("http")  # endpoint URLs only
    served = [
        s for s in samples if s.name == "fleet_requests_total" and s.labels["tenant"] == "acme"
    ]
    assert served
    assert served[0].labels["project"] == "research"
    output = {
        s.labels["tenant"]: s.value
        for s in samples
        if s.name == "fleet_tokens_total" and s.labels["side"] == "output"
    }
    assert output["acme"] > 0
    assert "globex" not in output  # the embedding spent no completion tokens


async def test_cors_allows_loopback_origins_only(limited: Any) -> None:
    gw = await limited()
    async with httpx.AsyncClient() as http:
        for origin, allowed in (
            ("http://127.0.0.1:5173", True),
            ("http://localhost:8081", True),
            ("https://evil.example", False),
        ):
            preflight = await http.options(
                f"{gw.url}/v1/chat/completions",
                headers={
                    "Origin": origin,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization,content-type",
                },
            )
            got = preflight.headers.get("access-control-allow-origin")
            assert (got == origin) is allowed, (origin, preflight.status_code, got)
            if allowed:
                assert preflight.status_code == 200
                assert "POST" in preflight.headers["access-control-allow-methods"]
            simple = await http.get(f"{gw.url}/healthz", headers={"Origin": origin})
            assert ("access-control-allow-origin" in simple.headers) is allowed


async def test_extra_cors_origins_are_configurable(
    start_stub: StubFactory, start_gateway: GatewayFactory
) -> None:
    engine = await start_stub(model="m")
    admission = admission_from_env({"FLEET_CORS_ORIGINS": "https://console.example.com"})
    gw = await start_gateway(
        {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}, admission=admission
    )
    async with httpx.AsyncClient() as http:
        response = await http.get(
            f"{gw.url}/healthz", headers={"Origin": "https://console.example.com"}
        )
    assert response.headers["access-control-allow-origin"] == "https://console.example.com"


@pytest.mark.parametrize("mode", ["closed", "open"])
async def test_redis_outage_and_recovery(
    start_stub: StubFactory, start_gateway: GatewayFactory, own_redis: RedisProcess, mode: str
) -> None:
    engine = await start_stub(model="m")
    admission = admission_from_env(
        {
            "FLEET_AUTH_REQUIRED": "true",
            "FLEET_API_KEYS": KEYS,
            "FLEET_RATE_TENANTS": "acme|rpm=1000,tpm=100000",
            "FLEET_REDIS_URL": own_redis.url,
            "FLEET_RATE_ON_STORE_ERROR": mode,
            "FLEET_METRICS_TOKEN": SCRAPE,
        }
    )
    gw = await start_gateway(
        {"upstreams": [{"id": "a", "model": "m", "base_url": engine.url}]}, admission=admission
    )
    assert (await chat(gw, ACME_A)).status_code == 200
    own_redis.stop()
    during = await chat(gw, ACME_A)
    if mode == "closed":
        assert during.status_code == 503
        assert during.json()["error"]["code"] == "rate_limiter_unavailable"
    else:
        assert during.status_code == 200
    async with httpx.AsyncClient() as http:
        scrape = await http.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {SCRAPE}"})
    errors = [
        s.value
        for s in metric_samples(scrape.text)
        if s.name == "fleet_rate_limiter_store_errors_total"
    ]
    assert errors
    assert errors[0] >= 1
    async with httpx.AsyncClient() as http:
        ready = await http.get(f"{gw.url}/readyz")
        replica = await http.get(f"{gw.url}/readyz", params={"exclude": "endpoints"})
    assert ready.status_code == (503 if mode == "closed" else 200)
    assert replica.status_code == ready.status_code  # the probe still sees its own Redis
    own_redis.start()  # empty: the buckets refill from now (ADR 0023), never a 503 again
    first = await chat(gw, ACME_A)
    assert first.status_code in (200, 429), first.text
    assert first.status_code == 200 or int(first.headers["Retry-After"]) <= 60

    async def served() -> bool:
        return (await chat(gw, ACME_A)).status_code == 200

    await eventually(served, within=60, what="served once the buckets refilled")
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{gw.url}/readyz")).status_code == 200
