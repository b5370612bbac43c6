"""Where a gateway process spends its time under load: py-spy, grouped by package.

Usage: python -m bench.profile [SECONDS] [plain|stream] [SERVER]   (py-spy on PATH, or PY_SPY=path)
Starts the stub engine and one gateway (``bench.serve SERVER gateway``, uvicorn by default, as
``fleet-gateway`` ships), drives it at c=32 from the bench's load generator, samples the gateway
with py-spy for SECONDS,
and prints the share of samples whose innermost frame is in each package (self time) and the
share that pass through each of a few layers (inclusive time). Not part of ``make bench``: the
figures go into ADR 0002 by hand. ``FLEET_PROFILE_KEEP=PATH`` keeps py-spy's raw stacks there.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from bench.gateway_bench import ENV, load, process
from fleet_testing.ports import free_port

GROUPS = (
    ("fleet_core", "fleet_core/"),
    ("hypercorn", "hypercorn/"),
    ("h11", "h11/"),
    ("uvicorn", "uvicorn/"),
    ("httptools", "httptools/"),
    ("starlette", "starlette/"),
    ("aiohttp", "aiohttp/"),
    ("yarl/multidict", "yarl/"),
    ("yarl/multidict", "multidict/"),
    ("msgspec", "msgspec"),
    ("prometheus_client", "prometheus_client/"),
    ("logging", "logging/"),
    ("asyncio", "asyncio/"),
    ("uvloop", "uvloop"),
)
LAYERS = (
    ("the engine call (aiohttp client)", ("aiohttp/client.py",)),
    ("reading the request body", ("starlette/requests.py",)),
    ("routing and admission", ("fleet_core/gateway/admission/",)),
    ("the usage record and metrics", ("fleet_core/gateway/metering/",)),
    ("logging (access log)", ("logging/",)),
)
"""Layers measured inclusively: a sample counts for a layer when any of its frames is there."""


def _group(frame: str) -> str:
    for name, marker in GROUPS:
        if marker in frame:
            return name
    return "other (stdlib, C)"


def breakdown(collapsed: str) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(self share per package, inclusive share per layer, self share of the top functions)
    from py-spy's raw collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    layers: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[_group(frames[-1])] += count
        leaves[_short(frames[-1])] += count
        for name, markers in LAYERS:
            if any(marker in frame for frame in frames for marker in markers):
                layers[name] += count
    total = max(total, 1)
    return (
        {k: v / total for k, v in own.most_common()},
        {name: layers[name] / total for name, _ in LAYERS},
        {k: v / total for k, v in leaves.most_common(15)},
    )


def _short(frame: str) -> str:
    """``function (path/to/file.py:12)`` -> ``function (package/file.py)``."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(path.split('/')[-2:])})"


def main(seconds: float, mode: str, server: str) -> None:
    spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("bench.profile: py-spy is not installed (pip install py-spy)")
    engine, port = free_port(), free_port()
    direct, url = f"http://127.0.0.1:{engine}", f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: bench\n    model: bench\n    base_url: {direct}\n")
        stub = [sys.executable, "-m", "fleet_core.devtools.stub_engine", "--port", str(engine)]
        gateway = [sys.executable, "-m", "bench.serve", server, "gateway", str(port), str(config)]
        with (
            process([*stub, "--model", "bench"], direct + "/health"),
            process(gateway, url + "/healthz"),
        ):
            pid = _listener(port)
            cell = f"{mode} c=32"
            driver = threading.Thread(target=load, args=(url, cell, None, seconds + 4))
            driver.start()
            out = Path(tmp) / "profile.txt"
            record = [spy, "record", "--pid", str(pid), "--duration", str(int(seconds))]
            record += ["--rate", "250", "--format", "raw", "--output", str(out), "--nonblocking"]
            subprocess.run(record, check=True, capture_output=True, env=ENV)
            driver.join()
            own, layers, top = breakdown(out.read_text())
            if keep := os.environ.get("FLEET_PROFILE_KEEP"):
                shutil.copyfile(out, keep)
    print(f"self time by package ({server}, {mode} c=32):")
    for name, share in own.items():
        print(f"  {name:28} {share:6.1%}")
    print("inclusive time by layer:")
    for name, share in layers.items():
        print(f"  {name:40} {share:6.1%}")
    print("top functions by self time:")
    for name, share in top.items():
        print(f"  {name:60} {share:6.1%}")


def _listener(port: int) -> int:
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    raise SystemExit(f"bench.profile: nothing listens on {port}")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        float(args[0]) if args else 15.0,
        args[1] if len(args) > 1 else "plain",
        args[2] if len(args) > 2 else "uvicorn",
    )
