"""The stand-in's scheduler: which of its nodes may take a pending pod.

The real kube-scheduler is not built for the tests, so the stand-in binds pods itself with the
filters that matter to what the operator renders: ``nodeSelector``, required node affinity (the
GPU compute-capability terms use ``In`` and ``Gt``), ``NoSchedule`` taints against tolerations,
and resource requests against allocatable minus what the node's pods already request (GPUs are
the point). Among the nodes that fit it picks the one running the fewest pods (by name on a
tie), so replicas spread. Pure functions over API dicts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

__all__ = ["choose_node", "quantity", "unfit_reasons"]

Obj = Mapping[str, Any]
_SUFFIXES = {
    "m": Decimal("0.001"), "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}  # fmt: skip
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")


def quantity(text: object) -> Decimal:
    """A Kubernetes quantity (``2``, ``500m``, ``64Gi``) as a number."""
    found = _QUANTITY.match(str(text))
    if found is None or found.group(2) not in ("", *_SUFFIXES):
        raise ValueError(f"not a quantity: {text!r}")
    return Decimal(found.group(1)) * _SUFFIXES.get(found.group(2), Decimal(1))


def _requests(pod: Obj) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for container in pod["spec"].get("containers", []):
        resources = container.get("resources") or {}
        # A limit without a request is also the request (as the API server defaults it).
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in asked.items():
            total[name] = total.get(name, Decimal(0)) + quantity(value)
    return total


def _matches(expression: Obj, labels: Mapping[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values")
    value = labels.get(key)
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator == "In":
        return value in (values or [])
    if operator == "NotIn":
        return value not in (values or [])
    if value is None or not value.lstrip("-").isdigit():
        return False
    bound = int((values or ["0"])[0])
    return int(value) > bound if operator == "Gt" else int(value) < bound


def _affinity_ok(pod: Obj, labels: Mapping[str, str]) -> bool:
    affinity = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not affinity:
        return True
    return any(  # terms are ORed, a term's expressions ANDed
        all(_matches(e, labels) for e in term.get("matchExpressions", []))
        for term in affinity["nodeSelectorTerms"]
    )


def _tolerated(taint: Obj, tolerations: Iterable[Obj]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint.get("effect")):
            continue
        if toleration.get("operator") == "Exists" and toleration.get("key") in (None, taint["key"]):
            return True
        if toleration.get("key") == taint["key"] and toleration.get("value") == taint.get("value"):
            return True
    return False


def unfit_reasons(pod: Obj, node: Obj, running: Iterable[Obj]) -> list[str]:
    """Why ``node`` cannot take ``pod`` (``running``: the pods bound to it); empty if it can."""
    labels = node["metadata"].get("labels") or {}
    reasons = []
    if node["spec"].get("unschedulable"):
        reasons.append("node(s) were unschedulable")
    selector = pod["spec"].get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()) or not _affinity_ok(pod, labels):
        reasons.append("node(s) didn't match Pod's node affinity/selector")
    tolerations = pod["spec"].get("tolerations") or []
    for taint in node["spec"].get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
            taint, tolerations
        ):
            reasons.append(f"node(s) had untolerated taint {{{taint['key']}}}")
    allocatable = {k: quantity(v) for k, v in node["status"].get("allocatable", {}).items()}
    used: dict[str, Decimal] = {}
    for other in running:
        for name, amount in _requests(other).items():
            used[name] = used.get(name, Decimal(0)) + amount
    for name, amount in _requests(pod).items():
        if used.get(name, Decimal(0)) + amount > allocatable.get(name, Decimal(0)):
            reasons.append(f"Insufficient {name}")
    return reasons


def choose_node(
    pod: Obj, nodes: Iterable[Obj], pods_by_node: Mapping[str, Sequence[Obj]]
) -> tuple[str | None, str]:
    """The node to bind ``pod`` to, or ``None`` and the scheduler's message saying why not."""
    fitting, why = [], []
    nodes = list(nodes)
    for node in nodes:
        name = node["metadata"]["name"]
        reasons = unfit_reasons(pod, node, pods_by_node.get(name, []))
        if reasons:
            why += reasons
        else:
            fitting.append((len(pods_by_node.get(name, [])), name))
    if fitting:
        return min(fitting)[1], ""
    counted = ", ".join(f"{why.count(r)} {r}" for r in dict.fromkeys(why))
    return None, f"0/{len(nodes)} nodes are available: {counted}."
