"""A ``registry:`` source, resolved: which files to fetch from the control plane, and how.

The control plane serves a Ready registry model's files at ``/api/v1/models/{id}/files/{name}``
and lists them, with sizes and sha256, in the contract's :class:`fleet_contract.ModelWeights`.
This module turns that list into the init container that downloads and checks every file before
the engine starts, and into the path the engine loads. Pure functions only; the HTTP call that
gets the list lives in :mod:`fleet_serving.control_plane`.
"""

from __future__ import annotations

from urllib.parse import quote

import msgspec

from fleet_contract import ModelWeights
from fleet_serving.errors import InvalidSpec
from fleet_serving.spec import FleetModelSpec

__all__ = [
    "FETCH_IMAGE",
    "FETCH_SCRIPT",
    "TOKEN_ENV",
    "RegistryWeights",
    "check",
    "fetch_args",
    "gguf_file",
    "token_env",
]

TOKEN_ENV = "FLEET_ENGINE_TOKEN"

FETCH_IMAGE = "curlimages/curl:8.11.1"
"""curl with a busybox shell and sha256sum: all the fetch script needs."""

FETCH_SCRIPT = """\
set -eu
cd "$MODEL_DIR"
auth=$(mktemp)  # the credential as a header file: never in curl's argv, never on the volume
trap 'rm -f "$auth"' EXIT
echo "Authorization: Bearer ${FLEET_ENGINE_TOKEN:?the engine credential Secret is not mounted}" \
  > "$auth"
verified() { echo "$2  $1" | sha256sum -c - >/dev/null 2>&1; }
while [ "$#" -ge 3 ]; do
  name=$1; url=$2; sha=$3; shift 3
  if [ -f "$name" ] && verified "$name" "$sha"; then
    continue
  fi
  mkdir -p "$(dirname "$name")"
  if ! { [ -f "$name.partial" ] && verified "$name.partial" "$sha"; }; then
    echo "fetching $name"
    curl -fsSL --retry 10 --retry-delay 2 --retry-connrefused -H @"$auth" -C - \
      -o "$name.partial" "$url" || {
      code=$?  # 22: an HTTP error such as 416 for a partial that cannot be resumed; start over
      if [ "$code" -eq 22 ]; then rm -f "$name.partial"; fi
      exit "$code"
    }
    if ! verified "$name.partial" "$sha"; then
      rm -f "$name.partial"
      echo "sha256 mismatch for $name: expected $sha" >&2
      exit 1
    fi
  fi
  mv "$name.partial" "$name"
done
"""
"""Arguments: triples of (path, url, sha256); FLEET_ENGINE_TOKEN (from the engine credential's
Secret) is sent as a bearer header to the control plane, and not to a presigned store URL the
control plane redirects to (curl drops custom Authorization headers on a redirect to another
host). A file already present with the right hash (the
init container restarted on the same volume) is kept; an interrupted download resumes where it
stopped (``curl -C -`` sends ``Range: bytes=N-``); every file is checked before it is moved into
place, so the engine never sees a partial or unverified file, and a file that fails the check is
deleted so the next attempt starts clean. curl retries what may pass (a refused connection, a
timeout, 408/429/5xx); any other failure ends the container, and the kubelet restarts it with
backoff."""


class RegistryWeights(msgspec.Struct, kw_only=True, frozen=True):
    """A Ready registry model and the control plane that serves its files."""

    control_plane: str
    """The control plane's base URL, as reachable from pods (the operator's ``--report-to``)."""
    weights: ModelWeights
    token_secret: str = "fleet-engine-token"
    """The Secret (key ``token``, in the model's namespace) holding the engine credential."""

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
    if spec.weight_format == "gguf" and gguf_file(weights) is None:
        raise InvalidSpec(f"registry model {weights.model_id!r} has no .gguf file")


def gguf_file(weights: ModelWeights) -> str | None:
    """The file llama.cpp is pointed at: the first ``.gguf`` by name (a split model's part 1)."""
    names = sorted(f.path for f in weights.files if f.path.endswith(".gguf"))
    return names[0] if names else None


def token_env(source: RegistryWeights) -> dict[str, object]:
    """The init container's FLEET_ENGINE_TOKEN, from the engine credential's Secret."""
    ref = {"name": source.token_secret, "key": "token"}
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}


def fetch_args(source: RegistryWeights) -> list[str]:
    """The fetch script's arguments, one (path, url, sha256) triple per file, by path."""
    args: list[str] = []
    for file in sorted(source.weights.files, key=lambda f: f.path):
        args += [file.path, source.file_url(file.path), file.sha256]
    return args
