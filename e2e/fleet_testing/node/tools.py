"""The machine's programs a node needs, found once: Debian's containerd, runc, CNI plugins and
iptables from the system, else unpacked from Debian's packages (``apt-get download`` +
``dpkg -x``) into the per-user cache; a tool that is still missing is one line naming the
package to install."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MissingTool", "Tools", "find"]

# program -> (Debian package, where the package puts it)
_PROGRAMS = {
    "containerd": ("containerd", "usr/bin/containerd"),
    "containerd-shim-runc-v2": ("containerd", "usr/bin/containerd-shim-runc-v2"),
    "ctr": ("containerd", "usr/bin/ctr"),
    "runc": ("runc", "usr/sbin/runc"),
    "iptables": ("iptables", "usr/sbin/iptables"),
    "iptables-save": ("iptables", "usr/sbin/iptables-save"),
    "ip": ("iproute2", "bin/ip"),
    "nsenter": ("util-linux", "usr/bin/nsenter"),
    "gcc": ("gcc", "usr/bin/gcc"),
}
_CNI = ("containernetworking-plugins", "usr/lib/cni")
_CNI_PLUGINS = ("bridge", "host-local", "loopback")


class MissingTool(Exception):
    """A program the node needs is neither installed nor unpackable; the message says which
    Debian package to install."""


@dataclass(frozen=True)
class Tools:
    programs: dict[str, Path]
    cni_bin: Path
    path: str
    """A PATH that finds every program (kubelet and the CNI plugins look up iptables there)."""

    def __getitem__(self, name: str) -> str:
        return str(self.programs[name])


def _cache() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fleet" / "node-debs"


def _unpacked(package: str) -> Path | None:
    """``package`` unpacked into the cache (done once), or None when apt cannot fetch it."""
    target = _cache() / package
    if target.is_dir():
        return target
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return None
    _cache().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=_cache()) as tmp:
        got = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True)
        debs = list(Path(tmp).glob("*.deb"))
        if got.returncode != 0 or not debs:
            return None
        unpacked = Path(tmp) / "root"
        subprocess.run(["dpkg", "-x", str(debs[0]), str(unpacked)], check=True)
        unpacked.rename(target)
    return target


def _program(name: str) -> Path:
    package, inside = _PROGRAMS[name]
    found = shutil.which(name, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if found:
        return Path(found)
    unpacked = _unpacked(package)
    if unpacked is not None and (unpacked / inside).is_file():
        return unpacked / inside
    raise MissingTool(f"a test node needs {name}: install the Debian package {package}")


def _cni_bin() -> Path:
    package, inside = _CNI
    for candidate in (Path("/usr/lib/cni"), Path("/opt/cni/bin")):
        if all((candidate / plugin).is_file() for plugin in _CNI_PLUGINS):
            return candidate
    unpacked = _unpacked(package)
    if unpacked is not None and (unpacked / inside / "bridge").is_file():
        return unpacked / inside
    raise MissingTool(f"a test node needs the CNI plugins: install the Debian package {package}")


def find() -> Tools:
    """Every program, or :class:`MissingTool` for the first one missing."""
    programs = {name: _program(name) for name in _PROGRAMS}
    cni = _cni_bin()
    dirs = dict.fromkeys(str(p.parent) for p in programs.values())
    path = ":".join([*dirs, str(cni), "/usr/sbin:/usr/bin:/sbin:/bin"])
    return Tools(programs, cni, path)
