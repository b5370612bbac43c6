"""Which functions database mode adds to a request: bytecodes per request, function by function.

Usage: python -m bench.bytecodes [SECONDS]   (default 10)

Callgrind (the instructions section) counts a server's instructions exactly, but almost all of
them fall in the interpreter's loop, so it cannot say which Python function they were for. This
counts the bytecodes each function executes instead: every gateway runs under a tracer
(``sys.settrace`` with opcode events, some 30 times slower), warmed up, then counted while the
bench's load generator drives it at plain c=64; the counts are divided by the requests the Go
stub received meanwhile. Bytecodes are not instructions either (a call costs more than an add),
but they follow them closely (session 21: no auth 7,952 against the ruleless database-mode
tenant's 8,954 bytecodes per request, +12.6%, where callgrind counted +12.8%), and they repeat
within a percent from run to run.

Three gateways, one after the other behind one stub: no auth (the baseline), database mode for
the tenant with no budget rule, and for the one under three (`database_bench`), with the
periodic work slowed as under callgrind (`instructions_bench.SLOWED_DATABASE`). It prints each
database-mode gateway's bytecodes per request beside the baseline's and the functions that
differ most. Not part of ``make bench``: the figures go into ADR 0002 by hand.

``python -m bench.bytecodes --trace OUT MODULE ARGS...`` is the tracer itself: it runs MODULE as
``python -m`` would; SIGUSR2 starts the count afresh and SIGUSR1 writes it to OUT as JSON
(``file:line:function`` -> bytecodes).
"""

from __future__ import annotations

import collections
import contextlib
import json
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from bench import database_bench, generator, instructions_bench
from bench.gateway_bench import ENV, QUIET
from fleet_testing.ports import free_port
from fleet_testing.waiting import until_answers

__all__ = ["Counter", "differences", "main"]

CELL = "plain c=64"
WARM_S = 4.0
TOP = 25
"""Functions listed per comparison."""

Counts = dict[str, float]
"""``file:line:function`` -> bytecodes (per request, once divided)."""


class Counter:
    """Counts the bytecodes every Python function executes while it is on."""

    def __init__(self) -> None:
        self.counts: collections.Counter[CodeType] = collections.Counter()

    def _local(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "opcode":
            self.counts[frame.f_code] += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        return self._local

    def start(self) -> None:
        threading.settrace(self._global)
        sys.settrace(self._global)

    def stop(self) -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type,unused-ignore]

    def snapshot(self) -> Counts:
        """The counts so far, by ``file:line:function`` (site-packages and src/ cut off)."""
        named: Counts = collections.defaultdict(float)
        for code, count in list(self.counts.items()):
            where = code.co_filename.split("site-packages/")[-1].split("/src/")[-1]
            named[f"{where}:{code.co_firstlineno}:{code.co_qualname}"] += count
        return dict(named)


def differences(base: Counts, other: Counts, top: int = TOP) -> list[tuple[str, float, float]]:
    """The ``top`` functions whose per-request counts differ most, largest difference first:
    (function, in ``base``, in ``other``)."""
    names = set(base) | set(other)
    ranked = sorted(names, key=lambda n: -abs(other.get(n, 0.0) - base.get(n, 0.0)))
    return [(n, base.get(n, 0.0), other.get(n, 0.0)) for n in ranked[:top]]


def _trace(out: Path, module: str, args: list[str]) -> None:
    counter = Counter()

    def dump(*_: object) -> None:
        counter.stop()
        out.write_text(json.dumps(counter.snapshot()))

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, lambda *_: counter.counts.clear())
    sys.argv = [module, *args]
    counter.start()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


@contextlib.contextmanager
def _traced(args: list[str], env: dict[str, str], out: Path) -> Iterator[tuple[str, Any]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "bench.bytecodes", "--trace", str(out)]
    command += [a.replace("PORT", str(port)) for a in args]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, env={**ENV, **env})
    try:
        until_answers(url + "/healthz", proc, within=300)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _count(url: str, proc: Any, key: str | None, engine: str, out: Path, seconds: float) -> Counts:
    generator.run(url, CELL, key, WARM_S)
    time.sleep(0.5)
    before = instructions_bench.served(engine)
    proc.send_signal(signal.SIGUSR2)
    generator.run(url, CELL, key, seconds)
    time.sleep(0.5)
    proc.send_signal(signal.SIGUSR1)
    requests = instructions_bench.served(engine) - before
    for _ in range(240):
        if out.exists():
            break
        time.sleep(0.5)
    time.sleep(1.0)  # the file is written in one call; let it finish
    counts: Counts = json.loads(out.read_text())
    return {name: count / max(requests, 1) for name, count in counts.items()}


def main(seconds: float) -> None:
    with instructions_bench.stage("bench-bytecodes:") as staged:
        engine, gateway = staged.engine, staged.gateway
        database_mode = {**staged.shipped, **instructions_bench.SLOWED_DATABASE}
        plan = [
            ("no auth", None, {**QUIET, **instructions_bench.SLOWED}),
            (database_bench.RULELESS, database_bench.RULELESS_SECRET, database_mode),
            (database_bench.DB_MODE, database_bench.SECRET, database_mode),
        ]
        found: dict[str, Counts] = {}
        for index, (name, key, env) in enumerate(plan):
            out = staged.tmp / f"counts-{index}.json"
            with _traced(gateway, env, out) as (url, proc):
                found[name] = _count(url, proc, key, engine, out, seconds)
            print(f"bench.bytecodes: {name} counted", file=sys.stderr)
    base = found["no auth"]
    print(f"bytecodes per request ({CELL}): no auth {sum(base.values()):,.0f}")
    for name, counts in found.items():
        if name == "no auth":
            continue
        total = sum(counts.values())
        print(f"\n{name}: {total:,.0f} ({sum(base.values()) / total:.1%} of it is no auth's)")
        for function, was, now in differences(base, counts):
            print(f"  {was:8.1f} {now:8.1f} {now - was:+8.1f}  {function}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--trace"]:
        _trace(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
    else:
        main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
