"""What a report's devices are worth in cards: whole GPUs, and MIG slices as their part of one.

The cost pool prices GPU-time by the card (ADR 0026). A node whose cards are partitioned with
the NVIDIA device plugin's mixed strategy advertises ``nvidia.com/gpu: 0`` and, say,
``nvidia.com/mig-1g.10gb: 7``: its report counts no whole GPU, and each slice carries its
``share`` of a card (1/7). Shares are exact fractions, so seven such slices are one card, not
0.99999. A slice without a share (a reporter older than contract 1.4.0) is not priced.

The rules here refuse what a peer could claim to move money: a share above a whole card, more
cards than a count may hold, and a deployment whose share is not what its slices are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from fractions import Fraction
from typing import NoReturn

from fleet_contract import CardShare, Gpu, InventoryReport, ModelDeployment
from fleet_core.shared.errors import InvalidRequest

__all__ = ["MIG_PREFIX", "capacity", "check_shares", "gpu_cards", "slice_cards", "value"]

MIG_PREFIX = "nvidia.com/mig-"
"""The extended resources of MIG slices (``nvidia.com/mig-1g.10gb``): the only accelerators a
``gpuShare`` is accepted with. Another partitioning scheme is a new decision, not a default."""
_MIG = re.compile(re.escape(MIG_PREFIX) + r"(.+)")


def value(share: CardShare) -> Fraction:
    return Fraction(share.numerator, share.denominator)


def gpu_cards(gpu: Gpu) -> Fraction:
    """One GPU entry in cards: its whole devices and its slices that say their share."""
    return gpu.count + sum(
        (m.count * value(m.share) for m in gpu.mig_slices if m.share is not None), Fraction(0)
    )


def slice_cards(report: InventoryReport) -> Fraction:
    """The cards' worth of priced MIG slices in the report (whole GPUs left out)."""
    return capacity(report) - sum(g.count for node in report.nodes for g in node.gpus)


def capacity(report: InventoryReport) -> Fraction:
    """What the cost pool prices of the cluster at this instant, in cards, exactly."""
    return sum((gpu_cards(g) for node in report.nodes for g in node.gpus), Fraction(0))


def check_shares(report: InventoryReport, *, max_cards: int) -> None:
    """400 naming the first share or total out of bounds (see the module docstring)."""
    advertised: dict[str, set[Fraction]] = {}
    for path, gpu in _gpus(report):
        for m, mig in enumerate(gpu.mig_slices):
            if mig.share is not None:
                _require_part(mig.share, f"{path}.migSlices[{m}].share")
                advertised.setdefault(mig.profile, set()).add(value(mig.share))
        if gpu_cards(gpu) > max_cards:
            _refuse(
                f"{path}.migSlices",
                f"{path}.count and {path}.migSlices add up to {gpu_cards(gpu)} cards; a GPU"
                f" entry holds at most {max_cards}",
            )
    if capacity(report) > max_cards:
        _refuse(
            "nodes",
            f"the nodes add up to {capacity(report)} cards with their slices; a report"
            f" holds at most {max_cards}",
        )
    for d, deployment in enumerate(report.deployments):
        _check_deployment(deployment, f"deployments[{d}].gpuShare", advertised)


def _check_deployment(
    deployment: ModelDeployment, path: str, advertised: dict[str, set[Fraction]]
) -> None:
    """A replica on MIG slices says what part of a card each is, and only then; when the nodes
    advertise its profile with a share, its share is one of those."""
    mig = _MIG.fullmatch(deployment.accelerator or "")
    share = deployment.gpu_share
    if share is None:
        if mig:
            message = (
                f"{path} is missing: accelerator {deployment.accelerator} is a MIG slice, and a"
                " replica on slices is priced as its part of a card"
            )
            _refuse(path, message, code="invalid_share")
        return
    if not mig:
        message = (
            f"{path} is only for MIG slices (accelerator {MIG_PREFIX}<profile>), not"
            f" {deployment.accelerator or 'whole GPUs'}"
        )
        _refuse(path, message, code="invalid_share")
    _require_part(share, path)
    known = advertised.get(mig[1], set())
    if known and value(share) not in known:
        listed = ", ".join(sorted(str(v) for v in known))
        message = f"{path} is {value(share)} but the nodes advertise {mig[1]} as {listed} of a card"
        _refuse(path, message, code="invalid_share")


def _gpus(report: InventoryReport) -> Iterator[tuple[str, Gpu]]:
    for n, node in enumerate(report.nodes):
        for g, gpu in enumerate(node.gpus):
            yield f"nodes[{n}].gpus[{g}]", gpu


def _require_part(share: CardShare, path: str) -> None:
    if share.numerator > share.denominator:
        message = (
            f"{path} is {share.numerator}/{share.denominator}; a device is at most a whole card"
            " (numerator ≤ denominator)"
        )
        _refuse(path, message)


def _refuse(path: str, message: str, *, code: str = "out_of_range") -> NoReturn:
    raise InvalidRequest(message, param=path, code=code)
