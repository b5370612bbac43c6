"""Which stub engine the gateway benchmarks run behind every row, and its CPU cost.

The Go stub (``bench/stubgo``, standard library only) is built like the load generator
(`gobuild`) and used whenever ``go`` is on PATH: on 2 cores the engine shares the machine with the
gateway under test, and the Python stub (``fleet_core.devtools.stub_engine``) spends about half the
gateway's own CPU per request, which caps what a second gateway worker can show. Without ``go``
(or with ``FLEET_BENCH_STUB=python``) the Python stub runs; every section says which one ran
(`describe`). Both answer the same wire (vLLM profile): ``python -m bench.stub`` measures the CPU
each spends per request under the Go load generator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import generator, gobuild
from fleet_testing.waiting import until_answers

__all__ = ["PREAMBLE", "command", "describe"]

SOURCE = Path(__file__).resolve().parent / "stubgo"
PREAMBLE = (
    "- The engine behind every row is a Go stub (`bench/stubgo`, its own HTTP/1.1 server",
    "  on one epoll loop; vLLM's wire, the Python stub's canned reply, answers made from bytes",
    "  quoted once),",
    "  built like the load generator; without `go` (or with `FLEET_BENCH_STUB=python`) the",
    "  Python stub (`fleet_core.devtools.stub_engine`) runs. Each section names the one it ran",
    "  (one that names none ran the Python stub). CPU per request of each stub alone under the Go",
    "  generator (`python -m bench.stub`, 2026-12-01, load average 7-8, medians of 3 rounds):",
    "  Go 0.029-0.033 ms plain, 0.036-0.038 ms stream (c=32 and c=64); Python 0.40-0.57 ms",
    "  plain, 0.68-0.74 ms stream, over 10x more, which on 2 cores took CPU from the gateway.",
)


def binary() -> Path | str:
    """The Go stub, built if missing; or why the Python one runs instead."""
    if os.environ.get("FLEET_BENCH_STUB") == "python":
        return "FLEET_BENCH_STUB=python"
    return gobuild.binary(SOURCE)


def python_command(port: int, model: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fleet_core.devtools.stub_engine",
        "--port",
        str(port),
        "--model",
        model,
    ]


def command(port: int, model: str) -> list[str]:
    """The engine's command line: port and model only (an engine key goes through
    ``FLEET_STUB_API_KEY``)."""
    found = binary()
    if isinstance(found, Path):
        return [str(found), str(port), model]
    return python_command(port, model)


def describe() -> str:
    """One sentence for a report: which stub engine ran, and why when it is the Python one."""
    found = binary()
    if isinstance(found, Path):
        return "Stub engine: Go (`bench/stubgo`, its own HTTP/1.1 server on one epoll loop)."
    return f"Stub engine: Python (`fleet_core.devtools.stub_engine`), because {found}."


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(cells: tuple[str, ...], rounds: int, seconds: float) -> dict[str, dict[str, float]]:
    """Both stubs, one at a time, in interleaved rounds: per stub and cell, the median requests/s
    and the stub's CPU milliseconds per request."""
    go = binary()
    if not isinstance(go, Path):
        raise SystemExit(f"bench.stub: no Go stub to compare ({go})")
    port = 18000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    programs = {"go": [str(go), str(port), "bench"], "python": python_command(port, "bench")}
    samples: dict[str, list[dict[str, float]]] = {}
    for _ in range(rounds):
        for name, program in programs.items():
            proc = subprocess.Popen(program, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                until_answers(url + "/health", proc, within=60)
                generator.run(url, "plain c=32", None, 1.0)  # warm-up
                for cell in cells:
                    before = _cpu_seconds(proc.pid)
                    figures = generator.run(url, cell, None, seconds)
                    cpu = _cpu_seconds(proc.pid) - before
                    requests = figures["rps"] * seconds
                    samples.setdefault(f"{name} {cell}", []).append(
                        {"rps": figures["rps"], "cpu_ms_per_request": cpu * 1000 / requests}
                    )
            finally:
                proc.terminate()
                proc.wait(timeout=20)
    return {
        name: {key: sorted(c[key] for c in runs)[len(runs) // 2] for key in runs[0]}
        for name, runs in samples.items()
    }


if __name__ == "__main__":
    chosen = tuple(sys.argv[1:]) or ("plain c=32", "plain c=64", "stream c=32", "stream c=64")
    print(json.dumps(compare(chosen, rounds=3, seconds=3.0), indent=1))
