"""Package-boundary probes for the P7 tests: what a distribution pulls in, and what it imports.

Two independent views, because each can miss what the other sees: the installed metadata says
what ``pip install fleet-core`` would bring along (a transitive dependency nobody imports yet), and
a fresh interpreter says what importing every module actually loads (an import of something that
happens to be installed for another package).
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["dependency_closure", "modules_loaded_by_importing"]


def _requirements(dist_name: str) -> list[Requirement]:
    requires = metadata.distribution(dist_name).requires or []
    reqs = [Requirement(line) for line in requires]
    # An extra is opt-in; the base install's closure is what every deployment carries.
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def dependency_closure(dist_name: str) -> dict[str, list[str]]:
    """Every distribution reachable from ``dist_name``, each with one path that reaches it."""
    root = canonicalize_name(dist_name)
    paths: dict[str, list[str]] = {root: [root]}
    queue = [root]
    while queue:
        current = queue.pop()
        for req in _requirements(current):
            name = canonicalize_name(req.name)
            if name in paths:
                continue
            paths[name] = [*paths[current], name]
            try:
                metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue  # required but absent: still reachable, nothing further to walk
            queue.append(name)
    return paths


_PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
names = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


def modules_loaded_by_importing(package: str) -> tuple[list[str], set[str]]:
    """Import every module of ``package`` in a fresh interpreter; return them and sys.modules."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, package], capture_output=True, text=True, check=True
    )
    result = json.loads(proc.stdout)
    return result["imported"], set(result["loaded"])
