"""Write a container image as a docker-archive tar, with no registry and no image builder.

A node's containerd imports the archive (``ctr -n k8s.io images import``): ``manifest.json``
naming the tag, an image config (entrypoint, user, environment) and one layer holding the given
files. Enough for images of one static program (the ``pause`` sandbox, the test program); an
image with a distribution in it is built by ``deploy/image`` or ``e2e/engine`` scripts instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["write"]


def _layer(files: Mapping[str, bytes], directories: tuple[str, ...]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in directories:
            info = tarfile.TarInfo(name.strip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name.strip("/") == "tmp" else 0o755
            tar.addfile(info)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name.strip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write(
    path: Path,
    tag: str,
    files: Mapping[str, bytes],
    *,
    entrypoint: list[str],
    user: str = "",
    env: tuple[str, ...] = (),
    directories: tuple[str, ...] = (),
) -> Path:
    """One image ``tag`` whose single layer holds ``files`` (all executable) and
    ``directories``; returns ``path``."""
    layer = _layer(files, directories)
    diff_id = hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "User": user, "Env": list(env), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": "fleet_testing.image_archive"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]
    with tarfile.open(path, mode="w") as tar:
        for name, data in (
            (config_name, config_bytes),
            (f"{diff_id}/layer.tar", layer),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
