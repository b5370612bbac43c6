"""The control plane's route table: what each ``/api/v1`` operation takes and answers.

``OPERATIONS`` describes every route the control plane may serve, keyed by method and OpenAPI
path: its summary, body and response types, query parameters and errors. `openapi` builds the
document from the routes actually served, each looked up here, so a served route missing from
this table stops the app from being built. Kept apart from the building: this is data, one
entry per operation, edited with every new route; the building changes with the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

import fleet_contract
from fleet_core.control_plane.api_keys import wire as keys
from fleet_core.control_plane.auth import wire as auth
from fleet_core.control_plane.budget_rules import wire as budgets
from fleet_core.control_plane.costs import wire as costs
from fleet_core.control_plane.inventory.bindings import Binding, BindingBody
from fleet_core.control_plane.inventory.service import ClusterSummary, Decommission
from fleet_core.control_plane.rates import wire as rates
from fleet_core.control_plane.registry import wire as registry
from fleet_core.control_plane.tenants import wire as tenants
from fleet_core.control_plane.usage.wire import Agreement, UsageRow
from fleet_core.shared.endpoints import EndpointsDocument

__all__ = ["OPENAPI_PATH", "OPERATIONS", "ClusterView", "Operation"]

OPENAPI_PATH = "/api/v1/openapi.json"
"""The document's own path (it describes itself, and needs no credential)."""


class ClusterView(msgspec.Struct, frozen=True):
    """``GET /api/v1/clusters/{cluster_id}``: the summary and the report it was computed from."""

    summary: ClusterSummary
    report: fleet_contract.InventoryReport


@dataclass(frozen=True)
class Operation:
    summary: str
    response: Any = None
    """The success body's type; ``list[T]`` is rendered as ``{"object": "list", "data": [T]}``."""
    body: Any = None
    status: int = 200
    query: tuple[str, ...] = ()
    errors: tuple[int, ...] = ()
    media_type: str = "application/json"
    """Another type (``application/octet-stream``) is a body of bytes, with no ``response``."""
    uploads_bytes: bool = False
    """The request body is raw bytes (``application/octet-stream``), not JSON."""
    paged: bool = False
    """A keyset-paged list (``fleet_core.shared.paging``): ``limit`` and ``after`` in the query,
    ``next`` in the body while more rows follow."""


def _one(
    path: str, kind: Any, patch: Any, words: tuple[str, str, str]
) -> dict[tuple[str, str], Operation]:
    """Read, change and delete one tenant or project: the same three operations for both.
    ``words``: the noun, then the summaries of the change and of the delete."""
    noun, changes, deletes = words
    return {
        ("GET", path): Operation(f"Read a {noun}", response=kind, errors=(404,)),
        ("PATCH", path): Operation(changes, body=patch, response=kind, errors=(400, 404)),
        ("DELETE", path): Operation(deletes, response=tenants.Deleted, errors=(404, 409)),
    }


_TENANT = "/api/v1/tenants/{tenant_id}"
_RATES = "/api/v1/model-rates/{model}"
_PROJECT = "/api/v1/projects/{project_id}"
_RULE = "/api/v1/budget-rules/{rule_id}"
_PERIOD = "/api/v1/cost-periods/{period}"
_MODEL = "/api/v1/models/{model_id}"

_TENANT_WORDS = (
    "tenant",
    "Change a tenant's name, limits or active flag (null clears a limit)",
    "Delete a tenant with its projects, keys and rules; 409 once usage was billed",
)
_PROJECT_WORDS = (
    "project",
    "Change a project's limits or active flag",
    "Delete a project with its keys and rules; 409 once usage was billed",
)

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", OPENAPI_PATH): Operation("This document", response=dict[str, Any]),
    ("GET", "/api/v1/whoami"): Operation(
        "The caller's credential id and role", response=auth.Principal
    ),
    ("POST", "/api/v1/credentials"): Operation(
        "Issue a service credential; the only response holding its secret",
        body=auth.CredentialCreate,
        response=auth.IssuedCredential,
        status=201,
        errors=(400,),
    ),
    ("GET", "/api/v1/credentials"): Operation(
        "List service credentials by creation (never their secrets)",
        response=list[auth.Credential],
        paged=True,
    ),
    ("DELETE", "/api/v1/credentials/{credential_id}"): Operation(
        "Revoke a service credential; 409 for the last active admin credential",
        response=auth.Credential,
        errors=(404, 409),
    ),
    ("GET", "/api/v1/audit-events"): Operation(
        "Who changed what, newest first",
        response=list[auth.AuditEvent],
        query=("limit", "before"),
        errors=(400,),
    ),
    ("PUT", "/api/v1/inventory"): Operation(
        "Report a cluster's inventory (the operator): refused naming the field when it lists a"
        " model or endpoint outside the cluster's binding (403 outside_binding) or is dated"
        " outside the time bounds (400 observed_at_out_of_range); accepted and refused reports"
        " are both audited",
        body=fleet_contract.InventoryReport,
        response=ClusterSummary,
        errors=(400, 403),
    ),
    ("GET", "/api/v1/inventory"): Operation(
        "The newest report's summary per cluster, by cluster id",
        response=list[ClusterSummary],
        errors=(400,),
        paged=True,
    ),
    ("GET", "/api/v1/clusters/{cluster_id}"): Operation(
        "One cluster's newest report", response=ClusterView, errors=(404,)
    ),
    ("DELETE", "/api/v1/clusters/{cluster_id}"): Operation(
        "Decommission a cluster (?at=, else now): its lifetime for cost coverage ends there",
        response=Decommission,
        query=("at",),
        errors=(400, 404),
    ),
    ("PUT", "/api/v1/clusters/{cluster_id}/binding"): Operation(
        "Bind a cluster: the served model names it may report and where its endpoints may be"
        " (CIDRs, host names, *.suffix); a cluster without a binding serves nothing",
        body=BindingBody,
        response=Binding,
        errors=(400,),
    ),
    ("GET", "/api/v1/clusters/{cluster_id}/binding"): Operation(
        "A cluster's binding", response=Binding, errors=(404,)
    ),
    ("DELETE", "/api/v1/clusters/{cluster_id}/binding"): Operation(
        "Unbind a cluster: it serves nothing from now on", response=Binding, errors=(404,)
    ),
    ("GET", "/api/v1/endpoints"): Operation(
        "Ready endpoints per served model (the gateway; ETag, If-None-Match → 304)",
        response=EndpointsDocument,
    ),
    ("POST", "/api/v1/tenants"): Operation(
        "Create a tenant",
        body=tenants.TenantCreate,
        response=tenants.Tenant,
        status=201,
        errors=(400, 409),
    ),
    ("GET", "/api/v1/tenants"): Operation(
        "List tenants by id (q: those whose id or name holds it)",
        response=list[tenants.Tenant],
        query=("q",),
        errors=(400,),
        paged=True,
    ),
    **_one(_TENANT, tenants.Tenant, tenants.TenantPatch, _TENANT_WORDS),
    ("POST", "/api/v1/projects"): Operation(
        "Create a project (id tenant/name); its limits may not exceed its tenant's",
        body=tenants.ProjectCreate,
        response=tenants.Project,
        status=201,
        errors=(400, 409),
    ),
    ("GET", "/api/v1/projects"): Operation(
        "List projects by id (q: those whose id or name holds it)",
        response=list[tenants.Project],
        query=("tenantId", "q"),
        errors=(400,),
        paged=True,
    ),
    **_one(_PROJECT, tenants.Project, tenants.ProjectPatch, _PROJECT_WORDS),
    ("POST", "/api/v1/keys"): Operation(
        "Issue a key: the secret is in this response only",
        body=keys.KeyCreate,
        response=keys.IssuedKey,
        status=201,
        errors=(400,),
    ),
    ("GET", "/api/v1/keys"): Operation(
        "List keys by creation (never their secrets)",
        response=list[keys.ApiKey],
        query=("projectId",),
        paged=True,
    ),
    ("DELETE", "/api/v1/keys/{key_id}"): Operation(
        "Revoke a key", response=keys.ApiKey, errors=(404,)
    ),
    ("POST", "/api/v1/budget-rules"): Operation(
        "Create a budget rule",
        body=budgets.RuleCreate,
        response=budgets.BudgetRule,
        status=201,
        errors=(400,),
    ),
    ("GET", "/api/v1/usage"): Operation(
        "Usage from the ledger's per-minute rollups, grouped by hour, day, model or project",
        response=list[UsageRow],
        query=("tenantId", "projectId", "model", "from", "to", "groupBy"),
        errors=(400,),
    ),
    ("GET", "/api/v1/usage-agreement"): Operation(
        "Per model, engine-reported against gateway-counted tokens over a window",
        response=list[Agreement],
        query=("model", "from", "to"),
        errors=(400,),
    ),
    ("GET", "/api/v1/model-rates"): Operation(
        "List unit rates (units per million tokens)", response=list[rates.ModelRates]
    ),
    ("GET", _RATES): Operation(
        "Read a model's unit rates", response=rates.ModelRates, errors=(404,)
    ),
    ("PUT", _RATES): Operation(
        "Set a model's unit rates (201 when new)",
        body=rates.RatesPut,
        response=rates.ModelRates,
        errors=(400,),
    ),
    ("DELETE", _RATES): Operation(
        "Remove a model's unit rates", response=rates.ModelRates, errors=(404,)
    ),
    ("GET", "/api/v1/budget-rules"): Operation(
        "List budget rules by creation (a tenant's key: its own and its projects')",
        response=list[budgets.BudgetRule],
        errors=(400,),
        paged=True,
    ),
    ("GET", _RULE): Operation("Read a budget rule", response=budgets.BudgetRule, errors=(404,)),
    ("PATCH", _RULE): Operation(
        "Change a budget rule's limit or window (its scope and dimension stay)",
        body=budgets.RulePatch,
        response=budgets.BudgetRule,
        errors=(400, 404),
    ),
    ("POST", "/api/v1/cost-rates"): Operation(
        "Set what one GPU-hour costs on a cluster (integer micro-units), from effectiveFrom on",
        body=costs.RateCreate,
        response=costs.CostRate,
        status=201,
        errors=(400, 409),
    ),
    ("GET", "/api/v1/cost-rates"): Operation(
        "List cost rates by cluster and start",
        response=list[costs.CostRate],
        query=("cluster",),
        paged=True,
    ),
    ("GET", "/api/v1/cost-periods"): Operation(
        "List closed months, oldest first", response=list[costs.CostPeriodSummary], paged=True
    ),
    ("GET", _PERIOD): Operation(
        "A closed month's report (YYYY-MM; Accept: text/csv or ?format=csv for CSV)",
        response=costs.CostReport,
        query=("format",),
        errors=(400, 404),
    ),
    ("PUT", _PERIOD): Operation(
        "Close a month (or recompute it, booking differences into the next month); 400 below "
        "the coverage threshold unless ?minCoverage lowers it; 409 once the next month closed, or "
        "while the month before, with data, was never closed",
        response=costs.CostReport,
        query=("minCoverage", "format"),
        errors=(400, 404, 409),
    ),
    ("DELETE", _RULE): Operation(
        "Delete a budget rule", response=budgets.BudgetRule, errors=(404,)
    ),
    ("POST", "/api/v1/models"): Operation(
        "Register a model (source: huggingface {repo, revision}, uri hf://owner/name@rev, or "
        "local {origin} for files a client imports)",
        body=registry.ModelCreate,
        response=registry.Model,
        status=201,
        errors=(400, 409),
    ),
    ("GET", "/api/v1/models"): Operation(
        "List registry models by registration", response=list[registry.Model], paged=True
    ),
    ("GET", _MODEL): Operation(
        "Read a model: status with reason, facts once Ready, unit rates",
        response=registry.Model,
        errors=(404,),
    ),
    ("PATCH", _MODEL): Operation(
        "Set the model's unit rates (stored in model_rates under the model id)",
        body=registry.ModelPatch,
        response=registry.Model,
        errors=(400, 404),
    ),
    ("DELETE", _MODEL): Operation(
        "Delete a model and its objects; 409 while the inventory shows a FleetModel using it",
        response=registry.Model,
        errors=(404, 409),
    ),
    ("GET", f"{_MODEL}/tokenizer"): Operation(
        "The tokenizer.json the gateway counts tokens with (Ready models that have one)",
        response=dict[str, Any],
        errors=(404,),
    ),
    ("GET", f"{_MODEL}/weights"): Operation(
        "The model's state and, once Ready, its files with size and sha256: the contract's "
        "ModelWeights (fleet_contract), read by the operator for registry: sources",
        response=fleet_contract.ModelWeights,
        errors=(404,),
    ),
    ("GET", f"{_MODEL}/files/{{name}}"): Operation(
        "One of a Ready model's files (a name in facts.files), streamed; Content-Length, "
        'ETag "<sha256>" and X-Fleet-Sha256 come from the facts; one Range gives 206 (416 past '
        "the end); 409 before the model is Ready",
        media_type="application/octet-stream",
        errors=(404, 409, 416),
    ),
    ("GET", f"{_MODEL}/fit"): Operation(
        "Can ?engine=vllm|llamacpp load this model? 409 with the reason when it cannot",
        response=registry.EngineFit,
        query=("engine",),
        errors=(400, 404, 409),
    ),
    ("POST", f"{_MODEL}/pull"): Operation(
        "Start pulling the weights (idempotent: a running pull is reported, not restarted)",
        response=registry.PullProgress,
        status=202,
        errors=(404,),
    ),
    ("GET", f"{_MODEL}/pull"): Operation(
        "Pull progress: files and bytes done/total, rate, ETA",
        response=registry.PullProgress,
        errors=(404,),
    ),
    ("DELETE", f"{_MODEL}/pull"): Operation(
        "Cancel the pull, removing every object it wrote",
        response=registry.PullProgress,
        errors=(404,),
    ),
    ("POST", f"{_MODEL}/import"): Operation(
        "Start importing a client's own files into a model registered with source.local: the "
        "plan lists each file's path, size and sha256 (what fleet models import sends)",
        body=registry.ImportPlan,
        response=registry.PullProgress,
        status=202,
        errors=(400, 404, 409),
    ),
    ("PUT", f"{_MODEL}/import/{{name}}"): Operation(
        "Upload one planned file as the raw body (streamed, hashed on arrival); after the last "
        "file the set is parsed and the answer shows Ready. 400 import_failed (size, sha256, "
        "format or an interrupted upload) leaves the model Failed",
        response=registry.PullProgress,
        uploads_bytes=True,
        errors=(400, 404, 409, 503),
    ),
    ("GET", f"{_MODEL}/pull/events"): Operation(
        "The same progress as server-sent events (text/event-stream, event: progress), ending "
        "when the pull does",
        response=registry.PullProgress,
        errors=(404,),
    ),
}
