"""The inventory report: what fleet-serving has seen in a cluster, as fleet-core receives it.

One report is a full snapshot, not a delta, so a lost PUT costs nothing but freshness. It carries
no totals: a receiver recomputes every count from the node list rather than trusting one (P6's
spirit applied to capacity), which is why there is no ``totalGpus`` field and never will be.

Evolution rules (ADR 0001): a new field gets a default; a field's type never changes; unknown
fields are tolerated on decode (never ``forbid_unknown_fields``); anything else is a new major.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "CardShare",
    "Endpoint",
    "Engine",
    "Gpu",
    "InventoryReport",
    "MigSlice",
    "ModelDeployment",
    "Node",
    "NodeLabels",
    "Phase",
    "WeightFormat",
]

SCHEMA_VERSION = 1
"""The major version written into every report this package encodes."""

SUPPORTED_SCHEMA_VERSIONS = (1,)
"""Majors this package can decode. A receiver answers anything else with the list."""

Engine = Literal["vllm", "llamacpp"]
WeightFormat = Literal["safetensors", "gguf"]
Phase = Literal["Pending", "Scheduling", "Ready", "Failed"]

NonNegative = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]
Name = Annotated[str, Meta(min_length=1)]
ComputeCapability = Annotated[str, Meta(pattern=r"^[0-9]+\.[0-9]+$")]
UtcTime = Annotated[datetime, Meta(tz=True)]
AdapterName = Annotated[str, Meta(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][\w.:/\-]*$")]


class CardShare(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """What part of one physical card a device is: ``numerator / denominator`` (since 1.4.0).

    A MIG slice ``1g.10gb`` of an H100 is 1/7 of the card (one of its seven compute slices); an
    A30's ``2g.12gb`` is 2/4. Exact, so a month's close over slices adds up to whole cards.
    """

    numerator: Annotated[int, Meta(ge=1, le=64)]
    denominator: Annotated[int, Meta(ge=1, le=64)]


class MigSlice(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """A MIG profile advertised by a node, e.g. ``1g.10gb`` × 7."""

    profile: Name
    count: NonNegative
    share: CardShare | None = None
    """Each slice's part of its card (since 1.4.0); None from older reporters, whose slices the
    control plane does not price."""


class Gpu(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """One kind of GPU on a node; ``count`` identical devices."""

    vendor: Name
    product: Name
    memory_mib: NonNegative
    count: NonNegative
    compute_capability: ComputeCapability | None = None
    """NVIDIA only (``major.minor``); None for other vendors."""
    mig_slices: tuple[MigSlice, ...] = ()
    resource: str | None = None
    """The extended resource the devices are advertised as (``nvidia.com/gpu``, ``amd.com/gpu``,
    ``huawei.com/Ascend910``…), since 1.2.0; None from older reporters (NVIDIA then)."""


class NodeLabels(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """The node labels placement and billing care about; the rest stay in the cluster."""

    zone: str | None = None
    instance_type: str | None = None


class Node(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """A cluster node as the operator saw it."""

    name: Name
    ready: bool
    schedulable: bool
    labels: NodeLabels = NodeLabels()
    gpus: tuple[Gpu, ...] = ()


class Endpoint(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """One replica's OpenAI base URL (a pod, not a Service VIP: the gateway picks, P3)."""

    url: Name
    ready: bool


class ModelDeployment(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """A FleetModel and what the cluster made of it."""

    name: Name
    namespace: Name
    served_model_name: Name
    engine: Engine
    weight_format: WeightFormat
    gpus_per_replica: NonNegative
    desired_replicas: NonNegative
    ready_replicas: NonNegative
    phase: Phase
    reason: str = ""
    endpoints: tuple[Endpoint, ...] = ()
    registry_model: str | None = None
    """The registry model id when the FleetModel's source is ``registry:`` (since 1.1.0), so the
    control plane knows which models are in use."""
    accelerator: str | None = None
    """The extended resource each replica asks ``gpusPerReplica`` of (``nvidia.com/gpu``,
    ``nvidia.com/mig-1g.10gb``, ``amd.com/gpu``, ``huawei.com/Ascend910``), since 1.4.0; None from
    older reporters (``nvidia.com/gpu`` then)."""
    gpu_share: CardShare | None = None
    """When the accelerator is part of a card (a MIG slice), what part each device is (since
    1.4.0); None for whole cards."""
    adapters: tuple[AdapterName, ...] = ()
    """LoRA adapters the endpoints serve beside ``servedModelName`` (since 1.4.0): each is a model
    name clients may send, routed to the same endpoints and billed under its own name."""


class InventoryReport(msgspec.Struct, kw_only=True, frozen=True, rename="camel"):
    """The body of ``PUT /api/v1/inventory``: a full snapshot of one cluster.

    Beyond the types, the control plane accepts a report only within bounds it owns (ADR 0020):
    ``observed_at`` at most 2 minutes ahead of its clock, at most 15 minutes behind the
    cluster's newest accepted report, and after the last closed cost period (400
    ``observed_at_out_of_range``); each served model name and endpoint URL inside the admin's
    binding of the cluster (403 ``outside_binding``, naming the field), endpoint URLs being plain
    base URLs (http/https, no credentials, query, fragment or path beyond ``/``).
    """

    schema_version: Positive
    cluster_id: Name
    observed_at: UtcTime
    reporter_version: Name
    nodes: tuple[Node, ...] = ()
    deployments: tuple[ModelDeployment, ...] = ()
    report_interval_seconds: Annotated[float, Meta(gt=0, le=86400)] | None = None
    """How often the reporter sends a heartbeat (since 1.3.0). The control plane refuses a
    report whose interval is longer than a sample vouches for capacity, rather than count the
    rest of every interval as unobserved without a word."""
