"""The writer with the database away and the spool's disk full: a real, tiny tmpfs.

Postgres is cut through a `TcpProxy`; the spool lives on a tmpfs of a few KB, so appends fail
with ENOSPC for real (partway through a batch, as a real disk would). The writer must keep the
event loop responsive (a ticker's lag stays small), log a bounded number of lines, never leave a
torn line in the spool, and lose nothing that fits in memory once the database is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from fleet_core.gateway.ledger import LedgerWriter, Spool
from fleet_core.gateway.metering.records import UsageRecord
from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory

from .conftest import settle, totals, usage

TMPFS_BYTES = 8 * 1024
N = 3000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on its own tmpfs of ``TMPFS_BYTES`` (mounting needs root)."""
    directory = tmp_path / "small"
    directory.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def spool_lines(path: Path) -> list[UsageRecord]:
    """Every line of the spool decoded: a torn line fails here."""
    data = path.read_bytes() if path.exists() else b""
    assert not data or data.endswith(b"\n"), "the spool ends with a partial line"
    decoder = msgspec.json.Decoder(UsageRecord)
    return [decoder.decode(line) for line in data.splitlines()]


class Ticker:
    """Measures how late a 10 ms sleep wakes up in the event loop: its responsiveness.

    A thread beside it measures the same for itself. When the whole process stops (the host
    or the kernel did not run it, as on a shared CI machine) both wake late together; when the
    event loop is blocked (the writer doing work in it) only the loop does. ``max_lag`` is the
    loop's lateness beyond what the thread saw in the same moment: the writer's share alone."""

    def __init__(self) -> None:
        self._loop_late: list[tuple[float, float]] = []
        self._thread_late: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick_thread, daemon=True)

    @property
    def max_lag(self) -> float:
        def seen_by_thread(start: float, end: float) -> float:
            overlaps = [e - s for s, e in self._thread_late if s < end and e > start]
            return max(overlaps, default=0.0)

        return max(
            (end - start - seen_by_thread(start, end) for start, end in self._loop_late),
            default=0.0,
        )

    @staticmethod
    def _note(late: list[tuple[float, float]], before: float) -> None:
        after = time.monotonic()
        if after - before > 0.05:  # late by 40 ms or more: the window it was late in
            late.append((before, after))

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            self._note(self._loop_late, before)

    def _tick_thread(self) -> None:
        while not self._stop.is_set():
            before = time.monotonic()
            time.sleep(0.01)
            self._note(self._thread_late, before)

    def __enter__(self) -> Ticker:
        self._thread.start()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self._stop.set()
        self._thread.join()


async def test_a_full_spool_disk_with_the_database_down_neither_stalls_nor_floods_nor_loses(
    ledger_url: str,
    small_disk: Path,
    tcp_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    target = servers.address_of(ledger_url)
    proxy = tcp_proxy(target.host, target.port)
    proxy.cut()
    spool_path = small_disk / "ledger.jsonl"
    caplog.set_level(logging.WARNING, logger="fleet.ledger")
    writer = LedgerWriter(
        proxy.url_for(ledger_url),
        spool_path=spool_path,
        batch_size=5,
        flush_interval_s=0.01,
        retry_interval_s=0.1,
        timeout_s=1.0,
    )
    async with writer:
        with Ticker() as ticker:
            for n in range(N):
                writer.record(usage(n, done_at=1_699_999_980.0 + n * 0.01))
                if n % 100 == 99:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(3.0)  # both away: the writer must wait, not spin

        assert writer.stats.spool_failures >= 1
        assert ticker.max_lag < 0.25, f"the event loop stalled for {ticker.max_lag:.2f}s"
        assert len(caplog.records) <= 10, [r.getMessage()[:80] for r in caplog.records]
        # whole lines only, though the disk filled mid-append (a replay attempt renames the
        # spool aside, and later batches start a new one)
        replaying = spool_path.with_name(spool_path.name + ".replaying")
        spooled = spool_lines(spool_path) + spool_lines(replaying)
        assert 0 < len(spooled) < N

        proxy.resume()
        await settle(writer, timeout_s=30)

    count, ledger, rollup = await totals(ledger_url)
    assert count == N  # what did not fit the disk waited in memory; nothing was lost
    assert ledger == rollup
    assert writer.stats.lost == 0


def test_a_failed_append_leaves_no_partial_line_to_eat_the_next_record(small_disk: Path) -> None:
    spool = Spool(small_disk / "ledger.jsonl")
    spool.append([usage(0)])
    filler = small_disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as file:
        while file.write(b"x" * 512):
            pass
    with pytest.raises(OSError, match="No space left"):
        spool.append([usage(n) for n in range(1, 40)])  # fails partway: the disk is full
    assert [r.request_id for r in spool_lines(spool.path)] == ["req-000000"]

    filler.unlink()
    spool.append([usage(99)])  # the next append starts a line of its own
    assert [r.request_id for r in spool_lines(spool.path)] == ["req-000000", "req-000099"]
