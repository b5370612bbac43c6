"""Build a bench's Go program once per user, keyed by its source, atomically.

``binary(source)`` returns ``$XDG_CACHE_HOME/fleet/<name>-<hash of the source>/<name>`` (``name`` is
the source folder's), built with ``go build`` when missing, or a sentence saying why there is no
binary (``go`` not on PATH, the build failed). Used for the load generator (``loadgen``) and the
stub engine (``stubgo``); both are standard library only, and Linux only (each runs one epoll
loop): elsewhere the build fails and the benches run the Python generator and stub, saying why.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["binary", "cache_path"]


def _source_hash(source: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(source.glob("*")):
        if path.suffix in (".go", ".mod", ".sum"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_path(source: Path) -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fleet" / f"{source.name}-{_source_hash(source)}" / source.name


def binary(source: Path) -> Path | str:
    """The program built from ``source``, built if missing; or why there is none."""
    target = cache_path(source)
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        return "go not found"
    return _build(go, source, target)


def _build(go: str, source: Path, target: Path) -> Path | str:
    """``go build`` into a temporary name beside ``target``, then an atomic rename: two benches
    building at once each finish with a whole binary."""
    target.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / source.name
        done = subprocess.run(
            [go, "build", "-trimpath", "-o", str(built), "."],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return f"go build failed: {done.stderr.strip().splitlines()[-1:]}"
        os.replace(built, target)
    return target
