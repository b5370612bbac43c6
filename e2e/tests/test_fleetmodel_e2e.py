"""From ``kubectl apply`` of a FleetModel to tokens of a real engine through the gateway.

All real, on one machine: etcd, kube-apiserver and kube-controller-manager (``make kube``), the
FleetModel CRD applied from ``deploy/base/crd.yaml`` by kubectl, ``fleet-serving run``, the control
plane on the test Postgres, the gateway in database mode on Postgres and Redis with endpoints
discovered from the operator's inventory, and llama.cpp's ``llama-server`` on Gemma 3 270M, run as
the operator rendered it on a real node (``fleet_testing.node``) from imported images, after the
registry fetch init container downloaded and checked the weights from the control plane. The
model enters the registry air-gapped: ``fleet models import <gguf> --id gemma-3-270m``. The client
is the official OpenAI SDK with a key of a tenant.

The tests run in order on one deployment (module-scoped: starting it is most of the time).
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from fleet_testing import engines, generation, servers
from fleet_testing.fleet_system import FM_NAME, MODEL, Fleet, running_fleet
from fleet_testing.node import KubeNode
from fleet_testing.waiting import eventually_blocking

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ENGINE_ARGS = [
    "--no-jinja",
    "--chat-template",
    "gemma",
    "--threads",
    "1",
    "--ctx-size",
    "2048",
    "--parallel",
    "1",
]
"""The model's own engineArgs: llama.cpp's built-in gemma template (the GGUF carries none, see
test_llama_server), one thread (ggml's threads spin-wait: on shared cores one is fastest)."""


def fleetmodel_yaml(namespace: str, replicas: int, cache: str | None = None) -> str:
    args = ", ".join(f'"{a}"' for a in ENGINE_ARGS)
    volume = f"\n  modelVolume: {{cacheClaim: {cache}}}" if cache else ""
    return f"""apiVersion: serving.fleet.dev/v1alpha1
kind: FleetModel
metadata: {{name: {FM_NAME}, namespace: {namespace}}}
spec:
  servedModelName: {MODEL}
  source: {{registry: {MODEL}}}
  weightFormat: gguf
  engine: llamacpp
  replicas: {replicas}
  gpusPerReplica: 0
  engineArgs: [{args}]{volume}
"""


@pytest.fixture(scope="module")
def fleet(
    kube_node: KubeNode,
    postgres_server: servers.Server,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    images = [engines.engine_image_archive()]
    workdir = tmp_path_factory.mktemp("fleet")
    with running_fleet(
        kube_node, postgres_server, redis_url, workdir, images=images, gguf=engines.gemma_gguf()
    ) as system:
        yield system


def gateway_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_kubectl_apply_brings_the_fleetmodel_to_ready(fleet: Fleet) -> None:
    started = time.monotonic()
    fleet.kubectl("apply", "-f", "-", stdin=fleetmodel_yaml(fleet.namespace, 1))
    fleet.kubectl(
        "wait", "--for=jsonpath={.status.phase}=Ready", "--timeout=240s", f"fleetmodel/{FM_NAME}"
    )
    table = fleet.kubectl("get", "fm", FM_NAME).splitlines()
    assert table[0].split()[:6] == ["NAME", "MODEL", "ENGINE", "REPLICAS", "READY", "PHASE"]
    assert table[1].split()[:6] == [FM_NAME, MODEL, "llamacpp", "1", "1", "Ready"]
    print(f"apply → Ready in {time.monotonic() - started:.1f} s")
    # The pod ran the registry fetch, then the engine, with the operator's own args.
    (pod,) = fleet.pods()
    (fetch,) = pod["status"]["initContainerStatuses"]
    assert fetch["state"]["terminated"]["reason"] == "Completed"
    engine = pod["spec"]["containers"][0]
    assert engine["args"][:2] == ["--model", "/models/gemma-3-270m-q4_k_m.gguf"]
    assert engine["args"][-len(ENGINE_ARGS) :] == ENGINE_ARGS
    ip = pod["status"]["podIP"]
    # The container's process: the operator's exact args (the model in the pod's volume, seen
    # through the container's root), the key from the Secret in its environment, never in argv.
    pid = engine_pid(fleet, pod)
    assert pid is not None
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[0] == b"/app/llama-server"
    model = argv[argv.index(b"--model") + 1].decode()
    assert model == "/models/gemma-3-270m-q4_k_m.gguf"
    assert Path(f"/proc/{pid}/root{model}").stat().st_size > 200_000_000
    assert argv[argv.index(b"--host") + 1] == b"0.0.0.0"
    assert fleet.engine_key.encode() not in b" ".join(argv)
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"LLAMA_API_KEY={fleet.engine_key}".encode() in environ
    eventually_blocking(
        lambda: fleet.endpoints() == [f"http://{ip}:8080"], what="the endpoint reported", within=60
    )
    with fleet.client() as client:  # the gateway discovered it (polls every second)
        eventually_blocking(
            lambda: MODEL in [m.id for m in client.models.list()],
            within=30,
            what="the gateway routes the model",
        )
    # and its health check found the engine up (/readyz: some endpoint ready; gemma is the only)
    eventually_blocking(lambda: gateway_ready(fleet.gateway), within=30, what="the gateway ready")


def test_a_chat_completion_through_the_gateway_is_real_generated_text(fleet: Fleet) -> None:
    with fleet.client() as client:
        reply = generation.chat(client, MODEL, max_tokens=24)
    generation.assert_generated_reply(reply, max_tokens=24)


def test_a_stream_relays_many_frames_and_the_engines_usage(fleet: Fleet) -> None:
    with fleet.client() as client:
        chunks = generation.stream(client, MODEL, max_tokens=40)
    generation.assert_generated_stream(chunks, max_tokens=40)


def test_the_ledger_holds_the_engines_usage_beside_the_gateways_count(fleet: Fleet) -> None:
    """Both requests above, each in one ledger row: the engine's usage and the gateway's own
    count, compared by ``GET /api/v1/usage-agreement`` (docs/e2e.md records the figures)."""

    def both() -> list[dict[str, Any]] | None:
        rows = fleet.ledger()
        return rows if len(rows) >= 2 else None

    rows = eventually_blocking(both, what="ledger rows", within=60)
    assert [r["stream"] for r in rows] == [False, True]
    for row in rows:
        # ok for the stream too, though the SDK closes on [DONE], maybe before the engine's EOF
        # (recorded as client_disconnected until this test found it; test_money_regressions.py)
        assert (row["status"], row["outcome"]) == (200, "ok"), row
        assert row["tenant"] == "e2e"
        assert row["engine_prompt_tokens"] > 5
        assert row["engine_completion_tokens"] >= 1
        assert row["gw_prompt_tokens"] > 0
        assert row["gw_completion_tokens"] > 0
        assert row["endpoint"] == fleet.endpoints()[0]
    agreement = fleet.admin.call("GET", f"/api/v1/usage-agreement?model={MODEL}")["data"]
    (figures,) = agreement
    assert figures["model"] == MODEL
    assert figures["requests"] == figures["compared"] == len(rows)
    assert figures["withoutEngineUsage"] == 0
    print(f"usage agreement: {figures}")
    for row in rows:
        print({k: row[k] for k in row if k.startswith(("engine_", "gw_")) or k == "count_method"})


def short_chat(client: openai.OpenAI) -> None:
    generation.chat(client, MODEL, max_tokens=2)


def route_until_served(fleet: Fleet, wanted: set[str], *, within: float = 60.0) -> set[str]:
    """Send short chats until every URL of ``wanted`` has answered one, by the ledger's
    ``endpoint`` column, for at most ``within`` seconds; the endpoints that answered. The
    gateway learns of a new or restarted endpoint from its discovery poll and health checks a
    moment after the control plane lists it (a fixed number of chats sent at once could all
    land before that, on a loaded machine), and the ledger writer batches its rows."""
    since = len(fleet.ledger())

    def served() -> set[str]:
        return {str(r["endpoint"]) for r in fleet.ledger()[since:] if r["outcome"] == "ok"}

    with fleet.client() as client:

        def sent_and_served() -> set[str] | None:
            found = served()
            if found >= wanted:
                return found
            short_chat(client)
            return None

        return eventually_blocking(sent_and_served, within=within, what=f"{sorted(wanted)} served")


def test_scaling_to_two_replicas_routes_to_both_without_a_gateway_restart(fleet: Fleet) -> None:
    gateway = fleet.procs.started["gateway"]
    fleet.kubectl("apply", "-f", "-", stdin=fleetmodel_yaml(fleet.namespace, 2))
    fleet.kubectl(
        "wait", "--for=jsonpath={.status.readyReplicas}=2", "--timeout=180s", f"fm/{FM_NAME}"
    )
    fleet.kubectl("wait", "--for=jsonpath={.status.phase}=Ready", "--timeout=60s", f"fm/{FM_NAME}")
    pods = fleet.pods()
    urls = sorted(f"http://{p['status']['podIP']}:8080" for p in pods)
    assert len(set(urls)) == 2
    eventually_blocking(
        lambda: fleet.endpoints() == urls, what="both endpoints reported", within=60
    )
    assert route_until_served(fleet, set(urls)) == set(urls)
    assert gateway.poll() is None  # the same process all along: no restart
    assert fleet.procs.started["gateway"] is gateway


def cache_claim(fleet: Fleet, store: Path) -> str:
    """A claim bound to a hostPath PersistentVolume on ``store`` (the node's disk, as a `local`
    volume or an NFS export would be); the PersistentVolume's name."""
    store.mkdir()
    os.chown(store, 65532, 65532)  # the pods' uid: a hostPath volume ignores fsGroup
    volume = f"cache-{fleet.namespace}"
    fleet.kubectl(
        "apply",
        "-f",
        "-",
        stdin=f"""apiVersion: v1
kind: PersistentVolume
metadata: {{name: {volume}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  storageClassName: ""
  persistentVolumeReclaimPolicy: Retain
  hostPath: {{path: {store}, type: Directory}}
  claimRef: {{namespace: {fleet.namespace}, name: model-cache}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: model-cache, namespace: {fleet.namespace}}}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: {volume}
  resources: {{requests: {{storage: 1Gi}}}}
""",
    )
    return volume


def test_two_replicas_on_a_cache_claim_download_the_model_once(fleet: Fleet) -> None:
    store = fleet.workdir / "model-cache"
    cache_claim(fleet, store)  # kept for the module: later tests kill and restart these pods
    fleet.kubectl("apply", "-f", "-", stdin=fleetmodel_yaml(fleet.namespace, 2, "model-cache"))
    deployment = f"/apis/apps/v1/namespaces/{fleet.namespace}/deployments/{FM_NAME}"

    def claimed() -> bool:  # the operator rendered the claim: rollout status means the new pods
        found = fleet.cluster.get(deployment) or {}
        volumes = found.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", [])
        return any("persistentVolumeClaim" in v for v in volumes)

    eventually_blocking(claimed, within=60, what="the Deployment with the cache claim")
    fleet.kubectl("rollout", "status", f"deployment/{FM_NAME}", "--timeout=300s")
    cached = [p["metadata"]["name"] for p in fleet.pods()
              if any("persistentVolumeClaim" in v for v in p["spec"]["volumes"])]  # fmt: skip
    assert len(cached) == 2
    # One pod at a time rolls (maxSurge 1): the first downloads, the second finds the files.
    logs = fleet.node.pod_logs(fleet.namespace)
    fetches = [text for key, text in logs.items()
               if key.split("/")[:2] in ([pod, "fetch-weights"] for pod in cached)]  # fmt: skip
    said = sorted("fetching" if "fetching" in t else "cached" for t in fetches)
    assert said == ["cached", "fetching"], fetches
    assert list((store / "sha256").iterdir())  # stored, each file once, by its sha256
    assert list((store / "partial").iterdir()) == []
    eventually_blocking(lambda: len(fleet.endpoints()) == 2, within=60, what="both routed")
    with fleet.client() as client:
        short_chat(client)  # the engine loads the model through the link into the claim


def processing(fleet: Fleet, pod: dict[str, Any]) -> bool:
    """Whether the pod's engine is generating (llama-server's own gauge, read with its key)."""
    request = urllib.request.Request(f"http://{pod['status']['podIP']}:8080/metrics")
    request.add_header("Authorization", f"Bearer {fleet.engine_key}")
    with urllib.request.urlopen(request, timeout=5) as answer:
        metrics = answer.read().decode()
    found = re.search(r"^llamacpp:requests_processing ([0-9.]+)", metrics, re.MULTILINE)
    return found is not None and float(found.group(1)) > 0


def engine_status(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "engine"]
    return dict(status)


def engine_pid(fleet: Fleet, pod: dict[str, Any]) -> int | None:
    """The host PID of the pod's running engine container."""
    name = pod["metadata"]["name"]
    current = fleet.cluster.get(f"/api/v1/namespaces/{fleet.namespace}/pods/{name}") or pod
    return fleet.node.container_pid(engine_status(current).get("containerID", ""))


def kill_when_streaming(fleet: Fleet, stream: Any, killed: dict[str, Any]) -> None:
    """Read the stream; after three text frames, SIGKILL the engine generating it."""
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received == 3 and not killed:
            (killed["pod"],) = [p for p in fleet.pods() if processing(fleet, p)]
            pid = engine_pid(fleet, killed["pod"])
            assert pid is not None
            os.kill(pid, signal.SIGKILL)


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_frame_and_comes_back(
    fleet: Fleet,
) -> None:
    count_long: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Count from one to two hundred in words."}
    ]
    since = len(fleet.ledger())
    with fleet.client() as client:
        stream = client.chat.completions.create(
            model=MODEL, messages=count_long, max_tokens=300, temperature=0, stream=True
        )
        killed: dict[str, Any] = {}
        with pytest.raises(openai.APIError) as broken:
            kill_when_streaming(fleet, stream, killed)
    assert "stream_interrupted" in str(broken.value.body) or "incomplete" in str(broken.value)

    # The interrupted request is recorded once, with what was relayed.
    def streamed() -> list[dict[str, Any]]:
        return [r for r in fleet.ledger()[since:] if r["stream"]]

    (row,) = eventually_blocking(streamed, what="the ledger row", within=60)
    assert row["outcome"] != "ok"
    assert row["gw_completion_tokens"] >= 3
    serving, name = killed["pod"], killed["pod"]["metadata"]["name"]
    url = f"http://{serving['status']['podIP']}:8080"
    assert row["endpoint"] == url
    print(
        {
            k: row[k]
            for k in (
                "outcome",
                "status",
                "engine_completion_tokens",
                "gw_prompt_tokens",
                "gw_completion_tokens",
                "completion_tokens",
            )
        }
    )
    # The kubelet restarts the engine in the same pod; it is ready and routed to again.
    restarted = eventually_blocking(
        lambda: [
            p
            for p in fleet.pods()
            if p["metadata"]["name"] == name
            and engine_status(p)["ready"]
            and engine_status(p)["restartCount"] >= 1
        ],
        within=120,
        what=lambda: (
            "the engine restarted and ready; it is "
            + str([engine_status(p) for p in fleet.pods() if p["metadata"]["name"] == name])
        ),
    )
    assert restarted[0]["status"]["podIP"] == serving["status"]["podIP"]
    eventually_blocking(
        lambda: url in fleet.endpoints() and len(fleet.endpoints()) == 2,
        within=60,
        what="back in the endpoints",
    )
    assert url in route_until_served(fleet, {url})


def test_deleting_the_fleetmodel_takes_its_endpoints_out_of_routing(fleet: Fleet) -> None:
    pids = [engine_pid(fleet, p) for p in fleet.pods()]
    assert all(pids)
    fleet.kubectl("delete", "fm", FM_NAME, "--timeout=120s")
    eventually_blocking(
        lambda: fleet.endpoints() == [] or None,
        what="endpoints gone from the control plane",
        within=60,
    )
    with fleet.client() as client:
        eventually_blocking(
            lambda: MODEL not in [m.id for m in client.models.list()],
            within=30,
            what="the gateway's routing table without the model",
        )
        with pytest.raises(openai.NotFoundError):
            short_chat(client)
    eventually_blocking(lambda: not fleet.pods(), what="the pods gone", within=60)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)  # the engines stopped
