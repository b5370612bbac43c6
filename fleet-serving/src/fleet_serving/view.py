"""The operator's view of the cluster, fed by watch events and read by status and the report.

Handlers put what they see here (nodes, FleetModels, Deployments, EndpointSlices, unschedulable
pods); the inventory report and each FleetModel's status are pure functions of a snapshot of it.
It lives in kopf's memo, one per operator, never in a module global. Every mutation sets
``changed`` so the reporter wakes up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

import fleet_serving
from fleet_contract import SCHEMA_VERSION, Endpoint, InventoryReport, ModelDeployment
from fleet_serving import devices, observing, placement, profiles, statuses
from fleet_serving.errors import InvalidSpec
from fleet_serving.observing import ObservedNode
from fleet_serving.spec import FleetModelSpec, FleetModelStatus, check_name, decode_spec

__all__ = ["ClusterView", "ModelView", "SourceIssue"]

Key = tuple[str, str]
"""(namespace, name)"""


class ModelView(msgspec.Struct, kw_only=True, frozen=True):
    """A FleetModel as last seen: its decoded spec (or why it is invalid) and published status."""

    name: str
    namespace: str
    generation: int
    spec: FleetModelSpec | None
    error: str | None
    status: FleetModelStatus


_status_decoder = msgspec.json.Decoder(FleetModelStatus)


def model_view(body: Mapping[str, Any], host_mounts: frozenset[str] = frozenset()) -> ModelView:
    """Decode a FleetModel object; an invalid spec is kept with its reason. ``host_mounts``: the
    namespaces where a device mounted from the host may run (:func:`devices.check_namespace`)."""
    meta = body.get("metadata") or {}
    spec: FleetModelSpec | None = None
    error: str | None = None
    try:
        check_name(meta["name"])
        spec = decode_spec(body.get("spec") or {})
        profiles.check(spec)
        if spec.gpus_per_replica:
            namespace = meta.get("namespace") or "default"
            devices.check_namespace(devices.device_profile(spec), namespace, host_mounts)
    except InvalidSpec as exc:
        error = str(exc)
    try:
        status = msgspec.convert(dict(body.get("status") or {}), FleetModelStatus)
    except msgspec.ValidationError:
        status = FleetModelStatus()  # someone else's garbage; ours replaces it
    return ModelView(
        name=meta["name"],
        namespace=meta.get("namespace") or "default",
        generation=int(meta.get("generation") or 0),
        spec=spec,
        error=error,
        status=status,
    )


class SourceIssue(msgspec.Struct, frozen=True):
    """Why a ``registry:`` model cannot be rendered: its files cannot be fetched yet
    (``permanent`` False: Pending), or they can never serve as specified (True: Failed)."""

    message: str
    permanent: bool


class ClusterView:
    """Mutable observed state; one instance per operator process."""

    def __init__(self, *, host_mounts: frozenset[str] = frozenset()) -> None:
        self.host_mounts = host_mounts
        """Namespaces where accelerators whose driver is mounted from the host may run."""
        self.nodes: dict[str, ObservedNode] = {}
        self.models: dict[Key, ModelView] = {}
        self.bodies: dict[Key, Mapping[str, Any]] = {}
        """Each FleetModel's object as last seen, for the operator-wide resync."""
        self.deployments: dict[Key, observing.DeploymentFacts] = {}
        self.slices: dict[Key, tuple[str, tuple[Endpoint, ...]]] = {}
        self.pod_problems: dict[Key, dict[str, tuple[str, str]]] = {}
        """(reason, message) by pod name, for the model's pods that do not start."""
        self.source_issues: dict[Key, SourceIssue] = {}
        """What resolving a ``registry:`` source last found wrong, while it is so."""
        self.apply_issues: dict[Key, tuple[str, str]] = {}
        """(reason, message) of why a model's objects could not be applied, while it is so."""
        self.unchecked: dict[Key, tuple[str, ...]] = {}
        """Nodes whose compute could not be checked for a model, as last said in its log."""
        self.changed = asyncio.Event()
        self._placements: dict[tuple[Any, ...], str | None] = {}
        """Placement reasons by what they depend on; cleared when any node changes."""

    def _touch(self, changed: bool) -> bool:
        if changed:
            self.changed.set()
        return changed

    def put_node(self, body: Mapping[str, Any], *, deleted: bool) -> bool:
        """Record a node; True when what placement and the report see has changed.

        Nodes are modified every few seconds by their kubelet's heartbeat; those events change
        nothing observed here and must not cost a report or a status refresh.
        """
        name = body["metadata"]["name"]
        before = self.nodes.get(name)
        if deleted:
            self.nodes.pop(name, None)
            after = None
        else:
            after = self.nodes[name] = observing.observe_node(body)
        if before != after:
            self._placements.clear()
        return self._touch(before != after)

    def put_model(self, body: Mapping[str, Any], *, deleted: bool) -> ModelView | None:
        seen = model_view(body, self.host_mounts)
        key = (seen.namespace, seen.name)
        if deleted:
            self.source_issues.pop(key, None)
            self.apply_issues.pop(key, None)
            self.unchecked.pop(key, None)
            self.bodies.pop(key, None)
            self._touch(self.models.pop(key, None) is not None)
            return None
        self._touch(self.models.get(key) != seen)
        self.models[key] = seen
        self.bodies[key] = body
        return seen

    def put_deployment(self, key: Key, body: Mapping[str, Any], *, deleted: bool) -> bool:
        before = self.deployments.get(key)
        if deleted:
            self.deployments.pop(key, None)
        else:
            self.deployments[key] = observing.deployment_facts(body)
        return self._touch(before != self.deployments.get(key))

    def put_slice(self, key: Key, model: str, body: Mapping[str, Any], *, deleted: bool) -> bool:
        before = self.slices.get(key)
        if deleted:
            self.slices.pop(key, None)
        else:
            self.slices[key] = (model, observing.slice_endpoints(body))
        return self._touch(before != self.slices.get(key))

    def put_source(self, key: Key, issue: SourceIssue | None) -> bool:
        """Record what resolving a model's ``registry:`` source found (None: all well)."""
        before = self.source_issues.pop(key, None)
        if issue is not None:
            self.source_issues[key] = issue
        return self._touch(before != issue)

    def put_apply_issue(self, key: Key, issue: tuple[str, str] | None) -> bool:
        """Record why applying a model's objects failed for good (None: applied)."""
        before = self.apply_issues.pop(key, None)
        if issue is not None:
            self.apply_issues[key] = issue
        return self._touch(before != issue)

    def put_pod(self, model: Key, pod: str, problem: tuple[str, str] | None) -> bool:
        """Record why a pod does not start (None: nothing wrong, or gone); True when that
        changed anything."""
        pods = self.pod_problems.setdefault(model, {})
        before = pods.get(pod)
        if problem is None:
            pods.pop(pod, None)
        else:
            pods[pod] = problem
        return before != problem

    def put_unchecked(self, key: Key, nodes: list[str]) -> bool:
        """Record the nodes whose compute check is skipped for a model; True when they are new to
        say (some, and not what was said last), so a resync does not repeat the warning."""
        before = self.unchecked.get(key)
        self.unchecked[key] = tuple(nodes)
        return bool(nodes) and before != tuple(nodes)

    def endpoints(self, key: Key) -> tuple[Endpoint, ...]:
        """Every pod URL of a model, from all of its EndpointSlices, sorted."""
        namespace, model = key
        found = {
            e.url: e
            for (ns, _), (owner, eps) in self.slices.items()
            if ns == namespace and owner == model
            for e in eps
        }
        return tuple(found[url] for url in sorted(found))

    def observe(self, key: Key) -> statuses.Observation | None:
        """What the status of a model depends on, or None if the model is not known."""
        seen = self.models.get(key)
        if seen is None:
            return None
        # Desired replicas come from the spec (the Deployment mirrors it, and may not exist yet).
        facts = self.deployments.get(key)
        valid = seen.spec is not None and seen.error is None
        desired = seen.spec.replicas if seen.spec is not None and valid else 0
        reason = self._unplaceable(seen.spec) if seen.spec is not None else None
        # A replica that only fails its readiness probe says least of why the model is not ready.
        problems = sorted(
            (self.pod_problems.get(key) or {}).values(), key=lambda p: (p[0] == "NotReady", p)
        )
        unschedulable = [message for reason, message in problems if reason == "Unschedulable"]
        starting = [problem for problem in problems if problem[0] != "Unschedulable"]
        if facts is not None and facts.stalled is not None:
            starting.append(("ProgressDeadlineExceeded", facts.stalled))
        if facts is not None and facts.create_failure is not None:
            starting.insert(0, facts.create_failure)  # no pod to have a problem of its own
        issue = self.source_issues.get(key)
        return statuses.Observation(
            generation=seen.generation,
            spec_error=seen.error or (issue.message if issue and issue.permanent else None),
            blocked=self.apply_issues.get(key),
            unplaceable=reason,
            unschedulable=next(iter(unschedulable), None),
            not_starting=next(iter(starting), None),
            weights_unavailable=issue.message if issue and not issue.permanent else None,
            desired=desired,
            ready=facts.ready if facts is not None else 0,
            rolled_out=facts.rolled_out if facts is not None else True,
            endpoints=tuple(e.url for e in self.endpoints(key) if e.ready),
        )

    def _unplaceable(self, spec: FleetModelSpec) -> str | None:
        """Placement over every node is O(nodes); models asking the same thing share the answer."""
        selector = tuple(sorted(spec.node_selector.items()))
        needs = (spec.engine, spec.gpus_per_replica, spec.accelerator, selector)
        if needs not in self._placements:
            profile = profiles.profile_for(spec.engine)
            self._placements[needs] = placement.unplaceable(spec, profile, self.nodes.values())
        return self._placements[needs]

    def _deployment(self, key: Key, seen: ModelView) -> ModelDeployment | None:
        if seen.spec is None:
            return None
        observation = self.observe(key)
        assert observation is not None
        status = statuses.decide(observation, previous=seen.status, now="")
        mig = seen.spec.accelerator.mig_profile
        asks = bool(seen.spec.gpus_per_replica)
        return ModelDeployment(
            name=seen.name,
            namespace=seen.namespace,
            served_model_name=seen.spec.served_model_name,
            engine=seen.spec.engine,
            weight_format=seen.spec.weight_format,
            gpus_per_replica=seen.spec.gpus_per_replica,
            desired_replicas=seen.spec.replicas,
            ready_replicas=observation.ready,
            phase=status.phase,
            reason=status.message if status.phase != "Ready" else "",
            endpoints=self.endpoints(key),
            registry_model=seen.spec.source.registry,
            accelerator=devices.resource_name(seen.spec) if asks else None,
            gpu_share=devices.card_share(mig) if asks and mig else None,
            adapters=tuple(a.name for a in seen.spec.adapters),
        )

    def report(
        self, *, cluster_id: str, now: datetime, interval: float | None = None
    ) -> InventoryReport:
        """A full snapshot for ``PUT /api/v1/inventory``, saying how often one is sent."""
        deployments = [self._deployment(k, m) for k, m in sorted(self.models.items())]
        return InventoryReport(
            schema_version=SCHEMA_VERSION,
            cluster_id=cluster_id,
            observed_at=now,
            reporter_version=f"fleet-serving/{fleet_serving.__version__}",
            nodes=tuple(n.node for _, n in sorted(self.nodes.items())),
            deployments=tuple(d for d in deployments if d is not None),
            report_interval_seconds=interval,
        )
