"""Model pull: a generated safetensors file from the synthetic hub into SeaweedFS through the
control plane, against a plain upload of the same bytes with the minio SDK, and the control
plane's peak RSS growth while it pulls.

Three processes besides this one: SeaweedFS (``weed mini``), the synthetic hub (``python -m
fleet_core.devtools.hub``) and the control plane (``python -m fleet_core.control_plane``, as
``fleet-apiserver`` runs it; S3 store), on a scratch database. The pull's time runs from ``POST
…/pull`` to the event reporting Ready, so it includes the download, sha256, the multipart upload
and verification. The plain upload uses the same part size and parallelism, reading the bytes
from memory-free generation in this process, with no download and no hashing: it is the ceiling
the pull is measured against. Targets: ≥ 80% of the plain upload; peak RSS growth < 64 MiB.
``FLEET_BENCH_PULL_BYTES`` sets the size (1 GiB).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, cast

import httpx
from minio import Minio

from bench.gateway_bench import ROUNDS, median
from bench.ledger_bench import scratch_database
from bench.report import verdict
from fleet_core.control_plane.registry.s3 import S3Settings
from fleet_core.devtools.hub.repos import generated_repo
from fleet_testing import processes
from fleet_testing.fix_s3 import S3Server, running_seaweedfs

__all__ = ["report", "run"]

SIZE = int(os.environ.get("FLEET_BENCH_PULL_BYTES", str(1 << 30)))
ADMIN_TOKEN = "bench-" + secrets.token_urlsafe(32)
"""The scratch control plane's admin token (FLEET_ADMIN_TOKEN)."""
SETTINGS = S3Settings(endpoint="", use_ssl=False)  # the registry's part size and parallelism
BIN = Path(sys.executable).parent


def _memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of ``pid``, in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found


def _reset_peak(pid: int) -> bool:
    """Resets VmHWM to the current RSS (Linux ≥ 4.0); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _pull(api: httpx.Client, model_id: str) -> float:
    body = {"id": model_id, "source": {"uri": "hf://fleet/generated"}}
    api.post("/api/v1/models", json=body).raise_for_status()
    started = time.perf_counter()
    api.post(f"/api/v1/models/{model_id}/pull").raise_for_status()
    final: dict[str, object] = {}
    with api.stream("GET", f"/api/v1/models/{model_id}/pull/events", timeout=None) as events:
        for line in events.iter_lines():
            if line.startswith("data: "):
                final = json.loads(line[6:])
    elapsed = time.perf_counter() - started
    if final.get("status") != "Ready":
        raise RuntimeError(f"the bench pull ended {final.get('status')}: {final.get('reason')}")
    return elapsed


class _Generated(io.RawIOBase):
    """The hub's generated file, read as a stream (what a plain upload of it sends)."""

    def __init__(self) -> None:
        weights = generated_repo("fleet/generated", SIZE).file("model.safetensors")
        assert weights is not None
        self._chunks = weights.chunks(block=1 << 20)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if not self._rest:
            self._rest = next(self._chunks, b"")
        size = len(self._rest) if size < 0 else size
        piece, self._rest = self._rest[:size], self._rest[size:]
        return piece


def _plain(s3: S3Server, bucket: str) -> float:
    client = Minio(s3.endpoint, s3.access_key, s3.secret_key, secure=False)
    started = time.perf_counter()
    client.put_object(
        bucket, "plain/model.safetensors", cast(BinaryIO, _Generated()), length=-1,
        part_size=SETTINGS.part_size, num_parallel_uploads=SETTINGS.parallel_parts,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    client.remove_object(bucket, "plain/model.safetensors")
    return elapsed


def _environment(s3: S3Server, bucket: str, database: str, hub: str) -> dict[str, str]:
    return {
        "FLEET_DATABASE_URL": database,
        "FLEET_S3_ENDPOINT": s3.endpoint,
        "FLEET_S3_BUCKET": bucket,
        "FLEET_S3_ACCESS_KEY": s3.access_key,
        "FLEET_S3_SECRET_KEY": s3.secret_key,
        "FLEET_S3_USE_SSL": "false",
        "FLEET_HUB_URL": hub,
        "FLEET_LOG_LEVEL": "warning",
        "FLEET_ADMIN_TOKEN": ADMIN_TOKEN,
    }


def run(size: int = SIZE) -> dict[str, float]:
    """Medians over interleaved rounds: seconds and MB/s for both paths, and RSS growth."""
    pulls: list[float] = []
    plains: list[float] = []
    growth: list[float] = []
    bucket = f"fleet-bench-{secrets.token_hex(4)}"
    with contextlib.ExitStack() as stack:
        s3 = stack.enter_context(running_seaweedfs())
        database = stack.enter_context(scratch_database())
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-bench-pull-")))
        procs = stack.enter_context(processes.processes(logs))
        hub = processes.hub(procs, ["--generated-bytes", str(size)])
        api_url = processes.control_plane(procs, _environment(s3, bucket, database, hub))
        pid = procs.started["apiserver"].pid
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
        api = stack.enter_context(httpx.Client(base_url=api_url, headers=headers, timeout=120))
        httpx.get(f"{hub}/api/models/fleet/generated", timeout=300)  # the hub hashes it once
        _pull(api, "warm-up")  # imports, pools and connections: not part of any round
        api.delete("/api/v1/models/warm-up")
        for round_ in range(ROUNDS):
            before = _memory(pid)["VmRSS"]
            exact = _reset_peak(pid)
            pulls.append(_pull(api, f"bench-{round_}"))
            peak = _memory(pid)["VmHWM"]
            growth.append(max(0, peak - before) if exact else float("nan"))
            api.delete(f"/api/v1/models/bench-{round_}").raise_for_status()
            plains.append(_plain(s3, bucket))
            print(f"bench: pull round {round_ + 1} of {ROUNDS} done", file=sys.stderr)
    mb = size / 1e6
    return {
        "bytes": float(size),
        "pull_s": median(pulls),
        "plain_s": median(plains),
        "pull_mb_per_s": mb / median(pulls),
        "plain_mb_per_s": mb / median(plains),
        "ratio": median(plains) / median(pulls),
        "rss_growth_mib": median(growth) / (1 << 20),
    }


def report(figures: dict[str, float]) -> list[str]:
    size = figures["bytes"] / (1 << 20)
    ratio, growth = figures["ratio"], figures["rss_growth_mib"]
    return [
        "## Model pull",
        "",
        f"A generated {size:.0f} MiB safetensors file from the synthetic hub into SeaweedFS",
        "(`weed mini`, loopback) through the control plane, against a plain minio `put_object` of",
        f"the same bytes with the same part size ({SETTINGS.part_size >> 20} MiB) and parallelism",
        f"({SETTINGS.parallel_parts}); medians of {ROUNDS} interleaved rounds. The pull includes",
        "the download, sha256, the multipart upload and verification.",
        "",
        "| path | seconds | MB/s |",
        "|---|---|---|",
        f"| control-plane pull | {figures['pull_s']:.2f} | {figures['pull_mb_per_s']:.0f} |",
        f"| plain minio upload | {figures['plain_s']:.2f} | {figures['plain_mb_per_s']:.0f} |",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| pull throughput >= 80% of the plain upload | {ratio:.0%} | {verdict(ratio >= 0.8)} |",
        f"| the control plane's peak RSS growth while pulling < 64 MiB | {growth:.1f} MiB | "
        f"{verdict(growth < 64)} |",
        "",
    ]


if __name__ == "__main__":
    print("\n".join(report(run())))
