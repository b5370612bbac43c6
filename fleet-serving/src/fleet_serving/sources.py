"""A ``registry:`` source, resolved: which files to fetch from the control plane, and how.

The control plane serves a Ready registry model's files at ``/api/v1/models/{id}/files/{name}``
and lists them, with sizes and sha256, in the contract's :class:`fleet_contract.ModelWeights`.
This module turns that list into the init container that downloads and checks every file before
the engine starts, and into the path the engine loads. Pure functions only; the HTTP call that
gets the list lives in :mod:`fleet_serving.control_plane`.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import msgspec

from fleet_contract import ModelWeights
from fleet_serving import images
from fleet_serving.errors import InvalidSpec
from fleet_serving.spec import FleetModelSpec

__all__ = [
    "FETCH_IMAGE",
    "FETCH_PRELUDE",
    "FETCH_SCRIPT",
    "MAX_MODEL_BYTES",
    "TOKEN_ENV",
    "RegistryWeights",
    "check",
    "fetch_args",
    "gguf_file",
    "served_files",
    "token_env",
]

TOKEN_ENV = "FLEET_ENGINE_TOKEN"
_SPLIT = re.compile(r"-[0-9]{5}-of-[0-9]{5}\.gguf$")

FETCH_IMAGE = images.DEFAULT.registry
"""curl with a busybox shell and sha256sum: all the fetch script needs (the default; see
:mod:`fleet_serving.images`)."""

FETCH_PRELUDE = """\
set -eu
cd "$MODEL_DIR"
auth=$(mktemp)  # the credential as a header file: never in curl's argv, never on the volume
trap 'rm -f "$auth"' EXIT
echo "Authorization: Bearer ${FLEET_ENGINE_TOKEN:?the engine credential Secret is not mounted}" \
  > "$auth"
verified() { echo "$2  $1" | sha256sum -c - >/dev/null 2>&1; }
download() {  # part url sha name: leaves a verified $part, or exits
  if [ -f "$1" ] && verified "$1" "$3"; then
    return 0
  fi
  echo "fetching $4"
  curl -fsSL --retry 10 --retry-delay 2 --retry-connrefused -H @"$auth" -C - \
    -o "$1" "$2" || {
    code=$?  # 22: an HTTP error such as 416 for a partial that cannot be resumed; start over
    if [ "$code" -eq 22 ]; then rm -f "$1"; fi
    exit "$code"
  }
  if ! verified "$1" "$3"; then
    rm -f "$1"
    echo "sha256 mismatch for $4: expected $3" >&2
    exit 1
  fi
}
"""
"""What every fetch script starts with: the credential's header file, and ``download``, which
leaves a verified file at a temporary path or ends the container."""

FETCH_SCRIPT = (
    FETCH_PRELUDE
    + """\
while [ "$#" -ge 3 ]; do
  name=$1; url=$2; sha=$3; shift 3
  if [ -f "$name" ] && verified "$name" "$sha"; then
    continue
  fi
  mkdir -p "$(dirname "$name")"
  download "$name.partial" "$url" "$sha" "$name"
  mv "$name.partial" "$name"
done
"""
)
"""Arguments: triples of (path, url, sha256); FLEET_ENGINE_TOKEN (from the engine credential's
Secret) is sent as a bearer header to the control plane, and not to a presigned store URL the
control plane redirects to (curl drops custom Authorization headers on a redirect to another
host). A file already present with the right hash (the
init container restarted on the same volume) is kept; an interrupted download resumes where it
stopped (``curl -C -`` sends ``Range: bytes=N-``); every file is checked before it is moved into
place, so the engine never sees a partial or unverified file, and a file that fails the check is
deleted so the next attempt starts clean. curl retries what may pass (a refused connection, a
timeout, 408/429/5xx); any other failure ends the container, and the kubelet restarts it with
backoff. With a model cache, :data:`fleet_serving.caching.CACHE_SCRIPT` runs instead."""

MAX_MODEL_BYTES = 2**50
"""A registry model's files may total at most 1 PiB: the sum becomes a volume size."""


class RegistryWeights(msgspec.Struct, kw_only=True, frozen=True):
    """A Ready registry model and the control plane that serves its files."""

    control_plane: str
    """The control plane's base URL, as reachable from pods (the operator's ``--report-to``)."""
    weights: ModelWeights
    token_secret: str = "fleet-engine-token"
    """The Secret (key ``token``, in the model's namespace) holding the engine credential."""
    weight_file: str | None = None
    """The spec's ``weightFile``: the GGUF file to serve when the model holds several."""

    def file_url(self, path: str) -> str:
        model = quote(self.weights.model_id, safe="")
        return f"{self.control_plane.rstrip('/')}/api/v1/models/{model}/files/{quote(path)}"


def check(spec: FleetModelSpec, weights: ModelWeights) -> None:
    """InvalidSpec when a Ready model cannot be what the spec says it is."""
    if weights.format is not None and weights.format != spec.weight_format:
        raise InvalidSpec(
            f"registry model {weights.model_id!r} holds {weights.format} weights, but the spec "
            f"says weightFormat {spec.weight_format}"
        )
    if not weights.files:
        raise InvalidSpec(f"registry model {weights.model_id!r} lists no files")
    for file in weights.files:
        if file.path.startswith("/") or ".." in file.path.split("/"):
            raise InvalidSpec(
                f"registry model {weights.model_id!r} lists a file outside its folder: "
                f"{file.path!r}"
            )
    if sum(f.size for f in weights.files) > MAX_MODEL_BYTES:
        raise InvalidSpec(f"registry model {weights.model_id!r} lists more than 1 PiB of files")
    if spec.weight_format == "gguf":
        _check_gguf(weights, spec.weight_file)


def _model_of(path: str) -> str:
    """A GGUF file's model: its name without a split suffix (``-00001-of-00003.gguf``)."""
    return _SPLIT.sub("", path).removesuffix(".gguf")


def _check_gguf(weights: ModelWeights, chosen: str | None) -> None:
    names = sorted(f.path for f in weights.files if f.path.endswith(".gguf"))
    models = sorted({_model_of(n) for n in names})
    where = f"registry model {weights.model_id!r}"
    if not names:
        raise InvalidSpec(f"{where} has no .gguf file")
    if chosen is not None and chosen not in names:
        raise InvalidSpec(f"{where} has no file {chosen!r}; it has {', '.join(names)}")
    if chosen is None and len(models) > 1:
        raise InvalidSpec(
            f"{where} holds {len(models)} GGUF models ({', '.join(models)}): name the one to "
            "serve with spec.weightFile"
        )


def served_files(weights: ModelWeights, weight_file: str | None) -> list[str]:
    """The files to fetch, by path: everything, except that a GGUF model holding several
    quantizations gets only the chosen one (with its split parts) and no other ``.gguf``."""
    paths = sorted(f.path for f in weights.files)
    if weight_file is None:
        return paths
    model = _model_of(weight_file)
    return [p for p in paths if not p.endswith(".gguf") or _model_of(p) == model]


def gguf_file(weights: ModelWeights, weight_file: str | None = None) -> str | None:
    """The file llama.cpp is pointed at: the chosen one, else the first ``.gguf`` by name (a
    split model's part 1)."""
    names = sorted(f.path for f in weights.files if f.path.endswith(".gguf"))
    if weight_file is not None:
        return weight_file if weight_file in names else None
    return names[0] if names else None


def token_env(source: RegistryWeights) -> dict[str, object]:
    """The init container's FLEET_ENGINE_TOKEN, from the engine credential's Secret."""
    ref = {"name": source.token_secret, "key": "token"}
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}


def fetch_args(source: RegistryWeights) -> list[str]:
    """The fetch script's arguments, one (path, url, sha256) triple per served file, by path."""
    by_path = {f.path: f for f in source.weights.files}
    args: list[str] = []
    for path in served_files(source.weights, source.weight_file):
        args += [path, source.file_url(path), by_path[path].sha256]
    return args
