"""Gateway overhead: direct to the stub engine, through a bare proxy, through fleet-gateway.

Every process is separate (engine, proxies, gateways, load generator) and all share this machine's
2 cores, so absolute numbers are noisy; the ratios within one run are what the targets judge:
gateway/bare-proxy throughput (target >= 70%) and the gateway's added p50 for a sequential client
(target <= 1 ms). The same gateway and bare proxy are also served by uvicorn and granian, because
the bare proxy on hypercorn already loses more than half of a direct call's throughput.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("FLEET_BENCH_SECONDS", "3"))
ROUNDS = int(os.environ.get("FLEET_BENCH_ROUNDS", "3"))
SERVERS = ("hypercorn", "uvicorn", "granian")
FULL = ("sequential", "first frame", "plain c=16", "plain c=64", "stream c=16", "stream c=64")
SHORT = ("sequential", "plain c=64", "stream c=64")
Cell = dict[str, float]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "e2e")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"bench: a server exited early ({proc.args!r})")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench: {url} never answered")


@contextlib.contextmanager
def process(args: list[str], health: str, env: dict[str, str] | None = None) -> Iterator[None]:
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**ENV, **(env or {})}
    )
    try:
        wait_for(health, proc)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def load(url: str, cell: str, key: str | None = None) -> Cell:
    mode, _, conc = cell.partition(" c=")
    concurrency = int(conc) if conc else 1
    mode = {"sequential": "plain", "first frame": "first"}.get(mode, mode)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.load",
            url,
            str(concurrency),
            str(SECONDS),
            mode,
            *([key] if key else []),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@contextlib.contextmanager
def servers() -> Iterator[dict[str, str]]:
    """The stub engine, then a bare proxy and a gateway on each ASGI server; name -> URL."""
    engine = free_port()
    direct = f"http://127.0.0.1:{engine}"
    urls = {"direct": direct}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        config = Path(tmp) / "fleet.yaml"
        config.write_text(f"upstreams:\n  - id: bench\n    model: bench\n    base_url: {direct}\n")
        stack.enter_context(
            process(
                [
                    sys.executable,
                    "-m",
                    "fleet_core.stub_engine",
                    "--port",
                    str(engine),
                    "--model",
                    "bench",
                ],
                direct + "/health",
            )
        )
        for server in SERVERS:
            for kind, target in (("bare", direct), ("gateway", str(config))):
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                stack.enter_context(
                    process(
                        [sys.executable, "-m", "bench.serve", server, kind, str(port), target],
                        url + "/healthz",
                    )
                )
                urls[f"{'bare proxy' if kind == 'bare' else 'fleet-gateway'} ({server})"] = url
        time.sleep(0.5)
        yield urls


Samples = dict[str, dict[str, list[Cell]]]


def run() -> Samples:
    """Every cell of every target, ``ROUNDS`` times, interleaved so that drift on the machine
    falls on all targets alike; ratios are then taken round by round."""
    samples: Samples = {}
    with servers() as urls:
        for round_ in range(ROUNDS):
            for name, url in urls.items():
                cells = FULL if name == "direct" or "hypercorn" in name else SHORT
                for cell in cells:
                    samples.setdefault(name, {}).setdefault(cell, []).append(load(url, cell))
            print(f"bench: round {round_ + 1} of {ROUNDS} done", file=sys.stderr)
    return samples


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def summary(cells: list[Cell]) -> Cell:
    return {key: median([c[key] for c in cells]) for key in cells[0]}


def ratio(samples: Samples, a: str, b: str, cell: str, key: str = "rps") -> float:
    return median(
        [x[key] / y[key] for x, y in zip(samples[a][cell], samples[b][cell], strict=True)]
    )


def added(samples: Samples, a: str, b: str, cell: str) -> float:
    pairs = zip(samples[a][cell], samples[b][cell], strict=True)
    return median([x["p50_ms"] - y["p50_ms"] for x, y in pairs])


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()}"
    )


def _row(name: str, cells: dict[str, Cell], columns: tuple[str, ...]) -> str:
    parts = [
        f"{cells[c]['rps']:.0f} / {cells[c]['p50_ms']:.2f} / {cells[c]['p99_ms']:.2f}"
        if c in cells
        else ""
        for c in columns
    ]
    return f"| {name} | " + " | ".join(parts) + " |"


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(samples: Samples) -> list[str]:
    medians = {
        name: {cell: summary(runs) for cell, runs in cells.items()}
        for name, cells in samples.items()
    }
    lines = [
        "## Gateway overhead (issue 3)",
        "",
        f"Each cell: requests/s / p50 ms / p99 ms, the median of {ROUNDS} interleaved rounds.",
        "`sequential` is one client, non-stream; `first frame` is one client timing a stream's",
        "first SSE frame (time to first token). Ratios and differences are taken round by round",
        "(gateway and baseline measured minutes apart at most), then the median is reported.",
        "",
        "| target | " + " | ".join(FULL) + " |",
        "|---|" + "---|" * len(FULL),
    ]
    lines += [_row(name, cells, FULL) for name, cells in medians.items()]
    gw, bare = "fleet-gateway (hypercorn)", "bare proxy (hypercorn)"
    lines += ["", "| target (hypercorn, as shipped) | measured | verdict |", "|---|---|---|"]
    for cell in ("plain c=16", "plain c=64", "stream c=16", "stream c=64"):
        r = ratio(samples, gw, bare, cell)
        lines.append(f"| gateway/bare throughput, {cell} >= 70% | {r:.0%} | {_verdict(r >= 0.7)} |")
    seq = added(samples, gw, "direct", "sequential")
    over_bare = added(samples, gw, bare, "sequential")
    lines.append(
        f"| added p50, sequential, vs direct <= 1 ms | {seq:.2f} ms "
        f"({over_bare:+.2f} ms vs the bare proxy) | {_verdict(seq <= 1)} |"
    )
    first = added(samples, gw, "direct", "first frame")
    lines.append(
        f"| added p50 to the first stream frame (a few ms) | {first:.2f} ms | "
        f"{_verdict(first <= 3)} |"
    )
    lines += [
        "",
        "Server comparison (same app objects; only the ASGI server differs):",
        "",
        "| server | bare plain c=64 req/s | gateway plain c=64 req/s | gateway/bare | "
        "bare stream c=64 | gateway stream c=64 | gateway/bare | gateway sequential p50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for server in SERVERS:
        b, g = f"bare proxy ({server})", f"fleet-gateway ({server})"
        lines.append(
            f"| {server} | {medians[b]['plain c=64']['rps']:.0f} | "
            f"{medians[g]['plain c=64']['rps']:.0f} | {ratio(samples, g, b, 'plain c=64'):.0%} | "
            f"{medians[b]['stream c=64']['rps']:.0f} | {medians[g]['stream c=64']['rps']:.0f} | "
            f"{ratio(samples, g, b, 'stream c=64'):.0%} | "
            f"{medians[g]['sequential']['p50_ms']:.2f} |"
        )
    errors = sum(c["errors"] for cells in samples.values() for runs in cells.values() for c in runs)
    lines += ["", f"Non-200 answers during the run: {errors}.", ""]
    return lines


def write_report(sections: list[list[str]]) -> None:
    """Write docs/benchmarks.md: the sections just run replace those of the same heading; the
    others stay as the last run that measured them left them (each section carries its date)."""
    path = ROOT / "docs" / "benchmarks.md"
    stamp = f"_Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}._"
    fresh = {section[0]: [section[0], "", stamp, *section[1:]] for section in sections}
    kept = _sections(path.read_text()) if path.exists() else {}
    merged = {**kept, **fresh}
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench`; every figure comes from one run on one machine, with its",
        "baseline measured in that same run. Absolute numbers move by 20-40% between runs on this",
        "shared machine; compare the ratios. `FLEET_BENCH_ONLY=<section>` reruns one section.",
        "",
        f"- Each cell: {SECONDS:g} s of closed-loop load after a warm-up, from a load generator in",
        "  its own process; stub engine with no artificial delay, 16-token replies.",
        "",
    ]
    for section in merged.values():
        lines += section
    path.write_text("\n".join(lines))
    print("\n".join(lines))


def _sections(text: str) -> dict[str, list[str]]:
    """``## heading`` -> its lines, from an earlier report."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = found.setdefault(line, [])
        if current is not None:
            current.append(line)
    return found
