"""What a cluster may serve: the admin's binding of a cluster to model names and addresses.

An operator credential speaks for one cluster, and what it reports reaches routing: a deployment's
served model name becomes a name tenants call, its endpoint URLs receive their prompts and the
engine key. So which names a cluster may serve and which addresses its endpoints may have are the
admin's decision, not the cluster's (ADR 0020). A binding lists both; a report that steps outside
it is refused naming the field, and a cluster without one serves nothing (closed by default).

Pure functions over the wire types; the store keeps bindings, the routes serve them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Annotated
from urllib.parse import SplitResult, urlsplit

import msgspec

from fleet_contract import InventoryReport
from fleet_core.shared.errors import InvalidRequest, PermissionDenied

__all__ = [
    "Binding",
    "BindingBody",
    "EndpointPattern",
    "allows_endpoint",
    "check_report",
    "parse_patterns",
]

_MAX_ENTRIES = 256
_NAME = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_HOST = re.compile(
    r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


class BindingBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``PUT /api/v1/clusters/{cluster_id}/binding``: the whole binding, replaced."""

    served_models: Annotated[list[_NAME], msgspec.Meta(max_length=_MAX_ENTRIES)]
    """Served model names the cluster may report, exactly (no patterns: each is a routing name);
    a deployment's LoRA adapter names too, each a routing name of its own (ADR 0028)."""
    endpoints: Annotated[list[_NAME], msgspec.Meta(max_length=_MAX_ENTRIES)]
    """Where its endpoints may be: CIDRs (``10.42.0.0/16``), host names, or ``*.suffix``."""


class Binding(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cluster_id: str
    served_models: list[str]
    endpoints: list[str]
    updated_at: datetime
    updated_by: str


class EndpointPattern(msgspec.Struct, frozen=True):
    """One parsed entry of ``endpoints``: a network, or a host name (``*.`` matches below it)."""

    text: str
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    host: str | None = None
    below: bool = False

    def matches(self, host: str) -> bool:
        if self.network is not None:
            try:
                address = ipaddress.ip_address(host)
            except ValueError:
                return False
            return address.version == self.network.version and address in self.network
        if self.below:
            return host.endswith("." + (self.host or ""))
        return host == self.host


def parse_patterns(texts: Iterable[str]) -> list[EndpointPattern]:
    """The binding's ``endpoints``; 400 naming the first one that is neither a CIDR nor a host."""
    parsed = []
    for i, text in enumerate(texts):
        lowered = text.strip().lower()
        try:
            parsed.append(EndpointPattern(text, network=ipaddress.ip_network(lowered)))
            continue
        except ValueError:
            pass
        if not _HOST.match(lowered) or _is_address_like(lowered):
            raise InvalidRequest(
                f"endpoints[{i}] must be a CIDR (10.42.0.0/16, host bits zero) or a host name"
                f" (engines.example, *.svc.cluster.local), not {text[:80]!r}",
                param=f"endpoints[{i}]",
            )
        below = lowered.startswith("*.")
        parsed.append(EndpointPattern(text, host=lowered.removeprefix("*."), below=below))
    return parsed


def _is_address_like(text: str) -> bool:
    """A dotted number that is not a valid network (``10.0.0.1/33``, ``10.1``): a typo, refused
    rather than taken for a host name."""
    return bool(re.fullmatch(r"[0-9.:/]+", text))


def _host_of(url: str) -> str | None:
    """The URL's host when it is a plain engine base URL: http(s), no credentials, query or
    fragment, no path beyond ``/``. None when it is anything else."""
    try:
        parts: SplitResult = urlsplit(url)
        _ = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return None
    if parts.query or parts.fragment or parts.path not in ("", "/"):
        return None
    return parts.hostname.lower()


def allows_endpoint(patterns: Iterable[EndpointPattern], url: str) -> bool:
    host = _host_of(url)
    return host is not None and any(p.matches(host) for p in patterns)


def _outside(report: InventoryReport, binding: Binding | None) -> Iterator[tuple[str, str]]:
    models = set(binding.served_models) if binding else set()
    patterns = parse_patterns(binding.endpoints) if binding else []
    for d, deployment in enumerate(report.deployments):
        if deployment.served_model_name not in models:
            yield f"deployments[{d}].servedModelName", deployment.served_model_name
        for a, adapter in enumerate(deployment.adapters):
            if adapter not in models:
                yield f"deployments[{d}].adapters[{a}]", adapter
        for e, endpoint in enumerate(deployment.endpoints):
            if not allows_endpoint(patterns, endpoint.url):
                yield f"deployments[{d}].endpoints[{e}].url", endpoint.url


def check_report(report: InventoryReport, binding: Binding | None) -> None:
    """403 naming the first field of ``report`` outside ``binding`` (None: the cluster has no
    binding, so any deployment is outside it)."""
    for path, value in _outside(report, binding):
        why = (
            "has no binding: an admin sets one with PUT /api/v1/clusters/{id}/binding"
            if binding is None
            else "is bound to other served models and endpoint addresses"
        )
        raise PermissionDenied(
            f"{path} is {value[:120]!r}, outside what the admin bound cluster"
            f" {report.cluster_id[:64]!r} to: the cluster {why}",
            param=path,
            code="outside_binding",
        )
