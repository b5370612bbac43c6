"""Rate limits by tenant (the envelope) and by project (a partition of it), from the environment.

Two levels, both checked on every request: a project limit alone is arithmetic the tenant does (ten
projects at 600 rpm is 6000), so the tenant envelope is what makes partitions add up. A dimension a
level does not declare is unlimited at that level; for a project that means "no limit of its own",
not the tenant default. ``FLEET_RATE_RPM`` / ``FLEET_RATE_TPM`` apply to tenants nobody declared.

    FLEET_RATE_TENANTS='acme|rpm=1200,tpm=400000;globex|rpm=100'
    FLEET_RATE_PROJECTS='acme/research|rpm=600,tpm=200000;acme/batch|tpm=20000'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet_core.gateway.admission.key_ring import Principal
from fleet_core.gateway.admission.limits import Bucket, Dimension
from fleet_core.shared.errors import ConfigError

__all__ = ["Limits", "RatePolicy", "parse_limits", "parse_policy"]

DIMENSIONS: tuple[Dimension, ...] = ("rpm", "tpm")


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None

    def get(self, dimension: Dimension) -> int | None:
        return self.rpm if dimension == "rpm" else self.tpm


@dataclass(frozen=True)
class RatePolicy:
    tenants: Mapping[str, Limits] = field(default_factory=dict)
    projects: Mapping[str, Limits] = field(default_factory=dict)
    default: Limits = Limits()
    default_max_tokens: int = 4096
    """What a request without ``max_tokens`` reserves for its completion."""

    def buckets(self, principal: Principal, *, prefix: str = "") -> list[Bucket]:
        """Every bucket a request of ``principal`` draws from; all share the tenant's hash tag."""
        tenant_limits = self.tenants.get(principal.tenant, self.default)
        project_name = f"{principal.tenant}/{principal.project}"
        project_limits = self.projects.get(project_name, Limits())
        tag = f"{prefix}fleet:rl:{{{principal.tenant}}}"
        out = []
        for dim in DIMENSIONS:
            if (cap := tenant_limits.get(dim)) is not None:
                out.append(Bucket(f"{tag}:tenant:{dim}", "tenant", dim, cap))
            if (cap := project_limits.get(dim)) is not None:
                out.append(Bucket(f"{tag}:project:{principal.project}:{dim}", "project", dim, cap))
        return out


def _positive(value: str, where: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{where}: {value!r} is not a positive integer")
    return int(value)


def parse_limits(text: str, where: str) -> Limits:
    """``rpm=600,tpm=200000`` (either may be absent)."""
    found: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in DIMENSIONS:
            raise ConfigError(f"{where}: {part!r} is not rpm=N or tpm=N")
        found[name.strip()] = _positive(value.strip(), f"{where} {name.strip()}")
    return Limits(rpm=found.get("rpm"), tpm=found.get("tpm"))


def _entries(spec: str, variable: str) -> dict[str, Limits]:
    out: dict[str, Limits] = {}
    for entry in (e.strip() for e in spec.split(";") if e.strip()):
        name, sep, limits = entry.partition("|")
        if not sep or not name.strip():
            raise ConfigError(f"{variable}: {entry!r} is not NAME|rpm=N,tpm=N")
        if name.strip() in out:
            raise ConfigError(f"{variable}: {name.strip()!r} is declared twice")
        out[name.strip()] = parse_limits(limits, f"{variable} {name.strip()}")
    return out


def parse_policy(env: Mapping[str, str]) -> RatePolicy:
    """The policy from FLEET_RATE_* and FLEET_DEFAULT_MAX_TOKENS; ConfigError on any problem."""
    default = Limits(rpm=_optional(env, "FLEET_RATE_RPM"), tpm=_optional(env, "FLEET_RATE_TPM"))
    tenants = _entries(env.get("FLEET_RATE_TENANTS", ""), "FLEET_RATE_TENANTS")
    projects = _entries(env.get("FLEET_RATE_PROJECTS", ""), "FLEET_RATE_PROJECTS")
    for name, limits in projects.items():
        tenant, sep, project = name.partition("/")
        if not sep or not tenant or not project or "/" in project:
            raise ConfigError(f"FLEET_RATE_PROJECTS: {name!r} is not tenant/project")
        _check_within(name, limits, tenants.get(tenant, default), tenant)
    max_tokens = _optional(env, "FLEET_DEFAULT_MAX_TOKENS") or 4096
    return RatePolicy(tenants, projects, default, max_tokens)


def _optional(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    return _positive(raw, name) if raw else None


def _check_within(name: str, limits: Limits, envelope: Limits, tenant: str) -> None:
    for dim in DIMENSIONS:
        own, outer = limits.get(dim), envelope.get(dim)
        if own is not None and outer is not None and own > outer:
            raise ConfigError(
                f"FLEET_RATE_PROJECTS: {name} {dim}={own} is above tenant {tenant}'s "
                f"{dim}={outer}; it could never apply: lower it or raise the tenant's envelope"
            )
