"""LoRA adapters in routing: an adapter's name is a pool of its base's endpoints (ADR 0028).

A FleetModel's adapters reach the gateway in the endpoints document, each with its position in
the deployment (``DiscoveredAdapter``). The routing table gives each adapter name a pool of its
own over the base's endpoints, so admission, the ledger, usage and budgets see the adapter's
name as the model, as for any other. What the engine must be told differs:

- vLLM serves each adapter as a model of its own: forwarding its name is all it takes.
- llama.cpp's ``llama-server`` serves one model name and applies adapters per request, by the
  body's ``lora`` field (``[{"id": i, "scale": 1.0}]``; every adapter not named gets scale 0).
  Without the field it applies its global scales, which ``--lora-init-without-apply`` was meant
  to zero but recent builds leave at 1 (an open upstream bug): so the gateway owns the field on
  llama.cpp pools. An adapter's pool names its id at scale 1; the base's pool, when its
  endpoints load adapters, names id 0 at scale 0 (all adapters off, in every build); a
  client's own ``lora`` is dropped (it would bill an adapted answer under the base's name, or
  another adapter's).

An adapter without a model rate of its own is rated as its base (`rated_as`): it runs on the
base's replicas and costs what they cost; free by omission would be a hole in billing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet_core.gateway.config import EngineKind

__all__ = ["LORA_FIELD", "AdapterOf", "rated_as", "select"]

LORA_FIELD = "lora"
"""llama-server's per-request adapter selection."""


@dataclass(frozen=True, slots=True)
class AdapterOf:
    """What makes a pool an adapter's: its base model's name, and its id among the base's
    adapters (the position the operator loaded it at)."""

    base: str
    index: int


def select(
    body: dict[str, Any], engine: EngineKind, adapter: AdapterOf | None, *, loaded: bool
) -> None:
    """Make ``body`` (the forwarded request, changed in place) select ``adapter``, or none;
    ``loaded``: the pool's endpoints load adapters (else there is no id 0 to turn off, and
    llama-server refuses an unknown id)."""
    if engine != "llamacpp":
        return
    body.pop(LORA_FIELD, None)
    if adapter is not None:
        body[LORA_FIELD] = [{"id": adapter.index, "scale": 1.0}]
    elif loaded:
        body[LORA_FIELD] = [{"id": 0, "scale": 0.0}]


def rated_as(name: str, adapter: AdapterOf | None) -> tuple[str, ...]:
    """The model names whose rate applies to a pool, first found wins: its own, then, for an
    adapter, its base's."""
    return (name,) if adapter is None else (name, adapter.base)
