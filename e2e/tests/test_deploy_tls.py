"""The k3s overlay's HTTPS, as far as this machine can check it without k3s and Traefik: the real
API server accepts the overlay whole (a server-side dry run: schemas, strict field validation,
admission), its Ingress serves only TLS from fleet-gateway-tls, and ``deploy/gateway-tls.sh``
(which install.sh runs for that overlay) makes that Secret with a certificate a client verifying
the host name accepts, in a real TLS handshake over loopback. What stays untested here is Traefik
itself serving it on a real k3s (deploy/README.md says so).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_testing.fix_kube import KubeCluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
HOST = "llm.example.test"


@pytest.fixture(scope="module")
def kubectl(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The kubectl command line for the real API server, with fleet-system and fleet-models made
    (as install.sh's first step makes them); both deleted afterwards."""
    binary = shutil.which("kubectl")
    assert binary is not None, "kubectl is needed"
    cache = tmp_path_factory.mktemp("kubectl-cache")
    command = f"{binary} --kubeconfig={kube_cluster.kubeconfig} --cache-dir={cache}"
    run(command, "apply", "-f", str(DEPLOY / "base" / "namespace.yaml"))
    yield command
    run(command, "delete", "-f", str(DEPLOY / "base" / "namespace.yaml"), "--wait=true",
        "--timeout=120s", check=False)  # fmt: skip


def run(
    command: str, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*command.split(), *args], capture_output=True, text=True, timeout=120,
                          check=False, env=env)  # fmt: skip
    if check:
        assert done.returncode == 0, done.stderr
    return done


def tls_script(kubectl: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DEPLOY / "gateway-tls.sh")], capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "KUBECTL": kubectl, **env})  # fmt: skip


def test_the_api_server_accepts_the_k3s_overlay_and_its_ingress_serves_only_tls(
    kubectl: str,
) -> None:
    dry = run(kubectl, "apply", "-k", str(DEPLOY / "overlays" / "k3s"), "--dry-run=server",
              "--validate=strict", "-o", "json")  # fmt: skip
    items = json.loads(dry.stdout)["items"]
    (ingress,) = [o for o in items if o["kind"] == "Ingress"]
    assert ingress["spec"]["tls"] == [{"secretName": "fleet-gateway-tls"}]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["traefik.ingress.kubernetes.io/router.entrypoints"] == "websecure"
    assert annotations["traefik.ingress.kubernetes.io/router.tls"] == "true"


def test_the_install_makes_a_certificate_for_the_host_once_and_keeps_it(
    kubectl: str, tmp_path: Path
) -> None:
    refused = tls_script(kubectl, FLEET_TLS_ISSUER="cert-manager")
    assert refused.returncode == 1
    assert "cert-manager is not installed" in refused.stderr
    made = tls_script(kubectl, FLEET_GATEWAY_HOST=HOST)  # auto: no cert-manager, so openssl
    assert made.returncode == 0, made.stderr
    assert "PRIVATE KEY" not in made.stderr + made.stdout
    secret = json.loads(run(kubectl, "-n", "fleet-system", "get", "secret", "fleet-gateway-tls",
                            "-o", "json").stdout)  # fmt: skip
    assert secret["type"] == "kubernetes.io/tls"
    files = {name: base64.b64decode(value) for name, value in secret["data"].items()}
    assert files["ca.crt"] == files["tls.crt"]  # self-signed: the certificate is its own anchor
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    for name in (HOST, "localhost"):
        assert handshake(tmp_path, name) == "ok", name
    assert "Hostname mismatch" in handshake(tmp_path, "other.example.test")
    kept = tls_script(kubectl, FLEET_GATEWAY_HOST="another.example.test")
    assert kept.returncode == 0
    assert "keeping" in kept.stderr
    again = json.loads(run(kubectl, "-n", "fleet-system", "get", "secret", "fleet-gateway-tls",
                           "-o", "json").stdout)  # fmt: skip
    assert again["data"] == secret["data"]


def handshake(files: Path, name: str) -> str:
    """A TLS server on loopback with the Secret's certificate and key, and a client trusting only
    its ca.crt and checking the host name ``name``: "ok", or why the client refused."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files / "tls.crt", files / "tls.key")  # the key matches the certificate
    client = ssl.create_default_context(cafile=str(files / "ca.crt"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                client.wrap_socket(raw, server_hostname=name),
            ):
                return "ok"
        except ssl.SSLCertVerificationError as exc:
            return str(exc.verify_message)
        finally:
            thread.join(timeout=10)
