"""The FleetModel CustomResourceDefinition, generated from :mod:`fleet_serving.spec`.

``python -m fleet_serving.crd > deploy/base/crd.yaml`` writes it; a test regenerates it and fails
when the committed file differs, so the schema the API server enforces is always the one the
operator decodes with. msgspec's JSON Schema is turned into a Kubernetes *structural* schema:
``$ref`` inlined, ``anyOf [X, null]`` turned into ``X`` with ``nullable``, titles dropped.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec
import yaml

from fleet_serving import spec

__all__ = ["crd_manifest", "main", "openapi_schema", "render_yaml"]

_KEPT = {
    "type", "properties", "required", "items", "additionalProperties", "enum", "default",
    "minimum", "maximum", "minLength", "maxItems", "maxLength", "pattern", "description",
    "nullable",
}  # fmt: skip

_SOURCE_RULE = {
    "rule": "[has(self.registry), has(self.huggingFace), has(self.uri)].filter(x, x).size() == 1",
    "message": "give exactly one of registry, huggingFace or uri",
}


_NAME_RULE = {
    "rule": f"size(self.metadata.name) <= 63 && self.metadata.name.matches('{spec.NAME_PATTERN}')",
    "message": spec.NAME_RULE,
}


_ADAPTERS_RULE = {
    "rule": "!has(self.adapters) || self.adapters.all(a, a.name != self.servedModelName"
    " && self.adapters.exists_one(b, b.name == a.name))",
    "message": "each adapter needs a model name of its own: not the servedModelName, not twice",
}


_MIG_RULE = {
    "rule": "!has(self.migProfile) || !has(self.vendor) || self.vendor == 'nvidia'",
    "message": "migProfile is NVIDIA MIG: it needs vendor nvidia",
}


_CACHE_RULE = {
    "rule": (
        "!has(self.modelVolume) || !has(self.modelVolume.cacheClaim) || has(self.source.registry)"
    ),
    "message": "modelVolume.cacheClaim needs a registry: source (the cache is keyed by sha256)",
}


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return _structural(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in node:
        others = [n for n in node["anyOf"] if n.get("type") != "null"]
        if len(others) != 1:
            raise ValueError(f"cannot express {node!r} as a structural schema")
        outer = {k: v for k, v in node.items() if k in _KEPT and v is not None}
        return _structural(others[0], defs) | {"nullable": True} | outer
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _KEPT:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("default", 0) is None:
        del out["default"]  # a null default would make has() true in CEL rules
    if out.get("required") == []:
        del out["required"]
    if "description" in out:
        out["description"] = out["description"].replace("``", "")
    return out


def _schema_of(struct: type[msgspec.Struct]) -> dict[str, Any]:
    (ref,), components = msgspec.json.schema_components([struct])
    return _structural(ref, components)


def openapi_schema() -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a FleetModel object."""
    spec_schema = _schema_of(spec.FleetModelSpec)
    spec_schema["properties"]["source"]["x-kubernetes-validations"] = [_SOURCE_RULE]
    spec_schema["properties"]["accelerator"]["x-kubernetes-validations"] = [_MIG_RULE]
    spec_schema["x-kubernetes-validations"] = [_CACHE_RULE, _ADAPTERS_RULE]
    return {
        "type": "object",
        "x-kubernetes-validations": [_NAME_RULE],
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": _schema_of(spec.FleetModelStatus),
        },
    }


_COLUMNS = [
    ("Model", "string", ".spec.servedModelName"),
    ("Engine", "string", ".spec.engine"),
    ("Replicas", "integer", ".spec.replicas"),
    ("Ready", "integer", ".status.readyReplicas"),
    ("Phase", "string", ".status.phase"),
    ("Age", "date", ".metadata.creationTimestamp"),
]


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition object, ready to apply."""
    columns = [{"name": n, "type": t, "jsonPath": p} for n, t, p in _COLUMNS]
    version = {
        "name": spec.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": openapi_schema()},
        "subresources": {"status": {}},
        "additionalPrinterColumns": columns,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{spec.PLURAL}.{spec.GROUP}"},
        "spec": {
            "group": spec.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": spec.KIND,
                "plural": spec.PLURAL,
                "singular": spec.SINGULAR,
                "shortNames": list(spec.SHORT_NAMES),
                "categories": ["fleet"],
            },
            "versions": [version],
        },
    }


def render_yaml() -> str:
    """The CRD as the YAML committed in ``deploy/base/crd.yaml``."""
    header = "# Generated by `python -m fleet_serving.crd`; do not edit (ADR 0005).\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


def main() -> None:
    """Print the CRD YAML on stdout."""
    sys.stdout.write(render_yaml())


if __name__ == "__main__":
    main()
