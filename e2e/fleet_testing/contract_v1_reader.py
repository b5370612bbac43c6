"""A frozen copy of the v1.0.0 report types: the oldest reader still in service.

Never edit this file. It stands for a fleet-core that was built against fleet-contract 1.0.0 and
is now receiving reports from a newer fleet-serving; the tests encode with the current package and
decode with this, which is the direction msgspec's schema-evolution rules are about.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec


class MigSlice(msgspec.Struct, kw_only=True, rename="camel"):
    profile: str
    count: int


class Gpu(msgspec.Struct, kw_only=True, rename="camel"):
    vendor: str
    product: str
    memory_mib: int
    count: int
    compute_capability: str | None = None
    mig_slices: list[MigSlice] = []


class NodeLabels(msgspec.Struct, kw_only=True, rename="camel"):
    zone: str | None = None
    instance_type: str | None = None


class Node(msgspec.Struct, kw_only=True, rename="camel"):
    name: str
    ready: bool
    schedulable: bool
    labels: NodeLabels = msgspec.field(default_factory=NodeLabels)
    gpus: list[Gpu] = []


class Endpoint(msgspec.Struct, kw_only=True, rename="camel"):
    url: str
    ready: bool


class ModelDeployment(msgspec.Struct, kw_only=True, rename="camel"):
    name: str
    namespace: str
    served_model_name: str
    engine: Literal["vllm", "llamacpp"]
    weight_format: Literal["safetensors", "gguf"]
    gpus_per_replica: int
    desired_replicas: int
    ready_replicas: int
    phase: Literal["Pending", "Scheduling", "Ready", "Failed"]
    reason: str = ""
    endpoints: list[Endpoint] = []


class InventoryReport(msgspec.Struct, kw_only=True, rename="camel"):
    schema_version: int
    cluster_id: str
    observed_at: datetime
    reporter_version: str
    nodes: list[Node] = []
    deployments: list[ModelDeployment] = []


decoder = msgspec.json.Decoder(InventoryReport)
