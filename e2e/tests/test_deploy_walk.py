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

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_testing import databases, engines, servers
from fleet_testing.node import KubeNode

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def pods_database(kube_node: KubeNode, postgres_server: servers.Server) -> Iterator[str]:
    """A database of its own on the harness's Postgres, as pods reach it (the node's relay)."""
    with databases.scratch_database(postgres_server.url) as url:
        host_port = url.split("@", 1)[1].split("/", 1)[0]
        port = int(host_port.rsplit(":", 1)[1])
        relay = kube_node.expose(port).removeprefix("http://")
        yield url.replace(host_port, relay)


@pytest.mark.timeout(1500)
def test_the_walk_runs_on_the_test_node(
    kube_node: KubeNode, pods_database: str, tmp_path: Path
) -> None:
    for archive in (engines.fleet_images_archive(), engines.engine_image_archive()):
        kube_node.import_image(archive)
    redis_password = secrets.token_hex(16)
    kube_node.kubectl("apply", "-f", str(ROOT / "deploy" / "base" / "namespace.yaml"))
    kube_node.kubectl("-n", "fleet-system", "create", "secret", "generic", "fleet-redis",
                      "--from-file=redis.conf=/dev/stdin",
                      stdin=f"requirepass {redis_password}\n")  # fmt: skip
    kubectl = (f"{kube_node.binaries / 'kubectl'} --kubeconfig={kube_node.cluster.kubeconfig}"
               f" --cache-dir={tmp_path / 'kubectl-cache'}")  # fmt: skip
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "KUBECTL": kubectl,
        "FLEET_CLI": str(BIN / "fleet"),
        "FLEET_WALK_STEPS": "2 4 5 6 7",
        "FLEET_WALK_INSTALL": str(ROOT / "deploy" / "install.sh"),
        "FLEET_OVERLAY": str(ROOT / "deploy" / "overlays" / "test-node"),
        "FLEET_CLUSTER_ID": "test-node",
        "FLEET_POD_CIDR": kube_node.network.pod_cidr,
        "FLEET_WALK_GGUF": str(engines.gemma_gguf()),
        "FLEET_WALK_GPUS": "0",
        "FLEET_DATABASE_URL": pods_database,
        "FLEET_REDIS_URL": f"redis://:{redis_password}@fleet-redis.fleet-system.svc:6379/0",
        "FLEET_WALK_GATEWAY": "clusterip",  # no ingress: the node routes the host to Services
        "FLEET_APISERVER_URL": "clusterip",
    }
    log = tmp_path / "walk.log"
    with log.open("w") as out:
        walk = subprocess.run([str(ROOT / "deploy" / "walk.sh")], env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=1200, check=False)  # fmt: skip
    said = log.read_text()
    if walk.returncode != 0:
        report = kube_node.report(("fleet-system", "default"))
        pytest.fail(f"walk.sh failed ({walk.returncode}):\n{said[-4000:]}\n{report}")
    assert "walk: 7: the request is in the ledger" in said
