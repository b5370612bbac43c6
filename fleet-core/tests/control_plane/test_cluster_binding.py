"""A compromised cluster steers only its own cluster: the admin's binding (ADR 0020).

An operator credential for cluster ``c1`` used to route any served model name to any URL: a report
listing ``Qwen/Qwen2.5-7B-Instruct`` at an address of its choosing reached every gateway within
seconds, with the engine key and then tenants' prompts. Now the admin binds a cluster to the names
it may serve and the addresses its endpoints may have; a report outside is refused naming the
field, every report (accepted or refused) leaves an audit event, and a cluster without a binding
serves nothing. The gateway's view of it is in ``tests/gateway/test_engine_key.py``; the hostile
operator on the real Kubernetes path in fleet-serving's ``test_hostile_operator_e2e.py``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fleet_contract
from fleet_core.control_plane.inventory import bindings, service
from fleet_core.shared.errors import InvalidRequest, PermissionDenied

from .conftest import bind, envelope, issue
from .test_auth import as_
from .test_inventory import report

pytestmark = pytest.mark.timeout(60)

QWEN = "Qwen/Qwen2.5-7B-Instruct"


def hostile(url: str = "http://203.0.113.7:8000", model: str = QWEN) -> dict[str, Any]:
    """Cluster c1's report, now, naming ``model`` at ``url``."""
    doc = report(clusterId="c1", observedAt=datetime.now(UTC).isoformat())
    doc["deployments"] = [{**doc["deployments"][0], "servedModelName": model,
                           "endpoints": [{"url": url, "ready": True}]}]  # fmt: skip
    return doc


async def endpoints(admin: httpx.AsyncClient) -> dict[str, Any]:
    async with as_(admin, await issue(admin, "gateway")) as gateway:
        body: dict[str, Any] = (await gateway.get("/api/v1/endpoints")).json()
    return body


async def test_an_operator_cannot_route_a_model_or_an_address_outside_its_binding(
    admin: httpx.AsyncClient,
) -> None:
    operator = await issue(admin, "operator", clusterId="c1")
    async with as_(admin, operator) as c1:
        # No binding: closed. The report names the field and the way out.
        closed = envelope(await c1.put("/api/v1/inventory", json=hostile()), 403)
        assert closed["code"] == "outside_binding"
        assert closed["param"] == "deployments[0].servedModelName"
        assert "PUT /api/v1/clusters/{id}/binding" in closed["message"]
        await bind(admin, "c1", ("gemma-270m",), ("10.42.0.0/16",))
        taken = envelope(await c1.put("/api/v1/inventory", json=hostile()), 403)
        assert taken["param"] == "deployments[0].servedModelName"
        own_name = hostile(model="gemma-270m")
        elsewhere = envelope(await c1.put("/api/v1/inventory", json=own_name), 403)
        assert elsewhere["param"] == "deployments[0].endpoints[0].url"
        inside = await c1.put(
            "/api/v1/inventory", json=hostile("http://10.42.0.9:8000", "gemma-270m")
        )
        assert inside.status_code == 200, inside.text
    (model,) = (await endpoints(admin))["models"]
    assert (model["servedModelName"], model["clusterId"]) == ("gemma-270m", "c1")
    assert [e["url"] for e in model["endpoints"]] == ["http://10.42.0.9:8000"]
    # Reports are audited, accepted and refused, against the cluster, with the refused field.
    trail = (await admin.get("/api/v1/audit-events")).json()["data"]
    reports = [(e["action"], e["status"]) for e in trail if e["target"] == "/api/v1/clusters/c1"]
    assert reports == [
        ("report", 200),
        ("report refused: outside_binding deployments[0].endpoints[0].url", 403),
        ("report refused: outside_binding deployments[0].servedModelName", 403),
        ("report refused: outside_binding deployments[0].servedModelName", 403),
    ]
    assert {e["actorRole"] for e in trail if e["target"] == "/api/v1/clusters/c1"} == {"operator"}


async def test_the_binding_is_the_admins_and_narrowing_it_takes_endpoints_out_at_once(
    admin: httpx.AsyncClient,
) -> None:
    bound = await bind(admin, "c1", ("gemma-270m", QWEN), ("10.42.0.0/16", "*.svc.cluster.local"))
    assert bound["servedModels"] == sorted(["gemma-270m", QWEN])
    assert bound["updatedBy"] == "cred_bootstrap_admin"
    operator = await issue(admin, "operator", clusterId="c1")
    async with as_(admin, operator) as c1:
        grant = {"servedModels": [QWEN], "endpoints": []}  # an operator may not bind itself
        envelope(await c1.put("/api/v1/clusters/c1/binding", json=grant), 403)
        named = hostile("http://qwen.models.svc.cluster.local:8000")
        assert (await c1.put("/api/v1/inventory", json=named)).status_code == 200
    assert len((await endpoints(admin))["models"]) == 1
    await bind(admin, "c1", ("gemma-270m",), ("10.42.0.0/16",))  # the admin changes their mind
    assert (await endpoints(admin))["models"] == []
    assert (await admin.get("/api/v1/clusters/c1/binding")).json()["servedModels"] == ["gemma-270m"]
    assert (await admin.delete("/api/v1/clusters/c1/binding")).status_code == 200
    envelope(await admin.get("/api/v1/clusters/c1/binding"), 404)
    bad = {"servedModels": [QWEN], "endpoints": ["10.42.0.1/8"]}  # host bits set: a typo
    assert envelope(await admin.put("/api/v1/clusters/c1/binding", json=bad), 400)["param"] == (
        "endpoints[0]"
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://10.42.0.9@203.0.113.7:8000",  # credentials: the host is what follows the @
        "http://10.42.0.9:8000/v1/../../elsewhere",
        "http://10.42.0.9:8000/?next=http://203.0.113.7",
        "file:///etc/passwd",
        "http://10.42.0.9.nip.io:8000",
        "http://[::ffff:203.0.113.7]:8000",
        "http://10.42.0.9:99999",
    ],
)
def test_an_endpoint_is_only_a_plain_base_url_on_a_bound_address(url: str) -> None:
    patterns = bindings.parse_patterns(["10.42.0.0/16"])
    assert bindings.allows_endpoint(patterns, "http://10.42.0.9:8000/")
    assert not bindings.allows_endpoint(patterns, url)


_hosts = st.sampled_from(["10.42.0.9", "10.43.1.1", "203.0.113.7", "a.svc.cluster.local", "evil"])
_names = st.sampled_from(["gemma-270m", QWEN, "tiny"])


@settings(max_examples=200, deadline=None)
@given(
    listed=st.lists(st.tuples(_names, st.lists(_hosts, max_size=3)), max_size=4),
    models=st.lists(_names, max_size=3),
    patterns=st.lists(st.sampled_from(["10.42.0.0/16", "*.svc.cluster.local"]), max_size=2),
    bound=st.booleans(),
)
def test_nothing_outside_a_binding_is_accepted_or_discovered(
    listed: list[tuple[str, list[str]]], models: list[str], patterns: list[str], bound: bool
) -> None:
    """Whatever a report lists, either it is refused, or everything it lists is inside the
    binding; and discovery never offers what the binding does not allow, accepted or not."""
    doc = hostile()
    doc["deployments"] = [
        {**doc["deployments"][0], "servedModelName": name,
         "endpoints": [{"url": f"http://{h}:8000", "ready": True} for h in hosts]}
        for name, hosts in listed
    ]  # fmt: skip
    decoded = fleet_contract.decode_report(fleet_contract.encode_report(
        fleet_contract.decode_report(json.dumps(doc).encode())))  # fmt: skip
    now = datetime.now(UTC)
    binding = bindings.Binding(cluster_id="c1", served_models=models, endpoints=patterns,
                               updated_at=now, updated_by="admin") if bound else None  # fmt: skip
    compiled = bindings.parse_patterns(patterns)
    offered = service.endpoints_document([decoded], {"c1": binding} if binding else {})
    for model in offered.models:
        assert binding is not None
        assert model.served_model_name in binding.served_models
        assert all(bindings.allows_endpoint(compiled, e.url) for e in model.endpoints)
    try:
        bindings.check_report(decoded, binding)
    except PermissionDenied:
        return
    assert binding is not None or not decoded.deployments
    for deployment in decoded.deployments:
        assert binding is not None
        assert deployment.served_model_name in binding.served_models
        assert all(bindings.allows_endpoint(compiled, e.url) for e in deployment.endpoints)


async def test_report_times_are_the_control_planes_clock_not_the_operators(
    control_plane_url: str, admin_headers: dict[str, str]
) -> None:
    """A report dated a year ahead froze discovery (no later report was ever newer); one dated
    far behind the cluster's newest rewrote history. Both are 400 naming observedAt."""
    now = datetime.now(UTC)
    async with httpx.AsyncClient(base_url=control_plane_url, headers=admin_headers) as http:
        await bind(http)

        async def put(at: datetime) -> httpx.Response:
            return await http.put("/api/v1/inventory", json=report(observedAt=at.isoformat()))

        ahead = envelope(await put(now + timedelta(days=365)), 400)
        assert (ahead["param"], ahead["code"]) == ("observedAt", "observed_at_out_of_range")
        assert (await put(now + timedelta(seconds=30))).status_code == 200  # a little skew
        assert (await put(now - timedelta(minutes=10))).status_code == 200  # a late heartbeat
        envelope(await put(now - timedelta(hours=2)), 400)
        assert (await put(now + timedelta(seconds=60))).status_code == 200  # the clock moves on


def test_the_time_bounds_are_pure() -> None:
    now = datetime(2026, 10, 1, 12, tzinfo=UTC)
    doc = fleet_contract.decode_report(
        json.dumps(report(observedAt="2026-09-30T23:59:59Z")).encode()
    )
    service.check_time(doc, now=now, newest=None, closed_until=None)
    with pytest.raises(InvalidRequest, match="closed cost period"):
        service.check_time(
            doc, now=now, newest=None, closed_until=datetime(2026, 10, 1, tzinfo=UTC)
        )
