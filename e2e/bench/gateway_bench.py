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
SECONDS = float(os.environ.get("FLEET_BENCH_SECONDS", "5"))
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
            raise SystemExit(f"bench: a server exited early ({proc.args})")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench: {url} never answered")


@contextlib.contextmanager
def process(args: list[str], health: str) -> Iterator[None]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        wait_for(health, proc)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def load(url: str, cell: str) -> Cell:
    mode, _, conc = cell.partition(" c=")
    concurrency = int(conc) if conc else 1
    mode = {"sequential": "plain", "first frame": "first"}.get(mode, mode)
    out = subprocess.run(
        [sys.executable, "-m", "bench.load", url, str(concurrency), str(SECONDS), mode],
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


def run() -> dict[str, dict[str, Cell]]:
    results: dict[str, dict[str, Cell]] = {}
    with servers() as urls:
        for name, url in urls.items():
            cells = FULL if name == "direct" or "hypercorn" in name else SHORT
            results[name] = {cell: load(url, cell) for cell in cells}
            print(f"bench: {name} done", file=sys.stderr)
    return results


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


def report(results: dict[str, dict[str, Cell]]) -> list[str]:
    lines = [
        "## Gateway overhead (issue 3)",
        "",
        "Each cell: requests/s / p50 ms / p99 ms. `sequential` is one client, non-stream;",
        "`first frame` is one client timing a stream's first SSE frame (time to first token).",
        "",
        "| target | " + " | ".join(FULL) + " |",
        "|---|" + "---|" * len(FULL),
    ]
    lines += [_row(name, cells, FULL) for name, cells in results.items()]
    direct = results["direct"]
    lines += ["", "| target (hypercorn, as shipped) | measured | verdict |", "|---|---|---|"]
    gw, bare = results["fleet-gateway (hypercorn)"], results["bare proxy (hypercorn)"]
    for cell in ("plain c=16", "plain c=64", "stream c=16", "stream c=64"):
        ratio = gw[cell]["rps"] / bare[cell]["rps"]
        lines.append(
            f"| gateway/bare throughput, {cell} >= 70% | {ratio:.0%} | {_verdict(ratio >= 0.7)} |"
        )
    added = gw["sequential"]["p50_ms"] - direct["sequential"]["p50_ms"]
    over_bare = gw["sequential"]["p50_ms"] - bare["sequential"]["p50_ms"]
    lines.append(
        f"| added p50, sequential, vs direct <= 1 ms | {added:.2f} ms "
        f"({over_bare:+.2f} ms vs the bare proxy) | {_verdict(added <= 1)} |"
    )
    ttft = gw["first frame"]["p50_ms"] - direct["first frame"]["p50_ms"]
    lines.append(
        f"| added p50 to the first stream frame (a few ms) | {ttft:.2f} ms | "
        f"{_verdict(ttft <= 3)} |"
    )
    lines += [
        "",
        "Server comparison (same app objects, only the ASGI server differs):",
        "",
        "| server | bare proxy plain c=64 req/s | gateway plain c=64 req/s | ratio | "
        "bare stream c=64 | gateway stream c=64 | ratio | gateway sequential p50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for server in SERVERS:
        b, g = results[f"bare proxy ({server})"], results[f"fleet-gateway ({server})"]
        lines.append(
            f"| {server} | {b['plain c=64']['rps']:.0f} | {g['plain c=64']['rps']:.0f} | "
            f"{g['plain c=64']['rps'] / b['plain c=64']['rps']:.0%} | "
            f"{b['stream c=64']['rps']:.0f} | {g['stream c=64']['rps']:.0f} | "
            f"{g['stream c=64']['rps'] / b['stream c=64']['rps']:.0%} | "
            f"{g['sequential']['p50_ms']:.2f} |"
        )
    errors = sum(c["errors"] for r in results.values() for c in r.values())
    lines += ["", f"Non-200 answers during the run: {errors}.", ""]
    return lines


def write_report(sections: list[list[str]]) -> None:
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench`; every figure comes from one run on one machine, with its",
        "baseline measured in that same run. Absolute numbers move by 20-40% between runs on this",
        "shared machine; compare the ratios.",
        "",
        f"- Machine: {machine()}",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Each cell: {SECONDS:g} s of closed-loop load after a warm-up, from a load generator in",
        "  its own process; stub engine with no artificial delay, 16-token replies.",
        "",
    ]
    for section in sections:
        lines += section
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(lines))
    print("\n".join(lines))
