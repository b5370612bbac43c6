"""The scrape deploy/ ships works: the target its ``prometheus.io/*`` annotations name answers an
unauthenticated GET with the gateway's metrics, while the main port's /metrics still needs the
metrics credential. Real gateway processes over loopback; the annotations read from the manifest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleet_testing.ports import free_ports
from fleet_testing.waiting import until_answers

ROOT = Path(__file__).resolve().parents[3]
GATEWAY_YAML = ROOT / "deploy" / "base" / "gateway.yaml"
TOKEN = "metrics-token-of-at-least-thirty-two-characters"
KEY = "acme/research/team-a"


def manifests() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(GATEWAY_YAML.read_text())}


def scrape_target() -> tuple[int, str]:
    """The port and path the gateway pods' annotations send an annotation-driven Prometheus to."""
    annotations = manifests()["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    return int(annotations["prometheus.io/port"]), annotations["prometheus.io/path"]


def test_the_annotations_name_the_metrics_only_listener() -> None:
    """The annotated port is the one FLEET_METRICS_LISTEN opens, a container port of its own
    (never the main one, whose /metrics answers 401 to a scraper without the credential)."""
    port, path = scrape_target()
    deployment, service = manifests()["Deployment"], manifests()["Service"]
    (gateway,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    assert env["FLEET_METRICS_LISTEN"] == f"0.0.0.0:{port}"
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports["metrics"] == port != ports["http"]
    assert path == "/metrics"
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert {"name": "metrics", "port": port, "targetPort": "metrics"} in service["spec"]["ports"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_unauthenticated_scrape_of_the_target_answers_while_main_metrics_stays_closed(
    workers: str,
) -> None:
    port, main = free_ports(2)
    _, path = scrape_target()
    env = {
        **os.environ,
        "FLEET_AUTH_REQUIRED": "true",
        "FLEET_API_KEYS": KEY,
        "FLEET_METRICS_TOKEN": TOKEN,
        "FLEET_METRICS_LISTEN": f"127.0.0.1:{port}",
        "FLEET_ACCESS_LOG": "false",
    }
    argv = [sys.executable, "-m", "fleet_core.gateway", "--demo", "--listen", f"127.0.0.1:{main}"]
    proc = subprocess.Popen(
        [*argv, "--workers", workers], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        until_answers(f"http://127.0.0.1:{main}/healthz", proc, what="fleet-gateway")
        with httpx.Client(timeout=10) as http:
            scraped = http.get(f"http://127.0.0.1:{port}{path}")
            openmetrics = http.get(
                f"http://127.0.0.1:{port}{path}",
                headers={"Accept": "application/openmetrics-text; version=1.0.0"},
            )
            nothing_else = http.get(f"http://127.0.0.1:{port}/v1/models")
            closed = http.get(f"http://127.0.0.1:{main}/metrics")
            opened = http.get(
                f"http://127.0.0.1:{main}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
            )
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert scraped.status_code == 200, scraped.text
    assert scraped.headers["content-type"].startswith("text/plain")
    assert "# TYPE fleet_" in scraped.text
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert nothing_else.status_code == 404  # the listener serves metrics, nothing else
    assert nothing_else.json()["error"]["code"]
    assert closed.status_code == 401, closed.text
    assert opened.status_code == 200
    assert TOKEN not in err  # the credential never reaches the logs


def test_the_metrics_listener_on_the_main_port_is_refused_in_one_line() -> None:
    (main,) = free_ports(1)
    result = subprocess.run(
        [sys.executable, "-m", "fleet_core.gateway", "--demo", "--listen", f"127.0.0.1:{main}"],
        env={**os.environ, "FLEET_METRICS_LISTEN": f"0.0.0.0:{main}"},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "FLEET_METRICS_LISTEN" in result.stderr
    assert "a port of its own" in result.stderr
