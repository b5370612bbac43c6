"""Build a real Kubernetes control plane for the tests, once, from the Kubernetes Go modules.

No prebuilt kube-apiserver is reachable from this project's machines, so (as controller-runtime's
envtest does with downloaded binaries) the tests run etcd + kube-apiserver + kube-controller-manager
built here: a wrapper module, generated into a temporary directory, requires ``k8s.io/kubernetes``
at ``KUBE_VERSION`` with every staging module (``k8s.io/api``, ``k8s.io/apiserver`` …) replaced by
its published ``v0.<minor>.<patch>``, the replace lines read from upstream's own go.mod. etcd is
built from ``go.etcd.io/etcd/server/v3`` at the version upstream requires. The binaries go to a
per-user cache keyed by version (``$XDG_CACHE_HOME/fleet/k8s-<version>/``, default ``~/.cache``);
when they are all there the script exits at once, so ``make test`` calls it every time.

The same build makes a node's parts (:mod:`fleet_testing.node`): kubelet, kube-proxy,
kube-scheduler and kubectl from the same module, the ``pause`` program (``gcc -static`` of the
module's own ``build/pause/linux/pause.c``) wrapped as an image archive, and CoreDNS built from
its Go module at ``COREDNS_VERSION``. Only what is missing is built.

    python -m fleet_testing.kube_build        # build if missing, print the directory
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet_testing import image_archive

__all__ = [
    "BINARIES",
    "CONTROL_PLANE",
    "COREDNS_VERSION",
    "KUBE_VERSION",
    "NODE",
    "PAUSE_IMAGE",
    "bin_dir",
    "build",
    "missing",
]

KUBE_VERSION = "v1.37.2"
"""The newest Kubernetes release the Go module proxy served that builds with Go 1.26."""

COREDNS_VERSION = "v1.15.0"
"""The newest CoreDNS the Go module proxy served; its go.mod asks for Go 1.26."""

PAUSE_IMAGE = "registry.k8s.io/pause:fleet-test"
"""The sandbox image the node's containerd is told to use; imported from ``pause.tar``."""

KUBE_COMMANDS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kubelet",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
)
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
NODE = ("kubelet", "kube-proxy", "kube-scheduler", "kubectl", "pause", "pause.tar", "coredns")
BINARIES = (*CONTROL_PLANE, *NODE)
_STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", re.MULTILINE)
_ETCD = re.compile(r"^\s*go\.etcd\.io/etcd/server/v3\s+(v\S+)", re.MULTILINE)


def bin_dir(version: str = KUBE_VERSION) -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fleet" / f"k8s-{version}"


def missing(version: str = KUBE_VERSION, names: tuple[str, ...] = BINARIES) -> list[str]:
    return [name for name in names if not (bin_dir(version) / name).is_file()]


def _go(*args: str, cwd: Path) -> str:
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"}
    done = subprocess.run(
        ["go", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout


def _upstream_gomod(version: str, workdir: Path) -> str:
    info = json.loads(_go("mod", "download", "-json", f"k8s.io/kubernetes@{version}", cwd=workdir))
    return Path(info["GoMod"]).read_text()


def _wrapper_gomod(version: str, upstream: str) -> str:
    """A go.mod requiring k8s.io/kubernetes with its staging modules at their published v0.x."""
    staging_version = "v0." + version.removeprefix("v1.")
    replaces = "\n".join(
        f"\t{name} => {name} {staging_version}" for name in sorted(set(_STAGING.findall(upstream)))
    )
    return (
        "module fleet.test/kubebuild\n\ngo 1.26\n\n"
        f"require k8s.io/kubernetes {version}\n\nreplace (\n{replaces}\n)\n"
    )


def _version_ldflags(version: str) -> str:
    """The version the binaries report (a kubelet's ``nodeInfo.kubeletVersion``), which
    upstream's own build stamps in the same way."""
    major, minor = version.removeprefix("v").split(".")[:2]
    stamp = {"gitVersion": version, "gitMajor": major, "gitMinor": minor,
             "gitTreeState": "clean"}  # fmt: skip
    return " ".join(
        f"-X {package}.{name}={value}"
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for name, value in stamp.items()
    )


def _build_kube(version: str, workdir: Path, out: Path, commands: list[str]) -> str:
    upstream = _upstream_gomod(version, workdir)
    (workdir / "go.mod").write_text(_wrapper_gomod(version, upstream))
    if commands:  # one go build for all of them: the shared packages compile once
        packages = [f"k8s.io/kubernetes/cmd/{command}" for command in commands]
        _go("build", "-trimpath", "-ldflags", _version_ldflags(version), "-o", f"{out}/",
            *packages, cwd=workdir)  # fmt: skip
    found = _ETCD.search(upstream)
    if found is None:
        raise SystemExit(f"k8s.io/kubernetes {version} names no go.etcd.io/etcd/server/v3 version")
    return found.group(1)


def _build_etcd(etcd_version: str, workdir: Path, out: Path) -> None:
    requirement = f"require go.etcd.io/etcd/server/v3 {etcd_version}\n"
    (workdir / "go.mod").write_text(f"module fleet.test/etcdbuild\n\ngo 1.26\n\n{requirement}")
    _go("build", "-trimpath", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3", cwd=workdir)


def _build_pause(version: str, workdir: Path, out: Path) -> None:
    """The sandbox's pause program from the module's own C source, static, as an image."""
    if shutil.which("gcc") is None:
        raise SystemExit("kube_build: no gcc to build pause: install the Debian package gcc")
    info = json.loads(_go("mod", "download", "-json", f"k8s.io/kubernetes@{version}", cwd=workdir))
    source = Path(info["Dir"]) / "build" / "pause" / "linux" / "pause.c"
    subprocess.run(
        ["gcc", "-Os", "-static", f"-DVERSION={version}-fleet", "-o", str(out / "pause"),
         str(source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    image_archive.write(
        out / "pause.tar",
        PAUSE_IMAGE,
        {"pause": (out / "pause").read_bytes()},
        entrypoint=["/pause"],
    )


def _build_coredns(workdir: Path, out: Path) -> None:
    requirement = f"require github.com/coredns/coredns {COREDNS_VERSION}\n"
    (workdir / "go.mod").write_text(f"module fleet.test/dnsbuild\n\ngo 1.26\n\n{requirement}")
    _go("build", "-trimpath", "-o", str(out / "coredns"), "github.com/coredns/coredns", cwd=workdir)


def build(version: str = KUBE_VERSION) -> Path:
    """Build whatever binary is missing into ``bin_dir(version)``; return that directory."""
    target = bin_dir(version)
    absent = missing(version)
    if not absent:
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fleet-kube-") as tmp:
        staging = Path(tmp) / "out"
        for part in ("kube", "etcd", "dns"):
            (Path(tmp) / part).mkdir()
        staging.mkdir()
        commands = [name for name in KUBE_COMMANDS if name in absent]
        etcd_version = _build_kube(version, Path(tmp) / "kube", staging, commands)
        if "etcd" in absent:
            _build_etcd(etcd_version, Path(tmp) / "etcd", staging)
        if "pause" in absent or "pause.tar" in absent:
            _build_pause(version, Path(tmp) / "kube", staging)
        if "coredns" in absent:
            _build_coredns(Path(tmp) / "dns", staging)
        for name in absent:
            shutil.move(staging / name, target / name)
    return target


def main() -> None:
    if not missing():
        print(bin_dir())
        return
    print(
        f"building Kubernetes {KUBE_VERSION} control-plane binaries (cold: see docs/operator.md)",
        file=sys.stderr,
    )
    started = time.monotonic()
    try:
        target = build()
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"kube_build: {' '.join(exc.cmd)} failed:\n{exc.stderr}") from exc
    print(f"built in {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(target)


if __name__ == "__main__":
    main()
