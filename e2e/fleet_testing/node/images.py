"""The node tests' image: ``e2e/node/testapp`` (one static Go program, standard library only)
built once per source into the per-user cache and wrapped as ``localhost/fleet-testapp:<hash>``
(:mod:`fleet_testing.image_archive`); no registry, no image builder."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from fleet_testing import image_archive

__all__ = ["SOURCE", "testapp_image"]

SOURCE = Path(__file__).resolve().parents[2] / "node" / "testapp"


def _hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(SOURCE.glob("*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def testapp_image() -> tuple[str, Path]:
    """The image's tag and its archive, built if missing."""
    tag = _hash()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    target = Path(cache) / "fleet" / f"node-testapp-{tag}"
    archive = target / "testapp.tar"
    image = f"localhost/fleet-testapp:{tag}"
    if archive.is_file():
        return image, archive
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the node tests' image needs Go to build e2e/node/testapp")
    target.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        binary = Path(tmp) / "testapp"
        subprocess.run([go, "build", "-trimpath", "-o", str(binary), "."], cwd=SOURCE, env=env,
                       check=True, capture_output=True)  # fmt: skip
        built = Path(tmp) / "testapp.tar"
        image_archive.write(built, image, {"testapp": binary.read_bytes()},
                            entrypoint=["/testapp"], directories=("tmp",))  # fmt: skip
        built.rename(archive)
    return image, archive
