"""The control plane's OpenAPI 3.1 document, built from the routes it actually serves.

The document is derived from the app's ``/api/v1`` routes, each looked up in
``operations.OPERATIONS`` (the route table, kept apart as data): a route without a description
there stops the app from being built, so the document can neither miss a served route nor describe
one that is not served (without a database, the tenants, keys and budget routes are absent, and so
is their description). Schemas come from the wire structs through
``msgspec.json.schema_components`` (JSON Schema 2020-12, which OpenAPI 3.1 uses as is).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from starlette.routing import BaseRoute, Route

from fleet_core.control_plane.operations import OPENAPI_PATH, OPERATIONS, Operation
from fleet_core.shared import paging
from fleet_core.shared.errors import ErrorEnvelope

__all__ = ["build_document", "served"]

_REF = "#/components/schemas/{name}"
_CONVERTER = re.compile(r"\{(\w+):\w+\}")
_ERRORS = {
    400: "Invalid request; error.param names the field",
    401: "No credential, or an unknown or revoked one",
    403: "The credential's role may not call this, or not for this tenant or cluster",
    404: "Not found",
    409: "Conflict",
    415: "A write whose Content-Type is not application/json (octet-stream for an upload)",
    416: "Range Not Satisfiable: the range starts past the end of the file",
    503: "A dependency is unavailable",
}
_WRITES = ("POST", "PUT", "PATCH")


def served(routes: Iterable[BaseRoute]) -> list[tuple[str, str]]:
    """``(method, OpenAPI path)`` of each ``/api/v1`` route (not HEAD, which Starlette adds)."""
    found = [("GET", OPENAPI_PATH)]  # the document describes itself
    for route in routes:
        if (
            isinstance(route, Route)
            and route.path.startswith("/api/v1/")
            and (route.path != OPENAPI_PATH)
        ):
            path = _CONVERTER.sub(r"{\1}", route.path)
            found += [(method, path) for method in sorted(route.methods or ()) if method != "HEAD"]
    return found


def build_document(routes: Sequence[BaseRoute]) -> dict[str, Any]:
    """The document for ``routes``; KeyError naming a served route ``OPERATIONS`` lacks."""
    operations = {key: OPERATIONS[key] for key in served(routes)}
    types = _types(operations.values())
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    _no_nul(components)
    schema_of = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), operation in operations.items():
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, operation, schema_of)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Fleet control plane", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _no_nul(schema: Any) -> None:
    """Every free-text string in the wire types says it holds no NUL (refused with 400 before
    any handler: Postgres cannot store one); patterns, formats and enums say more already."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and not {"pattern", "format", "enum", "const"} & set(
            schema
        ):
            schema["pattern"] = _TEXT["pattern"]
        for value in schema.values():
            _no_nul(value)
    elif isinstance(schema, list):
        for value in schema:
            _no_nul(value)


def _types(operations: Iterable[Operation]) -> list[Any]:
    found: list[Any] = [ErrorEnvelope]
    for operation in operations:
        for kind in (operation.body, operation.response):
            if kind is not None and kind not in found:
                found.append(kind)
    return found


def _operation(
    method: str, path: str, operation: Operation, schema_of: dict[Any, Any]
) -> dict[str, Any]:
    errors = {*operation.errors, *((415,) if method in _WRITES else ())}
    if path != OPENAPI_PATH:
        errors |= {401, 403}
    if "{" in path or operation.query or operation.paged or operation.body is not None:
        errors.add(400)  # a NUL, a malformed value, or a value out of range (shared.inputs)
    doc: dict[str, Any] = {
        "operationId": _operation_id(method, path),
        "summary": operation.summary,
        "parameters": _parameters(path, operation.query, paged=operation.paged),
        "responses": {
            str(operation.status): _success(operation, schema_of),
            **{str(s): _json(_ERRORS[s], schema_of[ErrorEnvelope]) for s in sorted(errors)},
        },
    }
    if path == OPENAPI_PATH:
        doc["security"] = []
    if operation.uploads_bytes:
        doc["requestBody"] = {"required": True, "content": {"application/octet-stream": {}}}
    elif operation.body is not None:
        doc["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema_of[operation.body]}},
        }
    return doc


def _success(operation: Operation, schema_of: dict[Any, Any]) -> dict[str, Any]:
    if operation.media_type != "application/json":
        return {"description": "Success", "content": {operation.media_type: {}}}
    return _json("Success", _body(operation, schema_of))


def _body(operation: Operation, schema_of: dict[Any, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = schema_of[operation.response]
    if schema.get("type") != "array":
        return schema
    properties: dict[str, Any] = {"object": {"const": "list"}, "data": schema}
    if operation.paged:
        properties["next"] = {
            "type": "string",
            "description": "The next page's cursor (pass it as after); absent on the last page",
        }
    return {"type": "object", "required": ["object", "data"], "properties": properties}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _parameters(path: str, query: tuple[str, ...], *, paged: bool) -> list[dict[str, Any]]:
    names = re.findall(r"\{(\w+)\}", path)
    params = [{"name": n, "in": "path", "required": True, "schema": _TEXT} for n in names]
    params += [_QUERY.get(q) or {"name": q, "in": "query", "schema": _TEXT} for q in query]
    return params + (_PAGE_PARAMETERS if paged else [])


_TEXT: dict[str, Any] = {"type": "string", "pattern": "^[^\\x00]*$"}
"""Any text but NUL, which Postgres cannot store (the guard refuses it with 400)."""
_INSTANT = {
    "type": "string",
    "format": "date-time",
    "description": "ISO-8601 with a time zone, from 1970 to 8999 (2026-09-01T00:00:00Z)",
}


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    found = {"name": name, "in": "query", "schema": schema}
    return {**found, "description": description} if description else found


_QUERY: dict[str, dict[str, Any]] = {
    "q": _query(
        "q",
        {"type": "string", "maxLength": paging.MAX_SEARCH, "pattern": "^[^\\x00-\\x1f]*$"},
        "A case-insensitive substring of the id or the name (the console's pickers)",
    ),
    "from": _query("from", _INSTANT, "The window's start (default: 24 hours before to)"),
    "to": _query("to", _INSTANT, "The window's end, after from (default: now)"),
    "at": _query("at", _INSTANT, "When the cluster left (a past instant; default: now)"),
    "groupBy": _query("groupBy", {"enum": ["hour", "day", "model", "project"]}),
    "engine": {**_query("engine", {"enum": ["llamacpp", "vllm"]}), "required": True},
    "format": _query("format", {"enum": ["csv", "json"]}),
    "before": _query(
        "before",
        {"type": "integer", "minimum": 1, "maximum": 2**53 - 1},
        "Events older than this id",
    ),
    "minCoverage": _query(
        "minCoverage",
        {"type": "string", "pattern": "^([01](\\.[0-9]{1,9})?|\\.[0-9]{1,9})$"},
        "The coverage this close needs, a share from 0 to 1 (default: the configured one)",
    ),
    "projectId": _query(
        "projectId",
        {"type": "string", "pattern": "^[^/\\x00]+/[^\\x00]+$"},
        "tenant/name",
    ),
}

_PAGE_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "limit",
        "in": "query",
        "description": f"Rows per page (default {paging.DEFAULT_LIMIT})",
        "schema": {"type": "integer", "minimum": 1, "maximum": paging.MAX_LIMIT},
    },
    {
        "name": "after",
        "in": "query",
        "description": "The previous page's next cursor, as it was given (opaque: any other "
        "value is 400)",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]*$", "maxLength": 1024},
    },
]


def _operation_id(method: str, path: str) -> str:
    words = re.findall(r"[a-z]+", path.removeprefix("/api/v1/"))
    return "_".join([method.lower(), *words])
