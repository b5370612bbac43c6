"""PUT /api/v1/inventory and what is read back: summaries, clusters, the gateway's endpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg

from .conftest import bind

CONTRACT_FIXTURES = Path(__file__).parents[3] / "contract" / "tests" / "fixtures"


def report(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CONTRACT_FIXTURES / "v1-full.json").read_text())
    doc.update(changes)
    return doc


async def test_a_report_is_summarized_from_its_nodes(
    control_plane_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers) as http:
        await bind(http, base=control_plane_url)
        put = await http.put(f"{control_plane_url}/api/v1/inventory", json=report(totalGpus=999))
        assert put.status_code == 200, put.text
        summary = put.json()
        # 8 H100 + 1 A100 (MIG) on the nodes; a "totalGpus" claim in the body is ignored
        assert summary["gpus"] == 9
        assert summary["gpusByProduct"] == {"NVIDIA-H100-80GB-HBM3": 8, "NVIDIA-A100-SXM4-40GB": 1}
        assert summary["readyNodes"] == 2
        assert summary["schedulableNodes"] == 2
        assert summary["gpusOnReadyNodes"] == 9
        assert summary["migSlices"] == {"1g.5gb": 7}
        assert summary["deploymentsByPhase"] == {
            "Pending": 1,
            "Ready": 1,
            "Scheduling": 1,
            "Failed": 1,
        }
        listed = (await http.get(f"{control_plane_url}/api/v1/inventory/")).json()["data"]
        assert [c["clusterId"] for c in listed] == ["gpu-east"]
        cluster = await http.get(f"{control_plane_url}/api/v1/clusters/gpu-east")
        assert cluster.json()["report"]["nodes"][0]["name"] == "h100-a"
        missing = await http.get(f"{control_plane_url}/api/v1/clusters/nowhere")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"


async def test_bad_reports_are_400_naming_the_problem(
    control_plane_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers) as http:
        wrong = report()
        wrong["nodes"][0]["gpus"][0]["count"] = "eight"
        response = await http.put(f"{control_plane_url}/api/v1/inventory", json=wrong)
        assert response.status_code == 400
        assert "$.nodes[0].gpus[0].count" in response.json()["error"]["message"]
        future = await http.put(
            f"{control_plane_url}/api/v1/inventory", json=report(schemaVersion=2)
        )
        assert future.status_code == 400
        error = future.json()["error"]
        assert error["param"] == "schemaVersion"
        assert "supports: 1" in error["message"]
        garbage = await http.put(f"{control_plane_url}/api/v1/inventory", content=b"{nope")
        assert garbage.status_code == 400


async def test_endpoints_for_the_gateway_with_an_etag(
    control_plane_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers) as http:
        await bind(http, base=control_plane_url)
        await http.put(f"{control_plane_url}/api/v1/inventory", json=report())
        first = await http.get(f"{control_plane_url}/api/v1/endpoints")
        models = {m["servedModelName"]: m for m in first.json()["models"]}
        # only ready endpoints, and only deployments that have some
        assert models["Qwen/Qwen2.5-7B-Instruct"]["endpoints"] == [
            {"url": "http://10.42.0.17:8000", "ready": True}
        ]
        assert models["gemma-270m"]["engine"] == "llamacpp"
        tag = first.headers["etag"]
        same = await http.get(
            f"{control_plane_url}/api/v1/endpoints", headers={"If-None-Match": tag}
        )
        assert same.status_code == 304
        scaled = report(observedAt="2026-09-14T08:31:00Z")
        scaled["deployments"][0]["endpoints"][1]["ready"] = True
        await http.put(f"{control_plane_url}/api/v1/inventory", json=scaled)
        changed = await http.get(
            f"{control_plane_url}/api/v1/endpoints", headers={"If-None-Match": tag}
        )
        assert changed.status_code == 200
        assert changed.headers["etag"] != tag
        urls = [e["url"] for e in changed.json()["models"][0]["endpoints"]]
        assert urls == ["http://10.42.0.17:8000", "http://10.42.0.18:8000"]


async def test_a_late_older_report_does_not_replace_a_newer_one(
    control_plane_url: str, admin_headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(headers=admin_headers) as http:
        await bind(http, base=control_plane_url)
        await http.put(
            f"{control_plane_url}/api/v1/inventory", json=report(observedAt="2026-09-14T09:00:00Z")
        )
        old = report(observedAt="2026-09-14T08:55:00Z", reporterVersion="old")
        assert (
            await http.put(f"{control_plane_url}/api/v1/inventory", json=old)
        ).status_code == 200
        cluster = (await http.get(f"{control_plane_url}/api/v1/clusters/gpu-east")).json()
    assert cluster["summary"]["reporterVersion"] == "fleet-serving 0.1.0"


async def test_every_report_appends_to_the_capacity_series(
    start_apiserver: Any, postgres_url: str, admin_headers: dict[str, str]
) -> None:
    control_plane_url = await start_apiserver(database_url=postgres_url)
    async with httpx.AsyncClient(headers=admin_headers) as http:
        await bind(http, base=control_plane_url)
        for minute, gpus in ((0, 8), (1, 8), (2, 16)):
            doc = report(observedAt=f"2026-09-14T08:0{minute}:00Z")
            doc["nodes"][0]["gpus"][0]["count"] = gpus
            await http.put(f"{control_plane_url}/api/v1/inventory", json=doc)
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(
            "SELECT gpus FROM capacity_samples WHERE cluster_id = 'gpu-east' ORDER BY observed_at"
        ).fetchall()
    assert [r[0] for r in rows] == [9, 9, 17]


async def test_without_a_database_the_rest_is_503_naming_the_variable(
    start_apiserver: Any, admin_headers: dict[str, str]
) -> None:
    control_plane_url = await start_apiserver()
    async with httpx.AsyncClient(headers=admin_headers) as http:
        for path in ("/api/v1/tenants", "/api/v1/keys/abc", "/api/v1/usage"):
            response = await http.get(control_plane_url + path)
            assert response.status_code == 503
            error = response.json()["error"]
            assert error["code"] == "database_required"
            assert "FLEET_DATABASE_URL" in error["message"]
        assert (await http.get(f"{control_plane_url}/healthz")).status_code == 200
        ready = await http.get(f"{control_plane_url}/readyz")
        assert ready.json()["database"] == "not configured"
