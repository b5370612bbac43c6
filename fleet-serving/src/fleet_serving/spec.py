"""The FleetModel API types: the single source of truth for the spec, the status and the CRD.

``fleet_serving.crd`` generates the CustomResourceDefinition's OpenAPI schema from these Structs,
and the handlers decode ``spec`` with them, so the schema the API server enforces and the types
the operator trusts cannot drift apart (a test regenerates ``deploy/base/crd.yaml`` and compares).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from fleet_contract import Engine, Phase, WeightFormat
from fleet_serving import rollout
from fleet_serving.errors import InvalidSpec
from fleet_serving.images import PinnedImage

__all__ = [
    "DEFAULT_ENGINE_KEY",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Accelerator",
    "Adapter",
    "AdapterSource",
    "Condition",
    "FleetModelSpec",
    "FleetModelStatus",
    "HfTokenRef",
    "HuggingFaceSource",
    "LocalObjectReference",
    "ModelVolume",
    "Resources",
    "SecretKeyRef",
    "Source",
    "Toleration",
    "check_name",
    "decode_spec",
]

GROUP = "serving.fleet.dev"
"""The API group (ADR 0005): named after the deployable that owns it, under the project's domain."""
VERSION = "v1alpha1"
KIND = "FleetModel"
PLURAL = "fleetmodels"
SINGULAR = "fleetmodel"
SHORT_NAMES = ("fm",)

NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE = (
    "metadata.name names the model's Service, so it must be a DNS-1035 label: at most 63 "
    "lowercase letters, digits or '-', starting with a letter and not ending with '-' "
    "(e.g. llama-3-1-8b; the model keeps its own name in spec.servedModelName)"
)

NonNegative = Annotated[int, Meta(ge=0)]
Text = Annotated[str, Meta(min_length=1, max_length=253)]
Quantity = Annotated[str, Meta(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")]
S3Uri = Annotated[str, Meta(pattern=r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")]
Dns1123Label = Annotated[
    str, Meta(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
"""A Kubernetes name that must be a DNS-1123 label (a RuntimeClass's, for one)."""
Dns1123Subdomain = Annotated[
    str, Meta(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
"""A Kubernetes object name (a PersistentVolumeClaim's, for one)."""
VolumeSize = Annotated[str, Meta(pattern=r"^[1-9][0-9]{0,4}(Mi|Gi|Ti)$")]
"""A volume size, bounded by its spelling: 1Mi to 99999Ti, in whole binary units."""


class HuggingFaceSource(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """A Hugging Face repository, pinned to a revision (a branch, tag or commit)."""

    repo: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")]
    revision: Text = "main"


class Source(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """Where the weights come from: exactly one of the three."""

    registry: Text | None = None
    """A model id in Fleet's model registry."""
    hugging_face: HuggingFaceSource | None = None
    uri: S3Uri | None = None
    """An ``s3://bucket/prefix`` holding the weights."""
    credentials_secret: Text | None = None
    """For ``uri``: a Secret whose keys become the copier's environment (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, and AWS_ENDPOINT_URL / AWS_REGION for a store other than AWS)."""


class SecretKeyRef(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """A key of a Secret in the FleetModel's namespace."""

    name: Text
    key: Text = "api-key"


class HfTokenRef(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """The key of a Secret, in the FleetModel's namespace, holding a Hugging Face token."""

    name: Text
    key: Text = "token"


DEFAULT_ENGINE_KEY = SecretKeyRef(name="fleet-engine-key", key="api-key")
"""The engine key of every FleetModel that names none: one Secret per namespace, which the gateway
mounts too and sends to every engine it discovers (ADR 0010)."""


class LocalObjectReference(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """An object in the FleetModel's namespace, by name (a pull Secret)."""

    name: Annotated[
        str, Meta(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    ]


class Resources(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """CPU and memory for each replica's container; GPUs come from ``gpusPerReplica``."""

    requests: dict[str, Quantity] = {}
    limits: dict[str, Quantity] = {}


MigProfile = Annotated[str, Meta(max_length=32, pattern=r"^[1-9]g\.[0-9]+gb(\+me)?$")]


class Accelerator(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """What ``gpusPerReplica`` counts: whole cards of a vendor, or NVIDIA MIG slices."""

    vendor: Literal["nvidia", "amd", "huawei"] = "nvidia"
    """``nvidia`` (``nvidia.com/gpu``), ``amd`` (``amd.com/gpu``, ROCm) or ``huawei`` (Ascend
    NPUs, ``huawei.com/Ascend910``)."""
    mig_profile: MigProfile | None = None
    """NVIDIA only: ask for MIG slices ``nvidia.com/mig-<profile>`` (e.g. ``1g.10gb``) instead of
    whole GPUs."""


class ModelVolume(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """Where ``/models`` is kept: a shared cache on a claim, or the pod's own bounded emptyDir."""

    cache_claim: Dns1123Subdomain | None = None
    """A PersistentVolumeClaim in the model's namespace (ReadWriteMany for replicas on several
    nodes) holding a cache of registry files by sha256: a file is downloaded once per claim, not
    once per pod. ``registry:`` sources only (ADR 0027)."""
    size_limit: VolumeSize | None = None
    """The emptyDir's ``sizeLimit`` and the writer's ``ephemeral-storage`` request, for a source
    whose size is not known before it is fetched (``huggingFace``, ``uri``); a ``registry:``
    model's is its files' total plus headroom unless given. Unused with ``cacheClaim``, where
    the emptyDir holds only links."""


MAX_ADAPTERS = 16
"""The most LoRA adapters one FleetModel lists: each is loaded in every replica (llama.cpp keeps
all of them in memory; vLLM reserves a slot per adapter it batches), and each is a model name."""
AdapterName = Annotated[str, Meta(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][\w.:/\-]*$")]
"""The contract's adapter name: what clients send as ``model`` (no ``=``, space or comma, which
the engines' flags would split on)."""


class AdapterSource(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """Where an adapter's weights come from: a model id in Fleet's registry (sha256-checked)."""

    registry: Text


class Adapter(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """A LoRA adapter served beside the base model, under its own model name."""

    name: AdapterName
    source: AdapterSource
    rank: Annotated[int, Meta(ge=1, le=512)] | None = None
    """vLLM: the adapter's LoRA rank, when above 16 (vLLM's default ``--max-lora-rank``)."""


class Toleration(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """A Pod toleration, as Kubernetes spells it."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: NonNegative | None = None


class FleetModelSpec(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """What a platform team asks for: a model, an engine, and how many replicas of what size."""

    served_model_name: Text
    """The name clients send as ``model``; the engine serves under it."""
    source: Source
    weight_format: WeightFormat
    engine: Engine
    replicas: NonNegative = 1
    gpus_per_replica: Annotated[int, Meta(ge=0, le=16)] = 1
    accelerator: Accelerator = Accelerator()
    engine_args: list[str] = []
    """Extra engine flags, appended after the ones the operator sets."""
    resources: Resources = Resources()
    node_selector: dict[str, str] = {}
    tolerations: list[Toleration] = []
    image: Text | None = None
    """An engine image to run instead of the profile's default."""
    api_key_secret: SecretKeyRef | None = None
    """The Secret holding the engine's API key; default: the namespace's ``fleet-engine-key``,
    key ``api-key``, which the gateway mounts too (ADR 0010)."""
    weight_file: (
        Annotated[str, Meta(min_length=1, max_length=253, pattern=r"^[^/].*\.gguf$")] | None
    ) = None
    """For GGUF: the file to serve from a repository or registry model holding several
    quantizations (e.g. ``Qwen3-8B-Q4_K_M.gguf``; a split model's first part). Only it, and its
    split siblings, is fetched."""
    hf_token_secret: HfTokenRef | None = None
    """A Secret key holding a Hugging Face token (``HF_TOKEN``), for gated models; key
    ``token`` unless named."""
    fetch_image: PinnedImage | None = None
    """For ``registry:`` and ``uri:`` sources: the weight fetcher's image instead of the
    operator's (a mirror's copy; see docs/operator.md, "Air-gapped clusters")."""
    image_pull_secrets: Annotated[list[LocalObjectReference], Meta(max_length=16)] = []
    """Secrets, in the FleetModel's namespace, the kubelet pulls the pod's images with."""
    runtime_class_name: Dns1123Label | None = None
    """The pods' RuntimeClass, e.g. ``nvidia`` on k3s, which registers the NVIDIA runtime as one."""
    model_volume: ModelVolume = ModelVolume()
    drain_seconds: Annotated[int, Meta(ge=rollout.ROUTING_DELAY_S, le=rollout.MAX_DRAIN_S)] = (
        rollout.DEFAULT_DRAIN_S
    )
    """How long a deleted pod keeps serving before its engine is stopped: set it to the longest
    stream clients expect (``max_tokens`` over tokens per second). Every deletion waits it out."""
    adapters: Annotated[list[Adapter], Meta(max_length=MAX_ADAPTERS)] = []
    """LoRA adapters served by the same replicas, each under its own model name
    (:mod:`fleet_serving.adapters`)."""


class Condition(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """A Kubernetes-style condition (``Ready``, ``Scheduled``)."""

    type: Text
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""


class FleetModelStatus(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """What the operator observed; written to the status subresource only."""

    phase: Phase = "Pending"
    reason: str = ""
    message: str = ""
    replicas: NonNegative = 0
    ready_replicas: NonNegative = 0
    endpoints: list[str] = []
    observed_generation: NonNegative = 0
    conditions: list[Condition] = []


def decode_spec(spec: Mapping[str, Any]) -> FleetModelSpec:
    """Validate a FleetModel's spec; the API server checks the schema, this checks the rest."""
    try:
        decoded = msgspec.convert(dict(spec), FleetModelSpec)
    except msgspec.ValidationError as exc:
        problem, _, where = str(exc).partition(" - at `$")
        field = "spec" + where.rstrip("`") if where else "spec"
        raise InvalidSpec(f"{field}: {problem}") from exc
    chosen = [s for s in ("registry", "hugging_face", "uri") if getattr(decoded.source, s)]
    if len(chosen) != 1:
        raise InvalidSpec("spec.source needs exactly one of registry, huggingFace or uri")
    if decoded.fetch_image and decoded.source.hugging_face:
        raise InvalidSpec(
            "spec.fetchImage is for registry and uri sources: a huggingFace source is fetched "
            "by the engine itself"
        )
    if decoded.accelerator.mig_profile and decoded.accelerator.vendor != "nvidia":
        raise InvalidSpec("spec.accelerator.migProfile is NVIDIA MIG: it needs vendor nvidia")
    if decoded.model_volume.cache_claim and decoded.source.registry is None:
        raise InvalidSpec(
            "spec.modelVolume.cacheClaim needs a registry: source (the cache is keyed by the "
            "registry's sha256 of each file)"
        )
    return decoded


def check_name(name: str) -> None:
    """A FleetModel's name becomes its Service's, which must be a DNS-1035 label: ``7b`` or
    ``llama-3.1-8b`` would be refused by the API server (422) after the Deployment was made. The
    CRD has the same rule (CEL); this catches objects made before it, or without it."""
    if len(name) > 63 or re.match(NAME_PATTERN, name) is None:
        raise InvalidSpec(f"{name!r}: {NAME_RULE}")
