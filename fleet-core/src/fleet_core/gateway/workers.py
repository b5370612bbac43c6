"""``fleet-gateway --workers N``: N gateway processes on one port, so one pod uses every core.

A supervisor (the process started as ``fleet-gateway``) validates the configuration, then starts N
workers — each ``python -m fleet_core.gateway ... --worker I`` — and does nothing else: no event
loop, no app. Each worker binds the port itself with SO_REUSEPORT and the kernel spreads new
connections over them. What the workers share, and how:

- Rate limits and budget holds: Redis (``FLEET_REDIS_URL``). The memory store is per process, so
  limits or database mode with N > 1 and no Redis refuse to start.
- Metrics: each worker keeps its own in memory and writes them in batches (within
  ``FLEET_METRICS_FLUSH_S`` of a change, and as it stops) to prometheus_client's multiprocess
  files in a directory the supervisor creates and hands every worker as
  ``FLEET_WORKER_METRICS_DIR``; any worker's ``/metrics`` sums them all (``metering/flushing.py``).
  ``PROMETHEUS_MULTIPROC_DIR`` is kept out of the workers' environment: it would make
  prometheus_client write a file on every update.
- The ledger: one writer per worker (they insert distinct request ids), each with its own spool
  file (worker 0 keeps ``FLEET_LEDGER_SPOOL``, worker I appends ``-I`` to its stem); spools left
  by workers of an earlier run with more workers are handed to the workers of this one.

SIGTERM or SIGINT to the supervisor goes to every worker, each drains as a single gateway does,
and the supervisor exits once all have (status 0 when all exited 0). A worker that exits on its
own stops the others: the supervisor exits with that worker's status and the pod restarts.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from prometheus_client import multiprocess

from fleet_core.shared.errors import ConfigError

__all__ = [
    "METRICS_DIR_ENV",
    "adopt_orphan_spools",
    "cores_available",
    "parse_workers",
    "spool_for",
    "supervise",
]

METRICS_DIR_ENV = "FLEET_WORKER_METRICS_DIR"
"""Where the supervisor tells its workers to write their metrics files."""

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def cores_available(affinity: int, quota: tuple[int, int] | None) -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota
    ``(quota_us, period_us)`` rounded up (a 1.5-CPU limit gets 2 workers), at least 1."""
    cores = max(1, affinity)
    if quota is not None and quota[0] > 0 and quota[1] > 0:
        cores = min(cores, max(1, math.ceil(quota[0] / quota[1])))
    return cores


def cgroup_quota(v2: str | None, v1: tuple[str, str] | None) -> tuple[int, int] | None:
    """The CPU quota from cgroup v2's ``cpu.max`` ("max 100000" or "150000 100000") or v1's
    ``cfs_quota_us`` / ``cfs_period_us`` (-1: none); None when unlimited or unreadable."""
    try:
        if v2 is not None:
            quota, _, period = v2.strip().partition(" ")
            return None if quota == "max" else (int(quota), int(period or "100000"))
        if v1 is not None and int(v1[0]) > 0:
            return int(v1[0]), int(v1[1])
    except ValueError:
        return None
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def cores_here() -> int:
    """``cores_available`` for this process: sched_getaffinity and the cgroup's quota."""
    v1_quota, v1_period = _read(CGROUP_V1_QUOTA), _read(CGROUP_V1_PERIOD)
    v1 = (v1_quota, v1_period) if v1_quota is not None and v1_period is not None else None
    quota = cgroup_quota(_read(CGROUP_V2_CPU_MAX), v1)
    return cores_available(len(os.sched_getaffinity(0)), quota)


def parse_workers(value: str) -> int:
    """``--workers``: a positive integer, or ``auto`` for the cores available (cgroup-aware)."""
    if value == "auto":
        return cores_here()
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        raise ConfigError(f"--workers {value!r} is not a number of processes (1-1024) or 'auto'")
    return int(value)


def spool_for(path: Path, index: int) -> Path:
    """Worker ``index``'s ledger spool: worker 0 keeps ``path`` (what a single process uses)."""
    return path if index == 0 else path.with_name(f"{path.stem}-{index}{path.suffix}")


def adopt_orphan_spools(path: Path, count: int) -> list[Path]:
    """Before any worker starts: the spools of workers that no longer exist (a previous run had
    more) are appended to those of worker ``index % count``, so their records are replayed. A
    record replayed twice is harmless (the ledger ignores a request id it has). The files moved."""
    pattern = re.compile(re.escape(path.stem) + r"-(\d+)" + re.escape(path.suffix) + r"(\..*)?$")
    moved = []
    for orphan in sorted(path.parent.glob(f"{path.stem}-*")):
        found = pattern.fullmatch(orphan.name)
        if found is None or int(found.group(1)) < count:
            continue
        owner = spool_for(path, int(found.group(1)) % count)
        _append(orphan, owner.with_name(owner.name + (found.group(2) or "")))
        moved.append(orphan)
    return moved


def _append(source: Path, target: Path) -> None:
    data = source.read_bytes()
    with target.open("ab") as out:
        if out.tell() > 0 and data:
            out.write(b"\n")  # ends a torn last line; an empty line is skipped on replay
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    source.unlink()


def supervise(worker_argv: Sequence[str], count: int, *, grace_s: float) -> int:
    """Run ``count`` workers (``python -m fleet_core.gateway *worker_argv --worker I``) until a
    signal or a worker's exit; the exit status for the supervisor."""
    with tempfile.TemporaryDirectory(prefix="fleet-metrics-") as metrics_dir:
        env = {**os.environ, METRICS_DIR_ENV: metrics_dir}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # in-memory values; flushing.py writes files
        base = [sys.executable, "-m", "fleet_core.gateway", *worker_argv]
        workers = [subprocess.Popen([*base, "--worker", str(i)], env=env) for i in range(count)]
        return _Supervisor(workers, metrics_dir).run(grace_s=grace_s)


class _Supervisor:
    def __init__(self, workers: list[subprocess.Popen[bytes]], metrics_dir: str) -> None:
        self.workers = workers
        self.metrics_dir = metrics_dir
        self.stopping = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, signum: int) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signum)

    def run(self, *, grace_s: float) -> int:
        status = 0
        while any(proc.poll() is None for proc in self.workers):
            for proc in self.workers:
                code = proc.poll()
                if code is not None and not self.stopping:
                    print(
                        f"fleet-gateway: worker pid {proc.pid} exited ({code}); stopping",
                        file=sys.stderr,
                    )
                    status, self.stopping = code or 1, True
                    self._signal_all(signal.SIGTERM)
            time.sleep(0.1)
            if self.stopping:
                self._kill_after(grace_s + 10)
        for proc in self.workers:
            multiprocess.mark_process_dead(proc.pid, self.metrics_dir)  # type: ignore[no-untyped-call]
        return status or max((abs(proc.returncode) for proc in self.workers), default=0)

    def _kill_after(self, timeout_s: float) -> None:
        """Wait for the workers to drain; any still running after ``timeout_s`` is killed."""
        deadline = time.monotonic() + timeout_s
        for proc in self.workers:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
