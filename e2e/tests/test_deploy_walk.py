"""Fleet as it ships, on a real node: deploy/README.md's walk (``deploy/walk.sh``) with
``deploy/install.sh`` and ``deploy/overlays/test-node``, from the images ``make image`` writes.

The operator, control plane, gateway and Redis run as pods under the RBAC, NetworkPolicies and
Pod Security settings that ship; Postgres is the harness's server, reached by pods through the
node's relay (the overlay says so); the engine is llama-server from ``make engine-image`` on
Gemma 3 270M, fetched from the control plane by the init container. Steps 1 and 3 need a GPU,
and step 2's k3s install needs k3s itself: the walk runs steps 2 (the install alone, the images
already imported), 4, 5, 6 and 7.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleet_testing import databases, engines, servers
from fleet_testing.fleet_system import Api
from fleet_testing.node import KubeNode
from fleet_testing.shipped import Shipped, Traffic, ledger_matches
from fleet_testing.waiting import eventually_blocking

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OVERLAY = ROOT / "deploy" / "overlays" / "test-node"
MODEL = "gemma-3-270m"
NAME_LABEL = "app.kubernetes.io/name"


@pytest.fixture(scope="module")
def pods_database(kube_node: KubeNode, postgres_server: servers.Server) -> Iterator[str]:
    """A database of its own on the harness's Postgres, as pods reach it (the node's relay)."""
    with databases.scratch_database(postgres_server.url) as url:
        host_port = url.split("@", 1)[1].split("/", 1)[0]
        port = int(host_port.rsplit(":", 1)[1])
        relay = kube_node.expose(port).removeprefix("http://")
        yield url.replace(host_port, relay)


@dataclass
class Walked:
    """The walk's deployment, and what the walk said."""

    shipped: Shipped
    said: str


@pytest.fixture(scope="module")
def walked(
    kube_node: KubeNode,
    postgres_server: servers.Server,
    pods_database: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Walked]:
    """Steps 2, 4, 5, 6 and 7 of the walk on the test node; everything applied removed after."""
    for archive in (engines.fleet_images_archive(), engines.engine_image_archive()):
        kube_node.import_image(archive)
    redis_password = secrets.token_hex(16)
    kube_node.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "namespace.yaml"))
    kube_node.kubectl("-n", "fleet-system", "create", "secret", "generic", "fleet-redis",
                      "--from-file=redis.conf=/dev/stdin",
                      stdin=f"requirepass {redis_password}\n")  # fmt: skip
    tmp = tmp_path_factory.mktemp("walk")
    kubectl = (f"{kube_node.binaries / 'kubectl'} --kubeconfig={kube_node.cluster.kubeconfig}"
               f" --cache-dir={tmp / 'kubectl-cache'}")  # fmt: skip
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "KUBECTL": kubectl,
        "FLEET_CLI": str(BIN / "fleet"),
        "FLEET_WALK_STEPS": "2 4 5 6 7",
        "FLEET_WALK_INSTALL": str(ROOT / "deploy" / "install.sh"),
        "FLEET_OVERLAY": str(OVERLAY),
        "FLEET_CLUSTER_ID": "test-node",
        "FLEET_POD_CIDR": kube_node.network.pod_cidr,
        "FLEET_WALK_GGUF": str(engines.gemma_gguf()),
        "FLEET_WALK_MODEL": MODEL,
        "FLEET_WALK_GPUS": "0",
        "FLEET_DATABASE_URL": pods_database,
        "FLEET_REDIS_URL": f"redis://:{redis_password}@fleet-redis.fleet-system.svc:6379/0",
        "FLEET_WALK_GATEWAY": "clusterip",  # no ingress: the node routes the host to Services
        "FLEET_APISERVER_URL": "clusterip",
    }
    log = tmp / "walk.log"
    try:
        with log.open("w") as out:
            walk = subprocess.run([str(ROOT / "deploy" / "walk.sh")], env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=1200, check=False)  # fmt: skip
        said = log.read_text()
        if walk.returncode != 0:
            report = kube_node.report(("fleet-system", "fleet-models"))
            pytest.fail(f"walk.sh failed ({walk.returncode}):\n{said[-4000:]}\n{report}")
        token = kube_node.kubectl("-n", "fleet-system", "get", "secret", "fleet-admin-token",
                                  "-o", "jsonpath={.data.token}")  # fmt: skip
        relayed, own = (url.split("@", 1)[1].split("/", 1)[0]
                        for url in (pods_database, postgres_server.url))  # fmt: skip
        admin = Api(
            cluster_ip(kube_node, "fleet-apiserver", 8081), base64.b64decode(token).decode().strip()
        )
        shipped = Shipped(
            node=kube_node,
            admin=admin,
            gateway=cluster_ip(kube_node, "fleet-gateway", 8080),
            database_url=pods_database.replace(relayed, own),
            model=MODEL,
            name=MODEL,
        )
        yield Walked(shipped, said)
    finally:
        kube_node.kubectl("-n", "fleet-models", "delete", "fleetmodels", "--all", "--wait=true",
                          "--timeout=120s", check=False)  # fmt: skip
        kube_node.kubectl("delete", "-k", str(OVERLAY), "--ignore-not-found", "--wait=true",
                          "--timeout=180s", check=False)  # fmt: skip


def cluster_ip(node: KubeNode, service: str, port: int) -> str:
    address = node.kubectl("-n", "fleet-system", "get", "svc", service,
                           "-o", "jsonpath={.spec.clusterIP}")  # fmt: skip
    return f"http://{address}:{port}"


@pytest.mark.timeout(1500)
def test_the_walk_runs_on_the_test_node(walked: Walked) -> None:
    assert "walk: 7: the request is in the ledger" in walked.said
    pods = json.loads(walked.shipped.kubectl("get", "pods", "-A", "-o", "json"))["items"]
    running = {(p["metadata"]["namespace"], p["metadata"]["labels"].get(NAME_LABEL)) for p in pods}
    for workload in ("fleet-serving", "fleet-apiserver", "fleet-gateway"):
        assert ("fleet-system", workload) in running  # as pods, not host processes
    assert walked.shipped.engine_pods(), "the engine runs as a pod in fleet-models"


@pytest.mark.timeout(900)
def test_a_rollout_never_stops_serving_and_an_oom_killed_one_never_replaces_it(
    walked: Walked,
) -> None:
    """A one-replica model rolls with maxSurge 1 (docs/operator.md): the new pod is Ready before
    the old one goes, so a client sending all along gets only answers. A rollout whose pod is
    OOMKilled at its memory limit never replaces the serving one: the status names OOMKilled
    while the old pod answers. The ledger holds exactly what the client saw throughout."""
    shipped = walked.shipped
    key_id, key = shipped.api_key("rollout")
    first = {p["metadata"]["name"] for p in shipped.engine_pods()}
    with Traffic(shipped.gateway, key, MODEL) as traffic:
        traffic.until_answered(3)
        shipped.patch({"spec": {"engineArgs": ["--threads", "1"]}})
        shipped.until_ready()

        def replaced() -> str | None:
            names = {p["metadata"]["name"] for p in shipped.engine_pods()}
            return next(iter(names)) if len(names) == 1 and not names & first else None

        second = eventually_blocking(replaced, within=120, what="the old pod gone")
        traffic.until_answered(3)
        shipped.patch({"spec": {"engineArgs": ["--threads", "1", "--load-mode", "none"],
                                "resources": {"limits": {"memory": "64Mi"}}}})  # fmt: skip
        oom = shipped.until_status(lambda s: s.get("reason") == "OOMKilled", within=300,
                                   what="the new pod OOMKilled")  # fmt: skip
        assert "64Mi" in oom["message"], oom
        assert oom["phase"] == "Pending"
        traffic.until_answered(5)
        assert second in {p["metadata"]["name"] for p in shipped.engine_pods()}
        shipped.patch({"spec": {"engineArgs": ["--threads", "1"], "resources": None}})
        shipped.until_ready()
        traffic.until_answered(3)
    assert traffic.statuses() == {200: len(traffic.answers)}, traffic.answers
    ledger_matches(shipped, key_id, traffic.answers)


@pytest.mark.timeout(600)
def test_a_stalled_engine_is_named_and_restarted_by_its_liveness_probe(walked: Walked) -> None:
    """An engine that stops answering (SIGSTOP) fails its readiness probe: the status says
    NotReady, the gateway takes the endpoint out and answers an envelope; its liveness probe then
    has the kubelet restart it and the model is Ready again. The ledger matches every answer."""
    shipped = walked.shipped
    key_id, key = shipped.api_key("stall")
    (pod,) = shipped.engine_pods()
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "engine")
    pid = shipped.node.container_pid(status["containerID"])
    assert pid is not None
    with Traffic(shipped.gateway, key, MODEL, timeout_s=20) as traffic:
        traffic.until_answered(2)
        os.kill(pid, signal.SIGSTOP)
        shipped.until_status(lambda s: s.get("reason") == "NotReady", within=120,
                             what="NotReady")  # fmt: skip
        restarted = shipped.until_status(lambda s: s.get("phase") == "Ready", within=240,
                                         what="Ready after the restart")  # fmt: skip
        # the gateway's own health check lets the endpoint back in within a minute
        eventually_blocking(lambda: traffic.answers[-1].status == 200, within=60,
                            what="a 200 again")  # fmt: skip
    (pod,) = shipped.engine_pods()
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "engine")
    assert status["restartCount"] >= 1, status
    assert restarted["readyReplicas"] == 1
    codes = {a.code for a in traffic.answers if a.status not in (200, None)}
    expected = {"no_ready_endpoint", "engine_timeout", "upstream_unavailable", "engine_error"}
    assert codes <= expected, traffic.answers
    ledger_matches(shipped, key_id, traffic.answers)


@pytest.mark.timeout(600)
def test_a_drain_never_takes_the_last_ready_replica(walked: Walked) -> None:
    """``kubectl drain`` of the node under a two-replica model evicts one replica and is then
    held by the model's PodDisruptionBudget: the other keeps serving, the status names the
    evicted one's replacement Unschedulable (the node is cordoned); uncordoned, both serve."""
    shipped = walked.shipped
    key_id, key = shipped.api_key("drain")
    shipped.patch({"spec": {"replicas": 2}})
    shipped.until_ready()
    node = shipped.node.name
    with Traffic(shipped.gateway, key, MODEL) as traffic:
        traffic.until_answered(2)
        kubectl = [str(shipped.node.binaries / "kubectl"),
                   f"--kubeconfig={shipped.node.cluster.kubeconfig}"]  # fmt: skip
        drained = subprocess.run(
            [*kubectl, "drain", node, "--pod-selector", f"serving.fleet.dev/model={shipped.name}",
             "--delete-emptydir-data", "--ignore-daemonsets", "--timeout=40s"],
            capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert drained.returncode != 0, drained.stdout
        assert "disruption budget" in drained.stderr, drained.stderr
        held = shipped.until_status(lambda s: s.get("reason") == "Unschedulable", within=120,
                                    what="the replacement Unschedulable")  # fmt: skip
        assert held["readyReplicas"] == 1
        traffic.until_answered(3)
        shipped.kubectl("uncordon", node)
        shipped.until_status(lambda s: s.get("phase") == "Ready" and s.get("readyReplicas") == 2,
                             within=300, what="both replicas Ready")  # fmt: skip
        traffic.until_answered(2)
    assert traffic.statuses() == {200: len(traffic.answers)}, traffic.answers
    ledger_matches(shipped, key_id, traffic.answers)
    shipped.patch({"spec": {"replicas": 1}})
    shipped.until_ready()


@pytest.mark.timeout(600)
def test_a_fleetmodel_deleted_while_the_operator_is_down_is_gone_at_once(walked: Walked) -> None:
    """With the operator scaled to zero, ``kubectl delete`` of a FleetModel completes at once
    (no finalizer) and the garbage collector removes its pods; the gateway answers envelopes for
    the endpoint it still knows, and once the operator is back its report drops the model: the
    gateway then says the model does not exist. The ledger matches every answer."""
    shipped = walked.shipped
    key_id, key = shipped.api_key("deleted")
    with Traffic(shipped.gateway, key, MODEL, timeout_s=20) as traffic:
        traffic.until_answered(2)
        shipped.kubectl("-n", "fleet-system", "scale", "deployment/fleet-serving", "--replicas=0")
        shipped.kubectl("-n", "fleet-system", "wait", "--for=delete", "pod",
                        "-l", f"{NAME_LABEL}=fleet-serving", "--timeout=120s")  # fmt: skip
        shipped.kubectl("-n", shipped.namespace, "delete", "fleetmodel", shipped.name,
                        "--timeout=20s")  # fmt: skip
        eventually_blocking(lambda: not shipped.engine_pods(), within=120,
                            what="the engine pods garbage-collected")  # fmt: skip
        traffic.until_answered(2)
        shipped.kubectl("-n", "fleet-system", "scale", "deployment/fleet-serving", "--replicas=1")
        eventually_blocking(lambda: traffic.answers[-1].code == "model_not_found", within=180,
                            what="the model gone from the gateway")  # fmt: skip
    assert traffic.answers[-1].status == 404
    ledger_matches(shipped, key_id, traffic.answers)
