"""Who may call each ``/api/v1`` route: the one table (docs/security.md explains the roles).

``admin`` may call everything, so the table lists the other roles. A route missing here stops the
control plane from being built (``auth.guard.protect``), and a test walks every served route and
every role against this table. Rows that read per-tenant data also narrow them in their handler
(``guard.tenant_scope``): a tenant key reads its own tenant's only.
"""

from __future__ import annotations

from fleet_core.control_plane.auth.guard import Policy, allow
from fleet_core.control_plane.auth.wire import Role

__all__ = ["ANY_CREDENTIAL", "POLICY"]

_TENANT = "/api/v1/tenants/{tenant_id}"
_PROJECT = "/api/v1/projects/{project_id:path}"
_RULE = "/api/v1/budget-rules/{rule_id}"
_RATES = "/api/v1/model-rates/{model:path}"
_PERIOD = "/api/v1/cost-periods/{period}"
_MODEL = "/api/v1/models/{model_id}"
_CREDENTIAL = "/api/v1/credentials/{credential_id}"
_CLUSTER = "/api/v1/clusters/{cluster_id}"

ADMIN = allow()
ROLES: tuple[Role, ...] = ("admin", "finance", "operator", "engine", "gateway", "metrics", "tenant")
ANY_CREDENTIAL = allow(*ROLES)
"""Any valid credential: ``whoami``, and the 503 stand-ins of database routes without one."""

POLICY: dict[tuple[str, str], Policy] = {
    ("GET", "/api/v1/openapi.json"): Policy(public=True),
    ("GET", "/api/v1/whoami"): ANY_CREDENTIAL,
    # inventory: the operator reports its own cluster, inside the binding the admin gave it
    # (checked in the handler; accepted and refused reports are both audited); the gateway reads
    # the endpoints it routes to
    ("PUT", "/api/v1/inventory"): allow("operator", action="report", audit_refusals=True),
    ("PUT", f"{_CLUSTER}/binding"): ADMIN,
    ("GET", f"{_CLUSTER}/binding"): allow("finance"),
    ("DELETE", f"{_CLUSTER}/binding"): ADMIN,
    ("GET", "/api/v1/inventory"): allow("finance"),
    ("GET", _CLUSTER): allow("finance"),
    ("DELETE", _CLUSTER): ADMIN,  # decommission: it changes coverage
    ("GET", "/api/v1/endpoints"): allow("gateway"),
    # tenants, projects, keys, budget rules: admin writes; a tenant key reads its own
    ("POST", "/api/v1/tenants"): ADMIN,
    ("GET", "/api/v1/tenants"): allow("finance"),
    ("GET", _TENANT): allow("finance", "tenant"),
    ("PATCH", _TENANT): ADMIN,
    ("DELETE", _TENANT): ADMIN,
    ("POST", "/api/v1/projects"): ADMIN,
    ("GET", "/api/v1/projects"): allow("finance", "tenant"),
    ("GET", _PROJECT): allow("finance", "tenant"),
    ("PATCH", _PROJECT): ADMIN,
    ("DELETE", _PROJECT): ADMIN,
    ("POST", "/api/v1/keys"): ADMIN,
    ("GET", "/api/v1/keys"): allow("tenant"),
    ("DELETE", "/api/v1/keys/{key_id}"): allow(action="revoke"),
    ("POST", "/api/v1/budget-rules"): ADMIN,
    ("GET", "/api/v1/budget-rules"): allow("finance", "tenant"),
    ("GET", _RULE): allow("finance", "tenant"),
    ("PATCH", _RULE): ADMIN,
    ("DELETE", _RULE): ADMIN,
    # usage and money: finance
    ("GET", "/api/v1/usage"): allow("finance", "tenant"),
    ("GET", "/api/v1/usage-agreement"): allow("finance"),
    ("GET", "/api/v1/model-rates"): allow("finance"),
    ("GET", _RATES): allow("finance"),
    ("PUT", _RATES): allow("finance"),
    ("DELETE", _RATES): allow("finance"),
    ("POST", "/api/v1/cost-rates"): allow("finance"),
    ("GET", "/api/v1/cost-rates"): allow("finance"),
    ("GET", "/api/v1/cost-periods"): allow("finance"),
    ("GET", _PERIOD): allow("finance"),
    ("PUT", _PERIOD): allow("finance", action="close"),
    # the model registry: admin manages it; engines (and the operator) read what they load
    ("POST", "/api/v1/models"): ADMIN,
    ("GET", "/api/v1/models"): ADMIN,
    ("GET", _MODEL): ADMIN,
    ("PATCH", _MODEL): ADMIN,
    ("DELETE", _MODEL): ADMIN,
    ("GET", f"{_MODEL}/tokenizer"): allow("gateway"),
    ("GET", f"{_MODEL}/weights"): allow("operator", "engine"),
    ("GET", f"{_MODEL}/files/{{name:path}}"): allow("engine"),
    ("GET", f"{_MODEL}/fit"): ADMIN,
    ("POST", f"{_MODEL}/pull"): allow(action="pull"),
    ("GET", f"{_MODEL}/pull"): ADMIN,
    ("DELETE", f"{_MODEL}/pull"): allow(action="cancel"),
    ("GET", f"{_MODEL}/pull/events"): ADMIN,
    ("POST", f"{_MODEL}/import"): allow(action="import"),
    ("PUT", f"{_MODEL}/import/{{name:path}}"): allow(
        action="upload", media="application/octet-stream"
    ),
    # credentials and the audit trail
    ("POST", "/api/v1/credentials"): ADMIN,
    ("GET", "/api/v1/credentials"): ADMIN,
    ("DELETE", _CREDENTIAL): allow(action="revoke"),
    ("GET", "/api/v1/audit-events"): ADMIN,
}
