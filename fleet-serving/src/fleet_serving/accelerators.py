"""Accelerators other than NVIDIA's in a node's inventory: AMD Instinct and Huawei Ascend.

P8 prices every card in the pool, so the report counts each vendor's extended resource with its
vendor and product. These facts feed the inventory; what a FleetModel asks for and where it is
placed come from its accelerator profile (:mod:`fleet_serving.devices`). Pure functions.

* AMD: ``amd.com/gpu`` (ROCm device plugin); product and memory from the AMD node labeller's
  ``amd.com/gpu.product-name`` and ``amd.com/gpu.vram`` (``192G``).
* Ascend: ``huawei.com/Ascend910`` and siblings (``Ascend910B``, ``Ascend310P``; the Ascend device
  plugin, on Kunpeng hosts for the 910B); virtual NPU slices (``huawei.com/Ascend910-2c``) are not
  whole cards and are not counted. The product comes from ``node.kubernetes.io/npu.chip.name``
  when the cluster labels it (``910B3``), else from the resource name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fleet_contract import Gpu

__all__ = ["AMD", "other_accelerators"]

AMD = "amd.com/gpu"
_AMD_PRODUCT = ("amd.com/gpu.product-name", "beta.amd.com/gpu.product-name")
_AMD_VRAM = ("amd.com/gpu.vram", "beta.amd.com/gpu.vram")
_ASCEND = re.compile(r"^huawei\.com/(Ascend[0-9]+[A-Za-z0-9]*)$")
_ASCEND_CHIP = "node.kubernetes.io/npu.chip.name"
_SIZE = re.compile(r"^([0-9]+)([MGT])i?$")
_MIB = {"M": 1, "G": 1024, "T": 1024 * 1024}


def _whole(value: Any) -> int:
    text = str(value)
    return int(text) if text.isdigit() else 0


def _mib(text: str | None) -> int:
    match = _SIZE.match(text or "")
    return int(match[1]) * _MIB[match[2]] if match else 0


def _first(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    return next((labels[k] for k in keys if labels.get(k)), None)


def _amd(allocatable: Mapping[str, Any], labels: Mapping[str, str]) -> list[Gpu]:
    count = _whole(allocatable.get(AMD, 0))
    if not count:
        return []
    product = _first(labels, _AMD_PRODUCT) or "unknown"
    memory = _mib(_first(labels, _AMD_VRAM))
    return [Gpu(vendor="amd", product=product, memory_mib=memory, count=count, resource=AMD)]


def _ascend(allocatable: Mapping[str, Any], labels: Mapping[str, str]) -> list[Gpu]:
    found = []
    for key, value in sorted(allocatable.items()):
        match = _ASCEND.match(key)
        count = _whole(value)
        if match is None or not count:
            continue
        product = labels.get(_ASCEND_CHIP) or match[1]
        found.append(Gpu(vendor="huawei", product=product, memory_mib=0, count=count,
                         resource=key))  # fmt: skip
    return found


def other_accelerators(allocatable: Mapping[str, Any], labels: Mapping[str, str]) -> list[Gpu]:
    """The node's AMD and Ascend cards, one entry per kind."""
    return _amd(allocatable, labels) + _ascend(allocatable, labels)
