"""Desired objects for a FleetModel: pure functions from a spec to Kubernetes dicts.

Nothing here talks to an API, reads a clock or the environment, so every field is unit-tested.
The renderers produce the whole desired state of what the operator owns (a Deployment, a Service
and a PodDisruptionBudget per FleetModel); :mod:`fleet_serving.applying` compares it with what is
in the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from fleet_serving import adapters, caching, devices, images, profiles, rollout, sources
from fleet_serving.adapters import ResolvedAdapter
from fleet_serving.profiles import EngineProfile
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import DEFAULT_ENGINE_KEY, GROUP, KIND, VERSION, FleetModelSpec

__all__ = [
    "MODEL_LABEL",
    "Owner",
    "common_labels",
    "deployment",
    "disruption_budget",
    "gpu_affinity",
    "rollout_strategy",
    "service",
]

MODEL_LABEL = f"{GROUP}/model"
"""Set on every object the operator makes; its value is the FleetModel's name."""
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
Obj = dict[str, Any]

RUN_AS = 65532
"""The uid and gid of every rendered container, as in Fleet's own images and the test engine
image. Set, not left to the image: the upstream vLLM and llama.cpp images run as root, which
``runAsNonRoot`` alone would have the kubelet refuse."""
SCRATCH_DIR = "/tmp"
"""An emptyDir in every container, and its ``HOME``: the root filesystem is read-only, and
engines write caches under ``~`` (vLLM: ``~/.cache``, ``~/.config``, triton and torch's compile
caches) and temporary files (the fetch script's ``mktemp``)."""
FETCH_REQUESTS = {"cpu": "100m", "memory": "256Mi"}
"""An init container's requests: a copier streaming to disk (``aws s3 cp``'s multipart buffers,
curl) needs little, and what it needs is reserved before the engine's."""


def _pod_security() -> Obj:
    """The pod's securityContext: Pod Security's ``restricted`` level, as a fixed non-root user
    whose group owns the pod's volumes."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }


def _scratch_mount() -> Obj:
    return {"name": "tmp", "mountPath": SCRATCH_DIR}


def _scratch_env() -> list[Obj]:
    """``USER`` too: with no passwd entry for `RUN_AS`, ``getpass.getuser()`` raises, and torch
    calls it for its compile cache whatever its cache variables say."""
    return [{"name": "HOME", "value": SCRATCH_DIR}, {"name": "USER", "value": "fleet"}]


class Owner(msgspec.Struct, kw_only=True, frozen=True):
    """The FleetModel that owns what is rendered (for ownerReferences and names)."""

    name: str
    namespace: str
    uid: str


def common_labels(name: str) -> dict[str, str]:
    """Labels on every owned object: the selector, plus the recommended app.kubernetes.io set."""
    return {
        "app.kubernetes.io/name": "fleet-model",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "fleet-serving",
        MODEL_LABEL: name,
    }


def _metadata(owner: Owner) -> Obj:
    reference = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "name": owner.name,
        "namespace": owner.namespace,
        "labels": common_labels(owner.name),
        "ownerReferences": [reference],
    }


def gpu_affinity(minimum: tuple[int, int]) -> Obj:
    """Required node affinity to GPUs of compute capability ≥ ``minimum`` (GFD node labels),
    or of unknown compute: a node without GPU feature discovery has no labels, and unknown is
    not too old (placement says the check was skipped).

    Node selector terms are ORed and a term's expressions ANDed: major > M, or major = M and
    minor ≥ m, or no major label. ``Gt`` is strict, hence ``m - 1``.
    """
    major, minor = minimum
    above = {"key": COMPUTE_MAJOR, "operator": "Gt", "values": [str(major)]}
    same = {"key": COMPUTE_MAJOR, "operator": "In", "values": [str(major)]}
    enough = {"key": COMPUTE_MINOR, "operator": "Gt", "values": [str(minor - 1)]}
    unlabelled = {"key": COMPUTE_MAJOR, "operator": "DoesNotExist"}
    terms = [{"matchExpressions": [above]}, {"matchExpressions": [same, enough]},
             {"matchExpressions": [unlabelled]}]  # fmt: skip
    required = {"nodeSelectorTerms": terms}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def _resources(spec: FleetModelSpec, profile: EngineProfile) -> Obj:
    """The user's requests and limits; a CPU or memory named in neither gets the profile's
    request (a default request above a user's limit would be refused)."""
    requests: dict[str, str] = dict(spec.resources.requests)
    limits: dict[str, str] = dict(spec.resources.limits)
    defaults = {"cpu": profile.cpu_request, "memory": profile.memory_request}
    for name, value in defaults.items():
        if name not in requests and name not in limits:
            requests[name] = value
    if spec.gpus_per_replica:
        device = devices.resource_name(spec)
        requests[device] = limits[device] = str(spec.gpus_per_replica)
    return {k: v for k, v in {"requests": requests, "limits": limits}.items() if v}


def _probes(profile: EngineProfile) -> Obj:
    check = {"httpGet": {"path": profile.health_path, "port": "http"}}
    startup = {
        "periodSeconds": rollout.STARTUP_PERIOD_S,
        "failureThreshold": rollout.STARTUP_FAILURES,
    }
    return {
        # Loading weights can take many minutes; the startup probe holds the others off.
        "startupProbe": check | startup,
        "readinessProbe": check | {"periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": check | {"periodSeconds": 15, "failureThreshold": 4},
    }


def _cache_env(spec: FleetModelSpec) -> list[Obj]:
    """Hub downloads go to the pod's model volume, not the container's writable layer
    (``HF_HOME`` for vLLM, ``LLAMA_CACHE`` for llama.cpp's ``--hf-repo``), with the token of a
    gated model from its Secret."""
    if spec.source.hugging_face is None:
        return []
    env: list[Obj] = [
        {"name": "HF_HOME", "value": f"{profiles.MODEL_DIR}/.cache/huggingface"},
        {"name": "LLAMA_CACHE", "value": f"{profiles.MODEL_DIR}/.cache/llama.cpp"},
    ]
    token = spec.hf_token_secret
    if token is not None:
        ref = {"name": token.name, "key": token.key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def _container(
    spec: FleetModelSpec, profile: EngineProfile, registry: RegistryWeights | None
) -> Obj:
    secret = spec.api_key_secret or DEFAULT_ENGINE_KEY
    key_ref = {"name": secret.name, "key": secret.key}
    device = devices.device_profile(spec) if spec.gpus_per_replica else None
    command = device.command.get(profile.engine) if device and not spec.image else None
    return {
        "name": "engine",
        "image": profiles.image_for(spec, profile),
        **({"command": command} if command else {}),
        "args": profiles.engine_args(spec, profile, registry),
        "ports": [{"name": "http", "containerPort": profile.port, "protocol": "TCP"}],
        "env": [
            {"name": profile.api_key_env, "valueFrom": {"secretKeyRef": key_ref}},
            *_cache_env(spec),
            *_scratch_env(),
            *({"name": k, "value": v} for k, v in (device.env if device else ())),
        ],
        "resources": caching.engine_storage(spec, _resources(spec, profile)),
        "securityContext": _container_security(),
        "lifecycle": {"preStop": {"sleep": {"seconds": spec.drain_seconds}}},
        "volumeMounts": [
            *caching.engine_mounts(spec, profiles.MODEL_DIR),
            {"name": "shm", "mountPath": "/dev/shm"},
            _scratch_mount(),
            *(devices.volume_mounts(device) if device else []),
        ],
    } | _probes(profile)


def _fetcher(
    spec: FleetModelSpec, registry: RegistryWeights | None, fetch: images.FetchImages
) -> list[Obj]:
    """An init container filling the shared model volume from an ``s3://`` or ``registry:``
    source, in the spec's ``fetchImage`` else the operator's; a Hugging Face source is fetched by
    the engine itself."""
    if registry is not None:
        fetcher = _registry_fetcher(spec, registry) | {"image": spec.fetch_image or fetch.registry}
    elif spec.source.uri is not None:
        fetcher = _s3_fetcher(spec, spec.source.uri) | {"image": spec.fetch_image or fetch.s3}
    else:
        return []
    mounts = [*caching.fetch_mounts(spec, profiles.MODEL_DIR), _scratch_mount()]
    resources = caching.fetch_storage(spec, registry, {"requests": dict(FETCH_REQUESTS)})
    return [
        fetcher
        | {
            "resources": resources,
            "securityContext": _container_security(),
            "volumeMounts": mounts,
        }
    ]


def _with_adapters(
    pod: Obj, spec: FleetModelSpec, resolved: Sequence[ResolvedAdapter], fetch: images.FetchImages
) -> Obj:
    """The adapters' engine flags, before the user's own engineArgs (which may override them),
    and an init container fetching their files from the registry (:mod:`fleet_serving.adapters`)
    into the ``models`` volume, whose bound grows by their size."""
    if not resolved:
        return pod
    (engine,) = pod["containers"]
    cut = len(engine["args"]) - len(spec.engine_args)
    flags = adapters.engine_args(spec, resolved, model_dir=profiles.MODEL_DIR)
    engine["args"] = [*engine["args"][:cut], *flags, *engine["args"][cut:]]
    size = sum(f.size for adapter in resolved for f in adapter.registry.weights.files)
    fetcher = _registry_fetcher(spec, resolved[0].registry) | {
        "name": "fetch-adapters",
        "image": spec.fetch_image or fetch.registry,
        "args": adapters.fetch_args(resolved),
        "resources": caching.with_storage({"requests": dict(FETCH_REQUESTS)}, size),
        "securityContext": _container_security(),
        "volumeMounts": [*caching.fetch_mounts(spec, profiles.MODEL_DIR), _scratch_mount()],
    }
    pod["initContainers"] = [*pod.get("initContainers", []), fetcher]
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    bound = models["emptyDir"].get("sizeLimit")
    if bound is not None and spec.model_volume.cache_claim is None:
        models["emptyDir"]["sizeLimit"] = caching.quantity(caching.parse_quantity(bound) + size)
    return pod


def _registry_fetcher(spec: FleetModelSpec, registry: RegistryWeights) -> Obj:
    return {
        "name": "fetch-weights",
        "command": ["sh", "-c", caching.fetch_script(spec), "fetch-weights"],
        "args": sources.fetch_args(registry),
        "env": [
            {"name": "MODEL_DIR", "value": profiles.MODEL_DIR},
            *caching.fetch_env(spec),
            sources.token_env(registry),
            *_scratch_env(),
        ],
    }


def _s3_fetcher(spec: FleetModelSpec, uri: str) -> Obj:
    if spec.weight_format == "gguf":
        target, extra = f"{profiles.MODEL_DIR}/model.gguf", []
    else:
        target, extra = profiles.MODEL_DIR, ["--recursive"]
    fetcher: Obj = {
        "name": "fetch-weights",
        "args": ["s3", "cp", uri, target, *extra],
        "env": _scratch_env(),
    }
    if spec.source.credentials_secret:
        fetcher["envFrom"] = [{"secretRef": {"name": spec.source.credentials_secret}}]
    return fetcher


def _tolerations(spec: FleetModelSpec) -> list[Obj]:
    given = [
        {k: v for k, v in msgspec.to_builtins(t).items() if v is not None} for t in spec.tolerations
    ]
    if spec.gpus_per_replica:
        device = devices.resource_name(spec)
        given.append({"key": device, "operator": "Exists", "effect": "NoSchedule"})
    return given


def _pod_spec(
    owner: Owner,
    spec: FleetModelSpec,
    profile: EngineProfile,
    registry: RegistryWeights | None,
    *,
    fetch: images.FetchImages,
) -> Obj:
    pod: Obj = {
        "containers": [_container(spec, profile, registry)],
        "initContainers": _fetcher(spec, registry, fetch),
        "imagePullSecrets": [{"name": s.name} for s in spec.image_pull_secrets],
        "securityContext": _pod_security() | caching.pod_security(spec),
        "volumes": [
            *caching.volumes(spec, registry),
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            caching.scratch_volume(),
            *(devices.host_volumes(devices.device_profile(spec)) if spec.gpus_per_replica else []),
        ],
        "nodeSelector": dict(spec.node_selector),
        "tolerations": _tolerations(spec),
        "runtimeClassName": spec.runtime_class_name,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": rollout.termination_grace(spec.drain_seconds),
    }
    if profile.min_compute is not None and devices.device_profile(spec).nvidia_compute:
        pod["affinity"] = gpu_affinity(profile.min_compute)
    # The API server drops empty lists and maps, and unset fields; rendering them would look like
    # drift forever.
    return {k: v for k, v in pod.items() if v is not None and v != [] and v != {}}


def rollout_strategy(spec: FleetModelSpec) -> Obj:
    """How the Deployment replaces its pods when its spec changes.

    A one-replica model, and any model without GPUs (``gpusPerReplica: 0``), rolls with
    maxSurge 1 / maxUnavailable 0: the new pod must be Ready before the old one goes, so a rollout
    is never an outage. A one-replica GPU model therefore needs a spare GPU to roll; without one
    the new pod stays Unschedulable, the old one keeps serving, and the status says why. A GPU
    model with two or more replicas rolls with maxSurge 0 / maxUnavailable 1: GPUs are scarce, so
    a pod is replaced before its successor starts, while the others serve.
    """
    if spec.replicas < 2 or not spec.gpus_per_replica:
        surge, unavailable = 1, 0
    else:
        surge, unavailable = 0, 1
    rolling = {"maxSurge": surge, "maxUnavailable": unavailable}
    return {"type": "RollingUpdate", "rollingUpdate": rolling}


def deployment(
    owner: Owner,
    spec: FleetModelSpec,
    profile: EngineProfile,
    registry: RegistryWeights | None = None,
    resolved_adapters: Sequence[ResolvedAdapter] = (),
    *,
    fetch: images.FetchImages = images.DEFAULT,
) -> Obj:
    """The Deployment running ``spec.replicas`` engine pods. A ``registry:`` source needs
    ``registry``, the resolved model (:mod:`fleet_serving.sources`); ``spec.adapters`` need
    ``resolved_adapters``, theirs; ``fetch``: the operator's init container images."""
    if spec.source.registry is not None and registry is None:
        raise ValueError("a registry: source is rendered only once resolved")
    if len(resolved_adapters) != len(spec.adapters):
        raise ValueError("spec.adapters are rendered only once resolved")
    labels = common_labels(owner.name)
    # Scrape annotations only where /metrics answers without the engine's key (vLLM): a
    # llama-server behind --api-key answers 401, so scraping it needs the key (a ServiceMonitor
    # with the Secret as its bearer token), not annotations.
    annotations = (
        {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(profile.port),
            "prometheus.io/path": "/metrics",
        }
        if profile.metrics_open
        else {}
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner),
        "spec": {
            "replicas": spec.replicas,
            "progressDeadlineSeconds": rollout.PROGRESS_DEADLINE_S,
            "selector": {"matchLabels": {MODEL_LABEL: owner.name}},
            "strategy": rollout_strategy(spec),
            "template": {
                "metadata": {"labels": labels}
                | ({"annotations": annotations} if annotations else {}),
                "spec": _with_adapters(
                    _pod_spec(owner, spec, profile, registry, fetch=fetch),
                    spec,
                    resolved_adapters,
                    fetch,
                ),
            },
        },
    }


def service(owner: Owner, profile: EngineProfile) -> Obj:
    """The Service naming the pods; the gateway reads pod URLs from its EndpointSlices (P3)."""
    port = {"name": "http", "port": profile.port, "targetPort": "http", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": {MODEL_LABEL: owner.name},
            "ports": [port],
            # Not ``publishNotReadyAddresses: false``: the default, which a real API server
            # omits (omitempty), so rendering it would look like drift at every resync.
        },
    }


def disruption_budget(owner: Owner) -> Obj:
    """The PodDisruptionBudget of the model's pods: a drain evicts at most one at a time.

    ``maxUnavailable: 1``, not ``minAvailable: 1``: the latter on a one-replica model would refuse
    every eviction, and a node drain would wait on it forever. A pod that is not Ready (crash
    looping, still loading) may always be evicted (``AlwaysAllow``), so it never blocks a drain.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner),
        "spec": {
            "selector": {"matchLabels": {MODEL_LABEL: owner.name}},
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
