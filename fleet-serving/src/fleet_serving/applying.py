"""Deciding whether, and how, to patch an owned object: a client-side three-way merge.

Desired objects are compared with live ones as a subset (:func:`drifted`), because the cluster
adds defaults, status and metadata the operator never sets. A subset comparison cannot see a key
the operator *stopped* setting (a nodeSelector entry removed from the spec), and a JSON merge
patch of the new desired object would leave that key in place. So, like ``kubectl apply``, the
operator records what it applied in an annotation (:data:`APPLIED`, part of the desired object,
so any change to the desired state is drift), and the patch deletes the keys that were in the
previous application and are gone from the new one (a ``null``). Lists are replaced whole by a
merge patch, so a change inside a list needs only the list.

Resource quantities are compared by value: the API server rewrites ``0.5`` as ``500m`` and ``1Gi``
stays ``1Gi``, and a textual comparison would re-patch such an object at every resync.

Pure functions only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from fleet_serving.spec import GROUP

__all__ = ["APPLIED", "drifted", "merge_patch", "previous", "quantity", "with_applied"]

APPLIED = f"{GROUP}/applied"
"""Annotation holding the JSON of the object as last applied (without this annotation)."""

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")
_SUFFIX = {
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def quantity(text: str) -> Decimal | None:
    """The value of a Kubernetes quantity (``500m``, ``1.5Gi``, ``2e3``); None if not one."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        return None
    try:
        number, suffix = Decimal(match[1]), match[2] or ""
        if suffix[:1] in ("e", "E"):
            return number * Decimal(10) ** int(suffix[1:])
        return number * _SUFFIX.get(suffix, Decimal(1))
    except InvalidOperation:
        return None


def _same_scalar(desired: Any, actual: Any, *, quantities: bool) -> bool:
    if desired == actual:
        return True
    if quantities and isinstance(desired, str | int) and isinstance(actual, str | int):
        a, b = quantity(str(desired)), quantity(str(actual))
        return a is not None and a == b
    return False


def drifted(desired: Any, actual: Any, *, quantities: bool = False) -> bool:
    """True when ``actual`` lacks or differs in any field ``desired`` sets.

    Fields only the cluster sets (defaults, status, uid) are ignored: desired is compared as a
    subset, so a correct object is never patched and a hand-edited one always is. Under a
    ``resources`` key, quantities compare by value.
    """
    if desired in ({}, []) and actual is None:
        return False  # the API server omits empty lists and maps
    if isinstance(desired, Mapping):
        if not isinstance(actual, Mapping):
            return True
        return any(
            drifted(v, actual.get(k), quantities=quantities or k == "resources")
            for k, v in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(actual) != len(desired):
            return True
        return any(
            drifted(d, a, quantities=quantities) for d, a in zip(desired, actual, strict=True)
        )
    return not _same_scalar(desired, actual, quantities=quantities)


def with_applied(desired: Mapping[str, Any]) -> dict[str, Any]:
    """``desired`` carrying its own JSON in the :data:`APPLIED` annotation."""
    meta = {k: v for k, v in desired["metadata"].items() if k != "annotations"}
    annotations = {k: v for k, v in (desired["metadata"].get("annotations") or {}).items()
                   if k != APPLIED}  # fmt: skip
    if annotations:
        meta["annotations"] = annotations
    plain = {**desired, "metadata": meta}
    record = json.dumps(plain, sort_keys=True, separators=(",", ":"))
    return {**plain, "metadata": {**meta, "annotations": {**annotations, APPLIED: record}}}


def previous(actual: Mapping[str, Any]) -> dict[str, Any] | None:
    """What was last applied to ``actual``, if the operator recorded it (and it still parses)."""
    text = ((actual.get("metadata") or {}).get("annotations") or {}).get(APPLIED)
    if not isinstance(text, str):
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def merge_patch(last: Any, desired: Any) -> Any:
    """The merge patch that makes a live object match ``desired``: ``desired`` itself (lists
    replace, maps merge) plus a ``null`` for every map key applied before (``last``) and dropped
    since. Without a record (``last`` None) it is ``desired``."""
    if not isinstance(last, Mapping) or not isinstance(desired, Mapping):
        return desired
    patch = {key: merge_patch(last.get(key), value) for key, value in desired.items()}
    return patch | {key: None for key in last if key not in desired}
