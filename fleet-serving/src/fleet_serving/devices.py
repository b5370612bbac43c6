"""Accelerator profiles: what a replica on each kind of device asks for and is rendered with.

``spec.accelerator`` picks one (ADR 0025): NVIDIA whole GPUs, NVIDIA MIG slices, AMD GPUs (ROCm)
or Huawei Ascend NPUs. A profile names the extended resource the vendor's device plugin
advertises, the engine image built for the device, and the host paths the vendor's driver must
be mounted from. Profiles are data declared here: nothing in a FleetModel adds a host path.
Sources for every name are cited in docs/operator.md ("Accelerators"). Pure functions.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from fleet_contract import CardShare, Engine
from fleet_serving.errors import InvalidSpec
from fleet_serving.spec import FleetModelSpec

__all__ = [
    "AMD",
    "ASCEND",
    "NVIDIA",
    "NVIDIA_GPU",
    "DeviceProfile",
    "HostMount",
    "card_share",
    "check",
    "check_namespace",
    "device_profile",
    "host_volumes",
    "resource_name",
    "volume_mounts",
]

NVIDIA_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
LLAMACPP_BUILD = "b6800"
"""The llama.cpp release whose ``server`` images are run (also in :mod:`fleet_serving.profiles`)."""


class HostMount(msgspec.Struct, kw_only=True, frozen=True):
    """A host path a vendor's user-space driver needs inside the engine container, read-only."""

    name: str
    path: str
    type: Literal["Directory", "File"]


class DeviceProfile(msgspec.Struct, kw_only=True, frozen=True):
    """One kind of accelerator; the renderer and placement read nothing else about devices."""

    kind: Literal["nvidia", "nvidia-mig", "amd", "huawei"]
    resource: str
    """The extended resource a replica asks ``gpusPerReplica`` of."""
    images: dict[str, str]
    """The engine image for this device, by engine; an engine missing has no official build."""
    missing: dict[str, str] = {}
    """Why an engine has no image here, by engine: the status reason when no ``spec.image``."""
    command: dict[str, list[str]] = {}
    """An entrypoint to set, by engine, for images that start a shell rather than the server."""
    env: tuple[tuple[str, str], ...] = ()
    host_mounts: tuple[HostMount, ...] = ()
    nvidia_compute: bool = False
    """Whether vLLM's compute-capability floor (NVIDIA GFD labels) applies."""


_VLLM_CUDA = "vllm/vllm-openai:v0.11.0"
_LLAMACPP_CUDA = f"ghcr.io/ggml-org/llama.cpp:server-cuda-{LLAMACPP_BUILD}"

NVIDIA = DeviceProfile(
    kind="nvidia",
    resource=NVIDIA_GPU,
    images={"vllm": _VLLM_CUDA, "llamacpp": _LLAMACPP_CUDA},
    nvidia_compute=True,
)
AMD = DeviceProfile(
    kind="amd",
    resource="amd.com/gpu",
    images={
        # AMD's own vLLM build for ROCm; its entrypoint is a shell, so the server is named.
        "vllm": "rocm/vllm:rocm7.0.0_vllm_0.11.2_20251210",
        "llamacpp": f"ghcr.io/ggml-org/llama.cpp:server-rocm-{LLAMACPP_BUILD}",
    },
    command={"vllm": ["vllm", "serve"]},
)
_DRIVER = "/usr/local/Ascend/driver"
ASCEND = DeviceProfile(
    kind="huawei",
    resource="huawei.com/Ascend910",
    images={"vllm": "quay.io/ascend/vllm-ascend:v0.13.0"},
    missing={
        "llamacpp": (
            "llama.cpp publishes no image for Ascend NPUs (its CANN backend is built locally, "
            "docs/backend/CANN.md): set spec.image to your own CANN build of llama-server"
        )
    },
    command={"vllm": ["vllm", "serve"]},
    # vllm-ascend's quick start mounts exactly these from the host: the device plugin gives
    # the /dev/davinci* nodes, the driver's user-space libraries come from the host.
    host_mounts=(
        HostMount(name="ascend-dcmi", path="/usr/local/dcmi", type="Directory"),
        HostMount(name="ascend-npu-smi", path="/usr/local/bin/npu-smi", type="File"),
        HostMount(name="ascend-driver-lib64", path=f"{_DRIVER}/lib64", type="Directory"),
        HostMount(name="ascend-driver-version", path=f"{_DRIVER}/version.info", type="File"),
        HostMount(name="ascend-install-info", path="/etc/ascend_install.info", type="File"),
    ),
)
_BY_VENDOR = {"nvidia": NVIDIA, "amd": AMD, "huawei": ASCEND}


def device_profile(spec: FleetModelSpec) -> DeviceProfile:
    """The profile of the spec's accelerator (a MIG profile makes NVIDIA's a slice)."""
    accelerator = spec.accelerator
    if accelerator.mig_profile:
        resource = f"{MIG_PREFIX}{accelerator.mig_profile}"
        return msgspec.structs.replace(NVIDIA, kind="nvidia-mig", resource=resource,
                                       nvidia_compute=False)  # fmt: skip
    return _BY_VENDOR[accelerator.vendor]


def resource_name(spec: FleetModelSpec) -> str:
    """The extended resource each replica asks ``gpusPerReplica`` of."""
    return device_profile(spec).resource


def host_volumes(device: DeviceProfile) -> list[dict[str, object]]:
    """The pod volumes of the profile's host mounts (none for most devices)."""
    return [{"name": m.name, "hostPath": {"path": m.path, "type": m.type}}
            for m in device.host_mounts]  # fmt: skip


def volume_mounts(device: DeviceProfile) -> list[dict[str, object]]:
    """The engine container's read-only mounts of the profile's host paths."""
    return [{"name": m.name, "mountPath": m.path, "readOnly": True} for m in device.host_mounts]


def check(spec: FleetModelSpec, engine: Engine) -> DeviceProfile:
    """The spec's device profile, or :class:`InvalidSpec` saying why it cannot run ``engine``."""
    device = device_profile(spec)
    if not spec.gpus_per_replica:
        return device
    if engine not in device.images and not spec.image:
        why = device.missing.get(engine, f"{engine} has no official image for {device.kind}")
        raise InvalidSpec(f"spec.accelerator {device.kind}: {why}")
    if device.kind == "nvidia-mig" and spec.gpus_per_replica > 1:
        raise InvalidSpec(
            "spec.accelerator.migProfile: a CUDA process sees one MIG device, so gpusPerReplica "
            "must be 1 with a MIG profile (ask for a larger profile instead)"
        )
    return device


def check_namespace(device: DeviceProfile, namespace: str, allowed: frozenset[str]) -> None:
    """Refuse a device whose driver is mounted from the host (Ascend) outside the namespaces the
    install made for it: hostPath volumes fail Pod Security ``restricted`` and ``baseline``, so
    such a namespace enforces ``privileged`` and is named to the operator
    (``--host-mount-namespace``); the models namespace stays ``restricted`` (ADR 0025)."""
    if device.host_mounts and namespace not in allowed:
        named = ", ".join(sorted(allowed)) or "none is configured"
        raise InvalidSpec(
            f"spec.accelerator {device.kind}: the driver is mounted from the host (hostPath), "
            f"which Pod Security restricted and baseline forbid in namespace {namespace}; "
            f"create this FleetModel in a host-mount namespace ({named}; see docs/operator.md, "
            "Accelerators)"
        )


_MIG = re.compile(r"^([1-9])g\.[0-9]+gb(\+me)?$")
_A30_PROFILES = frozenset({"1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"})
"""The A30's MIG profiles (NVIDIA's MIG user guide, "Supported MIG Profiles"): its card has 4
compute slices where every other MIG-capable card (A100, H100, H200, B200…) has 7, and no other
card names a profile with 6 GB per compute slice."""


def card_share(profile: str, product: str | None = None) -> CardShare | None:
    """What part of its card a MIG slice is: its compute slices (the ``Ng`` of ``Ng.Mgb``) over
    the card's, 4 on an A30 (known by the profile, or the GFD product label) and 7 elsewhere.
    None when the profile is not a MIG profile."""
    match = _MIG.match(profile)
    if match is None:
        return None
    slices = 4 if profile in _A30_PROFILES or "A30" in (product or "") else 7
    used = int(match[1])
    return CardShare(numerator=used, denominator=slices) if used <= slices else None
