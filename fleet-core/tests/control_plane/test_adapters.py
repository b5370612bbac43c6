"""LoRA adapters in the inventory (ADR 0028): each adapter name is a routing name, so a cluster
may report only the adapters its binding names, and discovery hands the gateway each admitted
adapter with its position in the deployment (llama-server's id for it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fleet_contract
from fleet_core.control_plane.inventory import bindings, service
from fleet_core.shared.errors import PermissionDenied

from .conftest import bind, envelope, issue
from .test_auth import as_
from .test_cluster_binding import endpoints, hostile

pytestmark = pytest.mark.timeout(60)

URL = "http://10.42.0.9:8080"


def with_adapters(*names: str, model: str = "gemma") -> dict[str, Any]:
    doc = hostile(URL, model)
    doc["deployments"][0]["adapters"] = list(names)
    return doc


async def test_an_adapter_outside_the_binding_is_refused_like_a_served_name(
    admin: httpx.AsyncClient,
) -> None:
    await bind(admin, "c1", ("gemma", "pirate"), ("10.42.0.0/16",))
    async with as_(admin, await issue(admin, "operator", clusterId="c1")) as c1:
        refused = envelope(
            await c1.put("/api/v1/inventory", json=with_adapters("pirate", "x")), 403
        )
        assert (refused["code"], refused["param"]) == (
            "outside_binding",
            "deployments[0].adapters[1]",
        )
        assert "'x'" in refused["message"]
        accepted = await c1.put("/api/v1/inventory", json=with_adapters("pirate"))
        assert accepted.status_code == 200, accepted.text
    # Stored with the report, and handed to the gateways with its id.
    stored = (await admin.get("/api/v1/clusters/c1")).json()["report"]
    assert stored["deployments"][0]["adapters"] == ["pirate"]
    (model,) = (await endpoints(admin))["models"]
    assert model["servedModelName"] == "gemma"
    assert model["adapters"] == [{"name": "pirate", "index": 0}]
    assert [e["url"] for e in model["endpoints"]] == [URL]


async def test_narrowing_the_binding_drops_an_adapter_and_keeps_the_others_ids(
    admin: httpx.AsyncClient,
) -> None:
    await bind(admin, "c1", ("gemma", "pirate", "poet"), ("10.42.0.0/16",))
    async with as_(admin, await issue(admin, "operator", clusterId="c1")) as c1:
        put = await c1.put("/api/v1/inventory", json=with_adapters("pirate", "poet"))
        assert put.status_code == 200, put.text
    await bind(admin, "c1", ("gemma", "poet"), ("10.42.0.0/16",))
    (model,) = (await endpoints(admin))["models"]
    assert model["adapters"] == [{"name": "poet", "index": 1}]  # still llama-server's id 1


def test_deployments_of_one_name_with_other_adapters_stay_apart() -> None:
    """Two namespaces of one cluster serving ``gemma``, one with an adapter: its endpoints
    alone may answer for the adapter (the others would answer with the base's weights)."""
    doc = with_adapters("pirate")
    plain = {**doc["deployments"][0], "name": "other", "adapters": [],
             "endpoints": [{"url": "http://10.42.0.10:8080", "ready": True}]}  # fmt: skip
    doc["deployments"].append(plain)
    report = fleet_contract.decode_report(json.dumps(doc).encode())
    binding = bindings.Binding(cluster_id="c1", served_models=["gemma", "pirate"],
                               endpoints=["10.42.0.0/16"], updated_at=datetime.now(UTC),
                               updated_by="admin")  # fmt: skip
    entries = service.endpoints_document([report], {"c1": binding}).models
    found = {
        (tuple(a.name for a in m.adapters), tuple(e.url for e in m.endpoints)) for m in entries
    }
    assert found == {((), ("http://10.42.0.10:8080",)), (("pirate",), (URL,))}


_names = st.sampled_from(["gemma", "pirate", "poet", "Qwen/x"])


@given(
    listed=st.lists(_names, max_size=4),
    models=st.lists(_names, max_size=4),
)
def test_no_adapter_outside_a_binding_is_accepted_or_discovered(
    listed: list[str], models: list[str]
) -> None:
    """Whatever adapters a report lists: refused, or each is inside the binding; discovery
    offers only adapters the binding names, each with its position in the report."""
    report = fleet_contract.decode_report(json.dumps(with_adapters(*listed)).encode())
    binding = bindings.Binding(cluster_id="c1", served_models=models, endpoints=["10.42.0.0/16"],
                               updated_at=datetime.now(UTC), updated_by="admin")  # fmt: skip
    for model in service.endpoints_document([report], {"c1": binding}).models:
        for adapter in model.adapters:
            assert adapter.name in models
            assert listed[adapter.index] == adapter.name
    if "gemma" in models and set(listed) <= set(models):
        bindings.check_report(report, binding)
        return
    with pytest.raises(PermissionDenied) as refused:
        bindings.check_report(report, binding)
    assert (refused.value.param or "").startswith("deployments[0].")
