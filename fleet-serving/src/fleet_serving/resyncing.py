"""The periodic resync: every FleetModel reconciled again each ``--resync``, operator-wide.

It catches what events missed (a handler that gave up, a watch that dropped something) and puts
back hand edits of the Deployments and Services the operator owns. It is one loop, run next to
the inventory reporter, over the FleetModels the watch put in the view, rather than a kopf timer
per object: kopf guards every object a timer runs on with a finalizer, which made each
``kubectl delete`` of a FleetModel wait for a running operator. Nothing at deletion needs one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

import kopf

from fleet_serving.errors import InvalidSpec
from fleet_serving.handlers import Deps, reconcile
from fleet_serving.view import Key

__all__ = ["resync", "resync_forever"]

logger = logging.getLogger("fleet_serving.resync")


class _ModelLogger(logging.LoggerAdapter[logging.Logger]):
    """Prefixes a model's lines with its namespace/name, as kopf's object loggers do."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return f"[{self.extra['model'] if self.extra else '?'}] {msg}", kwargs


async def resync_forever(deps: Deps, *, interval: float) -> None:
    """Resync every ``interval`` seconds until cancelled (at operator shutdown)."""
    while True:
        await asyncio.sleep(interval)
        await resync(deps)


async def resync(deps: Deps) -> int:
    """Reconcile each FleetModel the view holds, except those being deleted; how many failed.

    One model failing (a spec that cannot run, an API error) is logged and leaves the others and
    the next pass alone.
    """
    keys = list(deps.view.bodies)
    failed = 0
    for key in keys:
        body = deps.view.bodies.get(key)  # it may have gone while an earlier one reconciled
        if body is not None and not _deleting(body):
            failed += not await _reconcile(deps, key, body)
    logger.info(f"Resync of {len(keys)} FleetModels done, {failed} failed.")
    return failed


def _deleting(body: Mapping[str, Any]) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


async def _reconcile(deps: Deps, key: Key, body: Mapping[str, Any]) -> bool:
    said = _ModelLogger(logger, {"model": f"{key[0]}/{key[1]}"})
    try:
        await reconcile(body, deps, said)
    except InvalidSpec:
        return True  # its status says why; only a spec change can help
    except kopf.TemporaryError as exc:
        said.warning(f"Resync failed: {exc}")
        return False
    except Exception:
        said.exception("Resync failed unexpectedly.")
        return False
    return True
