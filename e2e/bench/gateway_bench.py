"""Gateway overhead: direct to the stub engine, through a bare proxy, through fleet-gateway.

Every process is separate (engine, proxy, gateway, load generator) and all run on this machine's
2 cores, so absolute numbers are noisy; the ratios within one run are what the targets judge:
gateway/bare-proxy throughput at concurrency 64 (target >= 70%) and the gateway's added p50 for a
sequential client (target <= 1 ms).
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
Cell = dict[str, float]


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
def process(args: list[str], health: str, env: dict[str, str] | None = None) -> Iterator[None]:
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT / "e2e"), **(env or {})},
    )
    try:
        wait_for(health, proc)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def load(url: str, concurrency: int, stream: bool) -> Cell:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.load",
            url,
            str(concurrency),
            str(SECONDS),
            "stream" if stream else "plain",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "e2e")},
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@contextlib.contextmanager
def servers() -> Iterator[dict[str, str]]:
    engine, bare, gateway = free_port(), free_port(), free_port()
    urls = {
        name: f"http://127.0.0.1:{port}"
        for name, port in (("direct", engine), ("bare proxy", bare), ("fleet-gateway", gateway))
    }
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fleet.yaml"
        config.write_text(
            f'listen: "127.0.0.1:{gateway}"\nupstreams:\n  - id: bench\n'
            f"    model: bench\n    base_url: {urls['direct']}\n"
        )
        with contextlib.ExitStack() as stack:
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
                    urls["direct"] + "/health",
                )
            )
            stack.enter_context(
                process(
                    [sys.executable, "-m", "bench.bare_proxy", str(bare), urls["direct"]],
                    urls["direct"] + "/health",
                )
            )
            stack.enter_context(
                process(
                    [sys.executable, "-m", "fleet_core.gateway", "--config", str(config)],
                    urls["fleet-gateway"] + "/healthz",
                )
            )
            time.sleep(0.5)
            yield urls


def run() -> dict[str, object]:
    results: dict[str, dict[str, Cell]] = {}
    with servers() as urls:
        for name, url in urls.items():
            cells = results.setdefault(name, {})
            cells["sequential"] = load(url, 1, False)
            for stream in (False, True):
                for conc in (16, 64):
                    cells[f"{'stream' if stream else 'plain'} c={conc}"] = load(url, conc, stream)
            print(f"bench: {name} done", file=sys.stderr)
    return {"gateway": results}


def _machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()}"
    )


def write_report(sections: list[dict[str, object]]) -> None:
    results = sections[0]["gateway"]
    assert isinstance(results, dict)
    cells = list(results["direct"])
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`.venv/bin/python -m bench` with `PYTHONPATH=e2e`); every figure",
        "below comes from one run on one machine, with the baseline measured in that same run.",
        "",
        f"- Machine: {_machine()}",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Each cell: {SECONDS:g} s of closed-loop load after a warm-up, from a load generator in",
        "  its own process; stub engine with no artificial delay, 16-token replies.",
        "",
        "## Gateway overhead (issue 3)",
        "",
        "| cell | " + " | ".join(f"{name} req/s | p50 ms | p99 ms" for name in results) + " |",
        "|---|" + "---|---|---|" * len(results),
    ]
    for cell in cells:
        row = [
            f"{results[n][cell]['rps']:.0f} | {results[n][cell]['p50_ms']:.2f} | "
            f"{results[n][cell]['p99_ms']:.2f}"
            for n in results
        ]
        lines.append(f"| {cell} | " + " | ".join(row) + " |")
    gw, bare = results["fleet-gateway"], results["bare proxy"]
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    for cell in ("plain c=64", "stream c=64", "plain c=16", "stream c=16"):
        ratio = gw[cell]["rps"] / bare[cell]["rps"]
        lines.append(
            f"| gateway/bare throughput, {cell} >= 70% | {ratio:.0%} | "
            f"{'met' if ratio >= 0.7 else 'NOT met'} |"
        )
    added = gw["sequential"]["p50_ms"] - results["direct"]["sequential"]["p50_ms"]
    over_bare = gw["sequential"]["p50_ms"] - bare["sequential"]["p50_ms"]
    lines.append(
        f"| added p50, sequential client, vs direct <= 1 ms | {added:.2f} ms "
        f"({over_bare:+.2f} ms vs bare proxy) | {'met' if added <= 1 else 'NOT met'} |"
    )
    errors = sum(c["errors"] for r in results.values() for c in r.values())
    lines += ["", f"Non-200 answers during the run: {errors}.", ""]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(lines))
    print("\n".join(lines))
