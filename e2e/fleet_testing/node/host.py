"""What a node leaves on the host, and taking it back: the kernel sysctls the kubelet sets, the
node's cgroup root in every cgroup v1 hierarchy, the mounts under its directory, and the
processes that outlive containerd (shims, containers). Also a snapshot of all of it, which the
node's own test compares before and after a start/teardown cycle."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

__all__ = [
    "KUBELET_SYSCTLS",
    "kill_processes_under",
    "make_cgroup_root",
    "read_sysctls",
    "remove_cgroup_root",
    "restore_sysctls",
    "snapshot",
    "unmount_under",
]

KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
"""Machine-wide sysctls the kubelet sets at start (its ``protectKernelDefaults`` is off)."""
CGROUPS = Path("/sys/fs/cgroup")


def read_sysctls() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in KUBELET_SYSCTLS}


def restore_sysctls(saved: dict[str, str]) -> None:
    for name, value in saved.items():
        path = Path("/proc/sys") / name
        if path.read_text().strip() != value:
            path.write_text(value)


def _hierarchies() -> list[Path]:
    return sorted(p for p in CGROUPS.iterdir() if p.is_dir() and not p.is_symlink())


def make_cgroup_root(name: str) -> None:
    """``/<name>`` in every hierarchy (the kubelet's ``cgroupRoot`` must exist), cpuset's with
    its parent's CPUs and memory nodes (a new v1 cpuset has none)."""
    for hierarchy in _hierarchies():
        root = hierarchy / name.strip("/")
        root.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (root / knob).write_text((hierarchy / knob).read_text())


def _cgroup_dirs(name: str) -> list[Path]:
    found: list[Path] = []
    for hierarchy in _hierarchies():
        root = hierarchy / name.strip("/")
        if root.is_dir():
            found.extend(
                sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: -len(p.parts))
            )
    return found


def kill_processes_under(name: str, workdir: Path) -> list[int]:
    """SIGKILL every process in the node's cgroups or running from its directory (shims name
    their containerd's socket); the PIDs killed."""
    pids: set[int] = set()
    for directory in _cgroup_dirs(name):
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
    marker = str(workdir).encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (proc / "cmdline").read_bytes():
                    pids.add(int(proc.name))
    pids.discard(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.05)
    return sorted(pids)


def remove_cgroup_root(name: str) -> None:
    """rmdir the node's cgroups, deepest first (each must be empty of processes by now)."""
    for directory in _cgroup_dirs(name):
        for _ in range(50):  # a cgroup whose last process just died can be busy for a moment
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def _mountpoints() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        points.append(point)
    return points


def unmount_under(workdir: Path) -> None:
    """Unmount everything mounted at or below ``workdir`` (the kubelet's self bind mount of its
    root directory, volumes, rootfs overlays, shm), last mounted first."""
    prefix = str(workdir)
    for point in reversed(_mountpoints()):
        if point == prefix or point.startswith(prefix + "/"):
            done = subprocess.run(["umount", point], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)


def snapshot(programs: tuple[str, ...]) -> dict[str, object]:
    """What a node could leave behind, for a before/after comparison: processes running one of
    ``programs``, mounts in the places a node mounts, network links, the host's iptables rules,
    the top of each cgroup hierarchy and the kubelet's sysctls."""
    running = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                comm = (proc / "comm").read_text().strip()
                if comm in programs or b"fleet_testing.node" in (proc / "cmdline").read_bytes():
                    running.append(f"{proc.name} {comm}")
    places = ("/run/netns", "/run/containerd", "/var/lib/kubelet", "/tmp/fleet-node-")
    mounts = sorted(p for p in _mountpoints() if p.startswith(places))
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    iptables = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    rules = [line for line in iptables.splitlines() if not line.startswith(("#", ":"))]
    cgroups = {h.name: sorted(p.name for p in h.iterdir() if p.is_dir()) for h in _hierarchies()}
    return {
        "processes": sorted(running),
        "mounts": mounts,
        "links": sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()),
        "iptables": rules,
        "cgroups": cgroups,
        "sysctls": read_sysctls(),
        "netns": sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else [],
    }
