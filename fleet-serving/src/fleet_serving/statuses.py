"""A FleetModel's status as a pure function of what the operator observed.

Phases: ``Failed`` (the spec can never run: wrong weight format for the engine, …; or what it
renders cannot be applied: a foreign object in the way, an object the API server refused),
``Scheduling`` (no node can take a replica, or the scheduler says a pod is Unschedulable),
``Pending`` (placed, not all replicas ready yet — with the kubelet's reason when a pod cannot
start or serve: CreateContainerConfigError, ImagePullBackOff, OOMKilled, CrashLoopBackOff,
FetchWeightsFailed, NotReady, … or ProgressDeadlineExceeded; or why no pod can be created:
QuotaExceeded, FailedCreate — or a ``registry:`` model whose
files cannot be fetched yet and no replica serving), ``Ready`` (every desired replica ready).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from fleet_contract import Phase
from fleet_serving.spec import Condition, FleetModelStatus

__all__ = ["Observation", "decide"]


class Observation(msgspec.Struct, kw_only=True, frozen=True):
    """Everything the status depends on, gathered by the caller."""

    generation: int
    spec_error: str | None = None
    blocked: tuple[str, str] | None = None
    """(reason, message) when the rendered objects cannot be applied (ForeignObject, Rejected)."""
    unplaceable: str | None = None
    unschedulable: str | None = None
    not_starting: tuple[str, str] | None = None
    """(reason, message) of a pod the kubelet cannot start (a missing Secret, an image pull, a
    crash loop, an OOM kill, a failing init container) or whose readiness probe fails, of a
    rollout past its progress deadline, or of pods the API server refuses to create."""
    weights_unavailable: str | None = None
    desired: int = 0
    ready: int = 0
    rolled_out: bool = True
    """Every replica runs the Deployment's current spec (see observing.DeploymentFacts)."""
    endpoints: tuple[str, ...] = ()


def _phase(seen: Observation) -> tuple[Phase, str, str]:
    counted = f"{seen.ready}/{seen.desired} replicas ready"
    serving = seen.ready >= seen.desired
    if seen.spec_error is not None:
        return "Failed", "InvalidSpec", seen.spec_error
    if seen.blocked is not None:
        return "Failed", *seen.blocked
    if serving and seen.rolled_out:
        # Before placement: a model whose replicas all serve stays Ready when a node loses a
        # GPU and a fresh replica would no longer fit.
        return "Ready", "ReplicasReady", counted
    if seen.unplaceable is not None:
        return "Scheduling", "NoFittingNode", seen.unplaceable
    if seen.unschedulable is not None:
        return "Scheduling", "Unschedulable", seen.unschedulable
    if seen.weights_unavailable is not None and seen.ready == 0:
        return "Pending", "WeightsNotReady", seen.weights_unavailable
    if seen.not_starting is not None:
        reason, message = seen.not_starting
        return "Pending", reason, f"{counted}; {message}"
    if serving:
        return "Pending", "RollingOut", f"{counted}; rolling out the current spec"
    return "Pending", "Starting", counted


def _condition(
    kind: str, ok: bool, reason: str, message: str, *, previous: Sequence[Condition], now: str
) -> Condition:
    status: Literal["True", "False"] = "True" if ok else "False"
    before = next((c for c in previous if c.type == kind), None)
    since = before.last_transition_time if before and before.status == status else now
    return Condition(
        type=kind, status=status, reason=reason, message=message, last_transition_time=since
    )


def decide(seen: Observation, *, previous: FleetModelStatus, now: str) -> FleetModelStatus:
    """The status to publish; transition times carry over while a condition holds."""
    phase, reason, message = _phase(seen)
    placed = phase in ("Pending", "Ready")
    old = previous.conditions
    conditions = [
        _condition("Ready", phase == "Ready", reason, message, previous=old, now=now),
        _condition(
            "Scheduled", placed, reason, message if not placed else "", previous=old, now=now
        ),
    ]
    return FleetModelStatus(
        phase=phase,
        reason=reason,
        message=message,
        replicas=seen.desired,
        ready_replicas=seen.ready,
        endpoints=list(seen.endpoints),
        observed_generation=seen.generation,
        conditions=conditions,
    )
