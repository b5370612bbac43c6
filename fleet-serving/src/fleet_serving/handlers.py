"""kopf handlers: reconcile FleetModels, and feed the cluster view from watches.

Handlers are registered on a registry built by :func:`build_registry` (no module-level
decorators, so importing this module starts nothing), and take their dependencies from kopf's
``memo`` (:class:`Deps`). Decisions are delegated to pure modules (rendering, profiles, placement,
statuses, sources); the only I/O here goes through :class:`fleet_serving.kube.Kube` and, for
``registry:`` sources, :class:`fleet_serving.control_plane.WeightsClient`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
import msgspec

from fleet_serving import (
    adapters,
    devices,
    images,
    observing,
    placement,
    profiles,
    rendering,
    sources,
    statuses,
)
from fleet_serving.adapters import ResolvedAdapter
from fleet_serving.control_plane import WeightsClient, WeightsUnavailable
from fleet_serving.errors import ForeignObject, InvalidSpec, KubernetesError, Rejected
from fleet_serving.kube import Kube
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import GROUP, PLURAL, VERSION, FleetModelSpec, check_name, decode_spec
from fleet_serving.view import ClusterView, Key, SourceIssue

__all__ = ["Deps", "build_registry", "reconcile"]

_MANAGED: dict[str, Any] = {
    "app.kubernetes.io/managed-by": "fleet-serving",
    rendering.MODEL_LABEL: kopf.PRESENT,
}


@dataclasses.dataclass(frozen=True)
class Deps:
    """What handlers need, handed to kopf as ``memo`` (kopf shallow-copies it per object)."""

    view: ClusterView
    kube: Kube
    weights: WeightsClient
    weights_retry_s: float = 15.0
    """How soon a model waiting for its registry weights is looked at again."""
    fetch: images.FetchImages = images.DEFAULT
    """The weight fetchers' images (the operator's settings)."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _temporary(exc: KubernetesError) -> kopf.TemporaryError:
    return kopf.TemporaryError(str(exc), delay=5 if exc.status in (409, 0) else 15)


async def publish_status(deps: Deps, key: Key) -> None:
    """Write a model's status if what we would write differs from what it has."""
    seen = deps.view.models.get(key)
    observation = deps.view.observe(key)
    if seen is None or observation is None:
        return
    status = statuses.decide(observation, previous=seen.status, now=_now())
    if status == seen.status:
        return
    try:
        await deps.kube.patch_status(key[0], key[1], msgspec.to_builtins(status))
    except KubernetesError as exc:
        if exc.status != 404:  # a deleted model needs no status
            raise _temporary(exc) from exc


async def reconcile(body: Mapping[str, Any], deps: Deps, logger: Any) -> None:
    """Bring the Deployment, Service and PodDisruptionBudget of one FleetModel to their desired
    state."""
    seen = deps.view.put_model(body, deleted=False)
    assert seen is not None
    key = (seen.namespace, seen.name)
    try:
        check_name(seen.name)
        spec = decode_spec(body.get("spec") or {})
        profile = profiles.check(spec)
        if spec.gpus_per_replica:
            device = devices.device_profile(spec)
            devices.check_namespace(device, seen.namespace, deps.view.host_mounts)
    except InvalidSpec:
        await publish_status(deps, key)  # Failed, with the reason
        raise
    unchecked = placement.compute_unchecked(spec, profile, deps.view.nodes.values())
    if deps.view.put_unchecked(key, unchecked):  # a warning: kopf posts it as an Event too
        logger.warning(
            f"compute check skipped on {', '.join(unchecked[:5])}: no GPU feature discovery "
            f"(or chip) labels, so {profile.engine}'s compute floor could not be checked"
        )
    registry, resolved = await _resolve_registry(deps, key, spec)
    uid = body["metadata"].get("uid") or ""
    owner = rendering.Owner(name=seen.name, namespace=seen.namespace, uid=uid)
    desired = [
        rendering.deployment(owner, spec, profile, registry, resolved, fetch=deps.fetch),
        rendering.service(owner, profile),
        rendering.disruption_budget(owner),
    ]
    await _apply(deps, key, desired, logger)
    await publish_status(deps, key)


async def _apply(deps: Deps, key: Key, desired: list[dict[str, Any]], logger: Any) -> None:
    """Create or patch each object. What can heal by itself is retried soon; a foreign object in
    the way (ForeignObject) and a refused object (Rejected) go to the status as Failed."""
    try:
        for obj in desired:
            done = await deps.kube.ensure(obj)
            if done != "unchanged":
                logger.info(f"{obj['kind']} {done}")
    except ForeignObject as exc:
        await _blocked(deps, key, "ForeignObject", str(exc))
        raise kopf.TemporaryError(str(exc), delay=10) from exc  # heals when it is removed
    except KubernetesError as exc:
        if exc.retryable:
            raise _temporary(exc) from exc
        await _blocked(deps, key, "Rejected", str(exc))
        raise Rejected(str(exc)) from exc
    deps.view.put_apply_issue(key, None)


async def _blocked(deps: Deps, key: Key, reason: str, message: str) -> None:
    deps.view.put_apply_issue(key, (reason, message))
    await publish_status(deps, key)


async def _resolve_registry(
    deps: Deps, key: Key, spec: FleetModelSpec
) -> tuple[RegistryWeights | None, list[ResolvedAdapter]]:
    """A ``registry:`` source's Ready model, and each adapter's. While any files cannot be
    fetched, the status says why (Pending, WeightsNotReady), nothing is rendered, and kopf
    retries after a delay."""
    registry = None
    try:
        if spec.source.registry is not None:
            registry = msgspec.structs.replace(
                await deps.weights.resolve(spec.source.registry), weight_file=spec.weight_file
            )
            sources.check(spec, registry.weights)
        resolved = [
            ResolvedAdapter(
                name=a.name, index=i, registry=await deps.weights.resolve(a.source.registry)
            )
            for i, a in enumerate(spec.adapters)
        ]
        for adapter in resolved:
            adapters.check_weights(spec.engine, adapter.name, adapter.registry.weights)
    except WeightsUnavailable as exc:
        deps.view.put_source(key, SourceIssue(str(exc), permanent=False))
        await publish_status(deps, key)
        raise kopf.TemporaryError(str(exc), delay=deps.weights_retry_s) from exc
    except InvalidSpec as exc:
        deps.view.put_source(key, SourceIssue(str(exc), permanent=True))
        await publish_status(deps, key)
        raise
    deps.view.put_source(key, None)
    return registry, resolved


def _model_of(body: kopf.Body) -> Key:
    return (body.metadata.namespace or "default", body.metadata.labels[rendering.MODEL_LABEL])


async def _refresh_all(deps: Deps) -> None:
    for key in list(deps.view.models):
        await publish_status(deps, key)


def build_registry() -> kopf.OperatorRegistry:
    """A registry holding every handler of the operator.

    None of them makes kopf put a finalizer on a FleetModel (no timers or daemons on them, no
    on.delete handler), so deleting one never waits for the operator: the garbage collector
    removes its Deployment and Service by their owner references. The periodic resync is one
    operator-wide loop instead (:mod:`fleet_serving.resyncing`).
    """
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Keep kopf's bookkeeping in our own annotations: the structural schema prunes status.kopf.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        # The finalizer that releases before this one put on every FleetModel (for a per-object
        # resync timer). Named here, kopf removes it from any object it sees carrying it, as no
        # handler requires it: upgrading leaves no delete waiting.
        settings.persistence.finalizer = f"{GROUP}/resync"
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)
    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    async def fleetmodel_changed(body: kopf.Body, memo: Deps, logger: Any, **_: Any) -> None:
        try:
            await reconcile(body, memo, logger)
        except InvalidSpec as exc:
            raise kopf.PermanentError(str(exc)) from exc  # retried only when the spec changes

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def fleetmodel_seen(body: kopf.Body, type: str | None, memo: Deps, **_: Any) -> None:
        seen = memo.view.put_model(body, deleted=type == "DELETED")
        if seen is not None:
            await publish_status(memo, (seen.namespace, seen.name))

    @kopf.on.event("v1", "nodes", registry=registry)
    async def node_seen(body: kopf.Body, type: str | None, memo: Deps, **_: Any) -> None:
        if memo.view.put_node(body, deleted=type == "DELETED"):
            await _refresh_all(memo)

    @kopf.on.event("apps", "v1", "deployments", labels=_MANAGED, registry=registry)
    async def deployment_seen(body: kopf.Body, type: str | None, memo: Deps, **_: Any) -> None:
        key = _model_of(body)
        if memo.view.put_deployment(key, body, deleted=type == "DELETED"):
            await publish_status(memo, key)

    @kopf.on.event("discovery.k8s.io", "v1", "endpointslices", labels=_MANAGED, registry=registry)
    async def slice_seen(body: kopf.Body, type: str | None, memo: Deps, **_: Any) -> None:
        model = _model_of(body)
        key = (model[0], body.metadata.name or "")
        if memo.view.put_slice(key, model[1], body, deleted=type == "DELETED"):
            await publish_status(memo, model)

    @kopf.on.event("v1", "pods", labels=_MANAGED, registry=registry)
    async def pod_seen(body: kopf.Body, type: str | None, memo: Deps, **_: Any) -> None:
        key = _model_of(body)
        gone = type == "DELETED"
        problem = None if gone else observing.pod_problem(body)
        if memo.view.put_pod(key, body.metadata.name or "", problem):
            await publish_status(memo, key)

    return registry
