"""Where an engine pod keeps its weights: a shared model cache, or a bounded emptyDir.

Without a cache every pod downloads its model into its own ``models`` emptyDir: every replica,
restart and rollout pulls the whole model again. A FleetModel whose ``registry:`` source names
``spec.modelVolume.cacheClaim`` mounts that PersistentVolumeClaim at :data:`CACHE_DIR`, and its
fetch init container keeps each file there once, under its sha256 (:data:`CACHE_SCRIPT`); the
``models`` emptyDir then holds only symbolic links into the cache, and the engine mounts both
read-only. ADR 0027 records why the cache is keyed by file, why the claim is the user's, and
what cleans it.

Every emptyDir gets a ``sizeLimit``, and the container that writes it an ``ephemeral-storage``
request, wherever the size is known (:func:`model_bytes`), so the scheduler places the pod on a
node with the room and the kubelet evicts it for its own excess, not a neighbour's. Pure
functions only.
"""

from __future__ import annotations

from typing import Any

from fleet_serving import sources
from fleet_serving.sources import RegistryWeights
from fleet_serving.spec import FleetModelSpec

__all__ = [
    "CACHE_DIR",
    "CACHE_SCRIPT",
    "SCRATCH_LIMIT",
    "SCRATCH_REQUEST",
    "engine_mounts",
    "engine_storage",
    "fetch_env",
    "fetch_mounts",
    "fetch_script",
    "fetch_storage",
    "model_bytes",
    "pod_security",
    "quantity",
    "scratch_volume",
    "volumes",
]

Obj = dict[str, Any]
MI = 2**20
CACHE_DIR = "/model-cache"
"""Where the cache claim is mounted, in the fetch container (read-write) and the engine
(read-only) alike: the links in ``/models`` point at absolute paths under it."""
LINKS_BYTES = 16 * MI
"""The ``models`` emptyDir of a cached model holds only links: a few hundred bytes each."""
HEADROOM_BYTES = 64 * MI
"""Added to a registry model's total, with 2 % of it, for the filesystem's blocks and
directories: a ``.partial`` file becomes its final name in place, so nothing is held twice."""
SCRATCH_LIMIT = "4Gi"
"""The ``tmp`` emptyDir (``HOME``) of every container: vLLM's torch and triton compile caches
take a few hundred MiB; four GiB bounds a runaway writer without evicting a normal engine."""
SCRATCH_REQUEST = 256 * MI
"""What the engine is expected to write under ``HOME``, requested so the scheduler counts it."""

CACHE_SCRIPT = (
    sources.FETCH_PRELUDE
    + """\
store="$CACHE_DIR/sha256"; work="$CACHE_DIR/partial"
mkdir -p "$store" "$work"
# A pod that died mid-download and never came back leaves its partial: gone after a day unwritten.
find "$work" -type f -mmin +1440 -exec rm -f {} \\; 2>/dev/null || true
while [ "$#" -ge 3 ]; do
  name=$1; url=$2; sha=$3; shift 3
  blob="$store/$sha"
  if [ -f "$blob" ]; then
    echo "cached $name"
    touch -c "$blob" 2>/dev/null || true  # its mtime is its last use, for whoever cleans
  else
    part="$work/$sha.${POD_NAME:?}"
    download "$part" "$url" "$sha" "$name"
    mv -f "$part" "$blob"  # rename(2) on one volume: all or nothing, and a racer's is identical
  fi
  mkdir -p "$(dirname "$name")"
  ln -sfn "$blob" "$name"
done
"""
)
"""The fetch script with a cache: the same arguments and credential as
:data:`fleet_serving.sources.FETCH_SCRIPT`. A file is downloaded only when
``$CACHE_DIR/sha256/<sha256>`` is absent; it is fetched to a partial file of this pod's own
(``POD_NAME``, so a restarted init container resumes it and no two pods write one file), checked,
and renamed into the store, so a name in the store is always a complete, verified file. Two pods
fetching one file at once both download it; the later rename replaces the earlier file with an
identical one (an engine that opened the first keeps reading it), and one copy remains. Then
``$MODEL_DIR/<path>`` becomes a link to the stored file."""


def _cached(spec: FleetModelSpec) -> bool:
    return spec.model_volume.cache_claim is not None


def quantity(size: int) -> str:
    """A byte count as a quantity, rounded up to a whole MiB, in the API server's canonical form
    (the largest binary unit that keeps it whole: ``20Gi``, not ``20480Mi``): ``sizeLimit`` is
    compared as text, so another spelling would look like drift at every resync."""
    value, units = -(-size // MI), ("Mi", "Gi", "Ti", "Pi", "Ei")
    unit = 0
    while value % 1024 == 0 and unit < len(units) - 1:
        value, unit = value // 1024, unit + 1
    return f"{value}{units[unit]}"


def parse_quantity(size: str) -> int:
    """A :data:`fleet_serving.spec.VolumeSize` (``NNMi``, ``NNGi``, ``NNTi``), or a
    :func:`quantity`, in bytes."""
    units = {"Mi": MI, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    return int(size[:-2]) * units[size[-2:]]


def model_bytes(spec: FleetModelSpec, registry: RegistryWeights | None) -> int | None:
    """What the ``models`` emptyDir must hold: links only with a cache, else the spec's
    ``sizeLimit``, else a registry model's served files plus headroom; None when not known
    before the fetch (a ``huggingFace`` or ``uri`` source that gives no size)."""
    if _cached(spec):
        return LINKS_BYTES
    if spec.model_volume.size_limit is not None:
        return parse_quantity(spec.model_volume.size_limit)
    if registry is None:
        return None
    sizes = {f.path: f.size for f in registry.weights.files}
    total = sum(sizes[p] for p in sources.served_files(registry.weights, registry.weight_file))
    return total + total // 50 + HEADROOM_BYTES


def volumes(spec: FleetModelSpec, registry: RegistryWeights | None) -> list[Obj]:
    """The ``models`` emptyDir, bounded where its size is known, and the cache claim if any."""
    size = model_bytes(spec, registry)
    found: list[Obj] = [
        {"name": "models", "emptyDir": {"sizeLimit": quantity(size)} if size else {}}
    ]
    if spec.model_volume.cache_claim is not None:
        claim = {"claimName": spec.model_volume.cache_claim}
        found.append({"name": "model-cache", "persistentVolumeClaim": claim})
    return found


def engine_mounts(spec: FleetModelSpec, model_dir: str) -> list[Obj]:
    """The engine's view of the weights: read-only where the fetch container filled them."""
    if not _cached(spec):
        return [{"name": "models", "mountPath": model_dir}]
    return [
        {"name": "models", "mountPath": model_dir, "readOnly": True},
        {"name": "model-cache", "mountPath": CACHE_DIR, "readOnly": True},
    ]


def fetch_mounts(spec: FleetModelSpec, model_dir: str) -> list[Obj]:
    mounts: list[Obj] = [{"name": "models", "mountPath": model_dir}]
    if _cached(spec):
        mounts.append({"name": "model-cache", "mountPath": CACHE_DIR})
    return mounts


def fetch_script(spec: FleetModelSpec) -> str:
    return CACHE_SCRIPT if _cached(spec) else sources.FETCH_SCRIPT


def fetch_env(spec: FleetModelSpec) -> list[Obj]:
    """The cache script's ``CACHE_DIR``, and ``POD_NAME`` from the downward API."""
    if not _cached(spec):
        return []
    name = {"fieldRef": {"fieldPath": "metadata.name"}}
    return [{"name": "CACHE_DIR", "value": CACHE_DIR}, {"name": "POD_NAME", "valueFrom": name}]


def with_storage(resources: Obj, size: int | None) -> Obj:
    """``resources`` requesting ``size`` bytes of ephemeral storage, unless its requests or
    limits name ephemeral storage already (the user's figure stands)."""
    requests: dict[str, str] = dict(resources.get("requests", {}))
    limits = resources.get("limits", {})
    if not size or "ephemeral-storage" in requests or "ephemeral-storage" in limits:
        return resources
    requests["ephemeral-storage"] = quantity(size)
    return resources | {"requests": requests}


def fetch_storage(spec: FleetModelSpec, registry: RegistryWeights | None, resources: Obj) -> Obj:
    """The fetch container's resources: it writes the ``models`` emptyDir."""
    return with_storage(resources, model_bytes(spec, registry))


def engine_storage(spec: FleetModelSpec, resources: Obj) -> Obj:
    """The engine's resources: it writes ``HOME``, and a hub model into ``models``."""
    hub = spec.model_volume.size_limit if spec.source.hugging_face is not None else None
    return with_storage(resources, SCRATCH_REQUEST + (parse_quantity(hub) if hub else 0))


def scratch_volume() -> Obj:
    return {"name": "tmp", "emptyDir": {"sizeLimit": SCRATCH_LIMIT}}


def pod_security(spec: FleetModelSpec) -> Obj:
    """With a cache claim, the kubelet changes the volume's group only when its root is not
    already the pod's: a recursive change of a model cache would delay every pod's start."""
    return {"fsGroupChangePolicy": "OnRootMismatch"} if _cached(spec) else {}
