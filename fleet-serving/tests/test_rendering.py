"""Renderers and engine profiles as pure functions: spec in, Kubernetes dicts out."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleet_contract import ModelWeights, WeightFile
from fleet_serving import profiles, rendering, rollout
from fleet_serving.errors import InvalidSpec
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import decode_spec

OWNER = rendering.Owner(name="qwen", namespace="models", uid="uid-1")


def spec(**fields: Any) -> Any:
    base: dict[str, Any] = {
        "servedModelName": "qwen",
        "source": {"huggingFace": {"repo": "Qwen/Qwen3-8B", "revision": "abc123"}},
        "weightFormat": "safetensors",
        "engine": "vllm",
    }
    return decode_spec(base | fields)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def test_vllm_deployment_runs_the_openai_server_with_its_key_from_a_secret() -> None:
    s = spec(replicas=2, gpusPerReplica=2, engineArgs=["--max-model-len=8192"])
    d = rendering.deployment(OWNER, s, profiles.check(s))
    c = container(d)
    assert d["spec"]["replicas"] == 2
    assert c["image"].startswith("vllm/vllm-openai:")
    assert c["args"] == [
        "Qwen/Qwen3-8B", "--revision", "abc123",
        "--served-model-name", "qwen", "--host", "0.0.0.0", "--port", "8000",
        "--tensor-parallel-size", "2", "--max-model-len=8192",
    ]  # fmt: skip
    key = {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "fleet-engine-key",
                                                                   "key": "api-key"}}}  # fmt: skip
    assert c["env"][0] == key
    assert not any("key" in arg.lower() for arg in c["args"])  # argv is world-readable
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_vllm_requires_gpus_of_compute_7_5_or_better_or_unlabelled() -> None:
    s = spec()
    pod = rendering.deployment(OWNER, s, profiles.check(s))["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [
            {"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["7"]}]},
        {"matchExpressions": [
            {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["7"]},
            {"key": "nvidia.com/gpu.compute.minor", "operator": "Gt", "values": ["4"]}]},
        # No GPU feature discovery: compute unknown is not too old (placement says so).
        {"matchExpressions": [
            {"key": "nvidia.com/gpu.compute.major", "operator": "DoesNotExist"}]},
    ]  # fmt: skip
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


def test_llamacpp_serves_gguf_with_no_compute_floor_and_its_own_key_variable() -> None:
    s = spec(engine="llamacpp", weightFormat="gguf", gpusPerReplica=0,
             source={"uri": "s3://models/gemma/gemma-3-270m.gguf"},
             apiKeySecret={"name": "shared-keys", "key": "gemma"})  # fmt: skip
    d = rendering.deployment(OWNER, s, profiles.check(s))
    pod = d["spec"]["template"]["spec"]
    c = container(d)
    assert "affinity" not in pod
    assert "nodeSelector" not in pod
    assert "tolerations" not in pod
    assert c["image"] == f"ghcr.io/ggml-org/llama.cpp:server-{profiles.LLAMACPP_BUILD}"
    assert "annotations" not in d["spec"]["template"]["metadata"]  # /metrics needs the key
    assert c["env"][0]["name"] == "LLAMA_API_KEY"
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "shared-keys", "key": "gemma"}
    assert c["args"][:4] == ["--model", "/models/model.gguf", "--alias", "qwen"]
    assert "resources" not in c or "nvidia.com/gpu" not in c["resources"].get("limits", {})
    (fetch,) = pod["initContainers"]
    assert fetch["args"] == ["s3", "cp", "s3://models/gemma/gemma-3-270m.gguf",
                             "/models/model.gguf"]  # fmt: skip


def test_llamacpp_with_gpus_runs_the_cuda_build() -> None:
    s = spec(engine="llamacpp", weightFormat="gguf", gpusPerReplica=1,
             source={"huggingFace": {"repo": "unsloth/Qwen3-8B-GGUF"}})  # fmt: skip
    c = container(rendering.deployment(OWNER, s, profiles.check(s)))
    assert c["image"] == f"ghcr.io/ggml-org/llama.cpp:server-cuda-{profiles.LLAMACPP_BUILD}"
    assert c["args"][c["args"].index("--n-gpu-layers") + 1] == "999"


def test_every_rendered_image_is_pinned_to_a_version() -> None:
    cases = [spec(), spec(engine="llamacpp", weightFormat="gguf", gpusPerReplica=0,
                          source={"uri": "s3://models/m.gguf"})]  # fmt: skip
    for s in cases:
        pod = rendering.deployment(OWNER, s, profiles.check(s))["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            tag = c["image"].rsplit(":", 1)[-1]
            assert re.fullmatch(r"v?\d+\.\d+\.\d+|server-(cuda-)?b\d+", tag), c["image"]


def test_hub_downloads_go_to_the_model_volume_with_a_gated_models_token() -> None:
    s = spec(hfTokenSecret={"name": "hf", "key": "token"})
    env = {
        e["name"]: e for e in container(rendering.deployment(OWNER, s, profiles.check(s)))["env"]
    }
    assert env["HF_HOME"]["value"] == "/models/.cache/huggingface"
    assert env["LLAMA_CACHE"]["value"] == "/models/.cache/llama.cpp"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}


def test_an_s3_source_gets_its_credentials_and_endpoint_from_a_secret() -> None:
    s = spec(engine="llamacpp", weightFormat="gguf", gpusPerReplica=0,
             source={"uri": "s3://models/m.gguf", "credentialsSecret": "minio"})  # fmt: skip
    pod = rendering.deployment(OWNER, s, profiles.check(s))["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    assert fetch["envFrom"] == [{"secretRef": {"name": "minio"}}]
    assert "HF_TOKEN" not in str(pod["containers"][0]["env"])


def test_a_gguf_repository_serves_the_named_file() -> None:
    s = spec(engine="llamacpp", weightFormat="gguf", gpusPerReplica=0,
             source={"huggingFace": {"repo": "unsloth/Qwen3-8B-GGUF"}},
             weightFile="Qwen3-8B-Q4_K_M.gguf")  # fmt: skip
    args = container(rendering.deployment(OWNER, s, profiles.check(s)))["args"]
    assert args[:4] == ["--hf-repo", "unsloth/Qwen3-8B-GGUF", "--hf-file", "Qwen3-8B-Q4_K_M.gguf"]


def test_owned_objects_carry_the_owner_reference_and_labels() -> None:
    s = spec()
    profile = profiles.check(s)
    owned = (rendering.deployment(OWNER, s, profile), rendering.service(OWNER, profile),
             rendering.disruption_budget(OWNER))  # fmt: skip
    for obj in owned:
        meta = obj["metadata"]
        assert (meta["name"], meta["namespace"]) == ("qwen", "models")
        (ref,) = meta["ownerReferences"]
        assert ref == {
            "apiVersion": "serving.fleet.dev/v1alpha1", "kind": "FleetModel", "name": "qwen",
            "uid": "uid-1", "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        assert meta["labels"]["serving.fleet.dev/model"] == "qwen"


def test_the_service_selects_the_pods_of_its_model() -> None:
    svc = rendering.service(OWNER, profiles.LLAMACPP)
    assert svc["spec"]["selector"] == {"serving.fleet.dev/model": "qwen"}
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]


@pytest.mark.parametrize(
    ("replicas", "gpus", "surge", "unavailable"),
    [
        (1, 0, 1, 0),  # never an outage
        (1, 1, 1, 0),  # never an outage: the new pod waits for a spare GPU, the old one serves
        (2, 0, 1, 0),  # no GPUs to be scarce
        (2, 1, 0, 1),  # GPUs are scarce; the other replica serves
        (3, 2, 0, 1),
        (0, 1, 1, 0),  # nothing to roll; a later scale-up to one replica surges
    ],
)
def test_the_rollout_strategy_never_takes_a_lone_replica_down(
    replicas: int, gpus: int, surge: int, unavailable: int
) -> None:
    engine = {"engine": "vllm"} if gpus else {"engine": "llamacpp", "weightFormat": "gguf"}
    s = spec(replicas=replicas, gpusPerReplica=gpus, **engine)
    strategy = rendering.deployment(OWNER, s, profiles.check(s))["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
    }


def test_the_disruption_budget_lets_a_drain_evict_one_replica_at_a_time() -> None:
    pdb = rendering.disruption_budget(OWNER)
    assert (pdb["apiVersion"], pdb["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert pdb["metadata"]["labels"] == rendering.common_labels("qwen")
    # The Deployment's own selector: exactly the model's pods.
    s = spec()
    selector = rendering.deployment(OWNER, s, profiles.check(s))["spec"]["selector"]
    assert pdb["spec"] == {
        "selector": selector,
        "maxUnavailable": 1,  # not minAvailable: 1, which blocks draining a lone replica forever
        "unhealthyPodEvictionPolicy": "AlwaysAllow",  # a crash-looping pod never blocks a drain
    }


def test_user_placement_resources_and_image_are_passed_through() -> None:
    s = spec(
        image="registry.local/vllm:patched",
        nodeSelector={"pool": "h100"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml",
                      "effect": "NoSchedule"}],
        resources={"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}},
    )  # fmt: skip
    d = rendering.deployment(OWNER, s, profiles.check(s))
    pod = d["spec"]["template"]["spec"]
    assert container(d)["image"] == "registry.local/vllm:patched"
    assert pod["nodeSelector"] == {"pool": "h100"}
    assert pod["tolerations"][0] == {"key": "dedicated", "operator": "Equal", "value": "ml",
                                     "effect": "NoSchedule"}  # fmt: skip
    assert container(d)["resources"] == {
        "requests": {
            "cpu": "8",
            "memory": "64Gi",
            "nvidia.com/gpu": "1",
            "ephemeral-storage": "256Mi",
        },
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"},
    }


def test_a_runtime_class_reaches_the_pod_spec() -> None:
    s = spec(runtimeClassName="nvidia")
    pod = rendering.deployment(OWNER, s, profiles.check(s))["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"


def test_no_runtime_class_is_rendered_when_unset() -> None:
    s = spec()
    pod = rendering.deployment(OWNER, s, profiles.check(s))["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod  # the API server omits it; rendering null is drift


@pytest.mark.parametrize(
    ("engine", "fmt", "reason"),
    [
        ("vllm", "gguf", "vllm serves safetensors; this model is gguf"),
        ("llamacpp", "safetensors", "llamacpp serves gguf; this model is safetensors"),
    ],
)
def test_engine_profiles_refuse_the_other_format(engine: str, fmt: str, reason: str) -> None:
    with pytest.raises(InvalidSpec, match=reason):
        profiles.check(spec(engine=engine, weightFormat=fmt))


def test_vllm_without_a_gpu_is_refused() -> None:
    with pytest.raises(InvalidSpec, match="vllm needs at least 1 GPU"):
        profiles.check(spec(gpusPerReplica=0))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"source": {}}, "exactly one of registry, huggingFace or uri"),
        ({"source": {"registry": "a", "uri": "s3://bucket/x"}}, "exactly one"),
        ({"replicas": -1}, r"spec.replicas"),
        ({"engine": "tgi"}, r"spec.engine"),
        ({"source": {"uri": "https://example.com/x"}}, r"spec.source.uri"),
        ({"runtimeClassName": "NVIDIA"}, r"spec.runtimeClassName"),
        ({"runtimeClassName": "nvidia_runtime"}, r"spec.runtimeClassName"),
        ({"runtimeClassName": "-nvidia"}, r"spec.runtimeClassName"),
        ({"runtimeClassName": ""}, r"spec.runtimeClassName"),
        ({"runtimeClassName": "n" * 64}, r"spec.runtimeClassName"),
    ],
)
def test_invalid_specs_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpec, match=message):
        spec(**fields)


def _llamacpp(*engine_args: str) -> list[str]:
    s = spec(engine="llamacpp", weightFormat="gguf", gpusPerReplica=0,
             source={"uri": "s3://models/gemma/gemma-3-270m.gguf"},
             engineArgs=list(engine_args))  # fmt: skip
    return list(container(rendering.deployment(OWNER, s, profiles.check(s)))["args"])


def _predict(args: list[str]) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg in ("-n", "--n-predict")]


@pytest.mark.parametrize(
    ("engine_args", "cap"),
    [
        ((), str(profiles.LLAMACPP_CONTEXT)),
        (("--ctx-size", "8192"), "8192"),
        (("-c", "2048", "--parallel", "2"), "2048"),
        (("--ctx-size=16384",), "16384"),
        (("-c", "0"), str(profiles.LLAMACPP_CONTEXT)),  # the model's own size: not known here
    ],
)
def test_llama_server_is_rendered_with_a_server_side_generation_cap(
    engine_args: tuple[str, ...], cap: str
) -> None:
    """A request's own ``n_predict`` cannot raise llama-server's ``--n-predict``: the cap that
    keeps an engine from generating past the context, whatever a request body says."""
    assert _predict(_llamacpp(*engine_args)) == [cap]


def test_a_user_n_predict_stands_alone() -> None:
    args = _llamacpp("--n-predict", "512")
    assert _predict(args) == ["512"]


def test_vllm_gets_no_llama_server_cap() -> None:
    s = spec()
    args = container(rendering.deployment(OWNER, s, profiles.check(s)))["args"]
    assert "--n-predict" not in args


def _registry_spec() -> Any:
    return spec(engine="llamacpp", weightFormat="gguf", gpusPerReplica=0,
                source={"registry": "gemma"})  # fmt: skip


REGISTRY = RegistryWeights(
    control_plane="http://cp:8081/",
    weights=ModelWeights(model_id="gemma", status="Ready", format="gguf",
                         files=(WeightFile(path="m.gguf", size=4, sha256="a" * 64),)),
)  # fmt: skip
HARDENING = [
    pytest.param(spec(), None, 0, id="vllm"),
    pytest.param(spec(engine="llamacpp", weightFormat="gguf", gpusPerReplica=0,
                      source={"uri": "s3://models/m.gguf"}), None, 1, id="llamacpp-s3"),
    pytest.param(_registry_spec(), REGISTRY, 1, id="registry"),
]  # fmt: skip


def pod_of(s: Any, registry: RegistryWeights | None = None) -> dict[str, Any]:
    return dict(
        rendering.deployment(OWNER, s, profiles.check(s), registry)["spec"]["template"]["spec"]
    )


def qos_class(pod: dict[str, Any]) -> str:
    """The QoS class Kubernetes gives ``pod`` (its rules, over CPU and memory)."""
    every = pod["containers"] + pod.get("initContainers", [])
    named = [(c.get("resources", {}), kind) for c in every for kind in ("cpu", "memory")]
    if not any(r.get("requests", {}).get(k) or r.get("limits", {}).get(k) for r, k in named):
        return "BestEffort"

    def pinned(resources: dict[str, Any], kind: str) -> bool:
        limit = resources.get("limits", {}).get(kind)
        return limit is not None and resources.get("requests", {}).get(kind, limit) == limit

    return "Guaranteed" if all(pinned(r, k) for r, k in named) else "Burstable"


@pytest.mark.parametrize(("s", "registry", "inits"), HARDENING)
def test_pods_meet_pod_security_restricted(
    s: Any, registry: RegistryWeights | None, inits: int
) -> None:
    pod = pod_of(s, registry)
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert len(pod.get("initContainers", [])) == inits
    for c in pod["containers"] + pod.get("initContainers", []):
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        }, c["name"]


@pytest.mark.parametrize(("s", "registry", "inits"), HARDENING)
def test_a_read_only_root_leaves_every_container_a_writable_home_and_tmp(
    s: Any, registry: RegistryWeights | None, inits: int
) -> None:
    pod = pod_of(s, registry)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"] == {"name": "shm", "emptyDir": {"medium": "Memory"}}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}}
    assert set(volumes) == {"models", "shm", "tmp"}
    for c in pod["containers"] + pod.get("initContainers", []):
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], c["name"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["HOME"] == "/tmp"
        assert env["USER"]  # torch's getpass.getuser() with no passwd entry for the uid


@pytest.mark.parametrize(
    ("s", "registry", "engine", "init"),
    [
        (spec(), None, {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1",
                        "ephemeral-storage": "256Mi"}, None),
        (_registry_spec(), REGISTRY, {"cpu": "500m", "memory": "1Gi",
                                      "ephemeral-storage": "256Mi"},
         {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "65Mi"}),  # 4 B + 64Mi, rounded up
    ],
)  # fmt: skip
def test_pods_without_resources_get_engine_requests_and_are_burstable(
    s: Any, registry: RegistryWeights | None, engine: dict[str, str], init: dict[str, str] | None
) -> None:
    pod = pod_of(s, registry)
    resources = pod["containers"][0]["resources"]
    assert resources["requests"] == engine
    assert set(resources.get("limits", {})) <= {"nvidia.com/gpu"}  # requests are floors only
    if init is not None:
        assert pod["initContainers"][0]["resources"] == {"requests": init}
    assert qos_class(pod) == "Burstable"


def test_resources_the_user_names_are_not_defaulted() -> None:
    s = spec(resources={"requests": {"cpu": "16"}, "limits": {"memory": "4Gi"}})
    resources = pod_of(s)["containers"][0]["resources"]
    # No memory request: one above the user's 4Gi limit would be refused, and Kubernetes makes
    # the request equal to the limit anyway.
    assert resources == {
        "requests": {"cpu": "16", "nvidia.com/gpu": "1", "ephemeral-storage": "256Mi"},
        "limits": {"memory": "4Gi", "nvidia.com/gpu": "1"},
    }


@pytest.mark.parametrize(("s", "registry", "inits"), HARDENING)
def test_a_deleted_engine_keeps_serving_until_the_gateways_let_it_go(
    s: Any, registry: RegistryWeights | None, inits: int
) -> None:
    """preStop sleeps (no binary needed in the image) for the default drain, within the grace
    period the kubelet gives, with time left for the engine to stop after SIGTERM."""
    pod = pod_of(s, registry)
    (engine,) = pod["containers"]
    assert engine["lifecycle"] == {"preStop": {"sleep": {"seconds": 30}}}
    assert pod["terminationGracePeriodSeconds"] == 30 + rollout.STOP_S


@pytest.mark.parametrize("drain", [rollout.ROUTING_DELAY_S, 300, rollout.MAX_DRAIN_S])
def test_the_drain_sets_the_sleep_and_the_grace_together(drain: int) -> None:
    """A long stream finishes within ``drainSeconds``: the kubelet sleeps that long before
    SIGTERM, and its grace period (which counts the sleep) outlasts it by the engine's stop."""
    s = spec(drainSeconds=drain)
    pod = rendering.deployment(OWNER, s, profiles.check(s))["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    assert engine["lifecycle"]["preStop"]["sleep"]["seconds"] == drain
    assert pod["terminationGracePeriodSeconds"] == drain + rollout.STOP_S


@pytest.mark.parametrize("drain", [0, rollout.ROUTING_DELAY_S - 1, rollout.MAX_DRAIN_S + 1])
def test_a_drain_too_short_to_leave_the_gateways_or_too_long_is_refused(drain: int) -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.drainSeconds"):
        spec(drainSeconds=drain)


def test_the_progress_deadline_outlasts_the_startup_probe() -> None:
    """A model still loading within its startup probe's budget is never ProgressDeadlineExceeded:
    the deadline is that budget plus the pull and the weights' fetch before it."""
    s = spec()
    d = rendering.deployment(OWNER, s, profiles.check(s))
    probe = container(d)["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    assert budget == rollout.STARTUP_BUDGET_S == 1800
    assert d["spec"]["progressDeadlineSeconds"] >= budget + 600
