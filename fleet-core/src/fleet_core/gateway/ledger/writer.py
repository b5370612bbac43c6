"""The ledger writer: a UsageSink that never blocks a response and never loses a record.

``record()`` appends to a bounded queue in memory. One background task takes up to ``batch_size``
records every ``flush_interval_s`` (sooner when a batch is full) and writes each batch in one
transaction (`store.insert_batch`). When the database cannot be reached (refused, reset, timed
out) the batch goes to the spool, and so does every batch after it, until a retry (every
``retry_interval_s``) replays the spool; the request_id key makes replaying a batch that did
commit harmless. A full queue spools the overflow from ``record()`` itself. A record the database
refuses as invalid is set aside in the spool's rejected file, found by halving its batch, so one
bad record cannot hold up the others. ``aclose()`` drains the queue, to the database or the spool.

When the spool cannot be written either (a full disk), the batch goes back to the front of the
queue and the writer pauses — ``retry_interval_s``, doubling up to ``MAX_PAUSE_S`` — before trying
the database and then the spool again; the event loop is never spun, and each kind of failure is
logged at most once per ``LOG_EVERY_S`` with a count of what was suppressed.

What a crash can lose: records are safe once in the ledger or the spool (the spool is fsync'd per
batch, except for a full queue's overflow, which reaches the OS cache: safe from a process crash,
not a machine crash). A process crash loses what is still in the in-memory queue: what arrived
since the last batch was taken — normally ``flush_interval_s`` of records, at worst as long as one
database write may take (``timeout_s``) — and, while neither the database nor the spool can be
written, everything queued, up to ``queue_limit`` records; beyond that records are lost as they
arrive (counted in ``stats.lost`` and logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool

from fleet_core.gateway.ledger import store
from fleet_core.gateway.ledger.spool import Spool
from fleet_core.gateway.metering.records import UsageRecord

__all__ = ["LedgerWriter", "WriterStats"]

log = logging.getLogger("fleet.ledger")
MAX_PAUSE_S = 30.0
"""The longest pause between attempts while neither the database nor the spool takes records."""
LOG_EVERY_S = 10.0
"""A repeating failure is logged at most this often."""

# The batch's fault: retrying cannot help, so the offending record is set aside. Besides the
# database's own refusals, a value psycopg cannot even encode (an int past int8 is OverflowError,
# a NUL in text is a DataError, a wrong type is TypeError or ValueError) is the record's fault.
_INVALID = (psycopg.DataError, psycopg.IntegrityError, OverflowError, ValueError, TypeError)
# The database's (or the network's) fault: spool, and retry later.
_UNAVAILABLE = (psycopg.Error, OSError, TimeoutError)

Connection = psycopg.AsyncConnection[Any]


@dataclass
class WriterStats:
    """Running counts, for tests, logs and metrics."""

    batches: int = 0  # transactions committed
    written: int = 0  # rows new to the ledger
    duplicates: int = 0  # rows it already had (replays, retries)
    spooled: int = 0  # records written to the spool
    replayed: int = 0  # records read back from the spool and committed
    rejected: int = 0  # records the database refused as invalid
    outages: int = 0  # times the database went from reachable to not
    spool_failures: int = 0  # spool appends that failed (a full disk, an I/O error)
    lost: int = 0  # records neither queue, database nor spool could take


class _Throttled:
    """Logs a repeating failure at most once per ``every_s``, counting the ones it skipped."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self._every_s = every_s
        self._next = 0.0
        self._skipped = 0

    def error(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return
        if self._skipped:
            message += f" (and {self._skipped} more like it in the last {self._every_s:.0f}s)"
        self._skipped, self._next = 0, now + self._every_s
        log.error(message, *args)


class _Database(Protocol):
    def connection(self) -> contextlib.AbstractAsyncContextManager[Connection]: ...

    async def close(self) -> None: ...


class _Dedicated:
    """A connection of the writer's own, opened on demand and dropped after any failure, since a
    connection that failed mid-COPY or was cancelled is in no known state."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._conn: Connection | None = None

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        if self._conn is None:
            self._conn = await psycopg.AsyncConnection.connect(
                self._url, autocommit=True, connect_timeout=max(1, round(self._timeout_s))
            )
        try:
            yield self._conn
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()


class _Pooled:
    """Connections borrowed from the application's pool, which heals them itself."""

    def __init__(self, pool: AsyncConnectionPool, *, timeout_s: float) -> None:
        self._pool = pool
        self._timeout_s = timeout_s

    def connection(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        return self._pool.connection(timeout=self._timeout_s)

    async def close(self) -> None:
        pass  # the pool belongs to whoever opened it


class LedgerWriter:
    """Batches usage records into the ledger; spools them while the database is away.

    ``database`` is the application's pool or a URL (the writer then keeps one connection of its
    own). Call `record` from the event loop's thread only.
    """

    def __init__(
        self,
        database: AsyncConnectionPool | str,
        *,
        spool_path: Path,
        batch_size: int = 500,
        flush_interval_s: float = 0.2,
        queue_limit: int = 100_000,
        retry_interval_s: float = 1.0,
        timeout_s: float = 5.0,
        on_commit: Callable[[Sequence[UsageRecord]], None] | None = None,
    ) -> None:
        self._on_commit = on_commit
        """Told of every batch once committed (the gateway's budget book uses it)."""
        self._db: _Database = (
            _Dedicated(database, timeout_s=timeout_s)
            if isinstance(database, str)
            else _Pooled(database, timeout_s=timeout_s)
        )
        self._spool = Spool(spool_path)
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._queue_limit = queue_limit
        self._retry_interval_s = retry_interval_s
        self._timeout_s = timeout_s
        self._queue: deque[UsageRecord] = deque()
        self._wake = asyncio.Event()
        self._caught_up = asyncio.Event()
        self._closing = False
        self._closed = asyncio.Event()
        self._retry_at = 0.0  # while the database is away: when to try it again; else 0
        self._paused_until = 0.0  # after a spool failure: no attempt before this
        self._pause_s = 0.0
        self._spool_log = _Throttled()
        self._lost_log = _Throttled()
        self._task: asyncio.Task[None] | None = None
        self.stats = WriterStats()

    @property
    def available(self) -> bool:
        """Whether the last attempt to reach the database succeeded."""
        return self._retry_at == 0.0

    @property
    def problem(self) -> str | None:
        """Why the writer cannot take records to the ledger, for readiness: its task ended (a
        bug killed it; records would wait in memory until shutdown), or None."""
        task = self._task
        if task is None or not task.done() or self._closing:
            return None
        return "ledger writer stopped: usage records are not being written"

    @property
    def settled(self) -> bool:
        """Whether everything recorded so far is in the ledger (or set aside as invalid)."""
        return self.available and not self._queue and not self._spool.pending

    async def wait_settled(self) -> None:
        """Wait until the writer has caught up: everything recorded before is committed."""
        await self._caught_up.wait()

    def record(self, record: UsageRecord) -> None:
        """Queue ``record`` for the ledger; a refusal is not kept (it bills nothing, and a client
        looping on a 429 would write a row per refusal: the gateway's metrics count them)."""
        if record.outcome == "refused":
            return
        if not self._queue:  # while the queue holds a record, the writer is not caught up
            self._caught_up.clear()
        if self._closing or len(self._queue) >= self._queue_limit:
            self._overflow(record)
            return
        self._queue.append(record)
        if len(self._queue) >= self._batch_size:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ledger-writer")
            self._task.add_done_callback(self._stopped)

    def _stopped(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() and not self._closing:
            log.error("ledger writer cancelled; %d records held in memory", len(self._queue))
        elif not task.cancelled() and (exc := task.exception()) is not None:
            log.error(
                "ledger writer stopped; %d records held in memory", len(self._queue), exc_info=exc
            )

    async def aclose(self) -> None:
        """Stop after writing (or spooling) everything recorded so far."""
        self._closing = True
        self._closed.set()
        self._wake.set()
        try:
            if self._task is not None and not self._task.done():
                await self._task  # one that died already was logged (`_stopped`)
        finally:
            self._spool_or_hold(list(self._queue))  # only if the task died of a bug
            self._queue.clear()
            await self._db.close()

    async def __aenter__(self) -> LedgerWriter:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _overflow(self, record: UsageRecord) -> None:
        # No fsync here: record() must not wait on the disk; a process crash still keeps it.
        try:
            self._spool.append([record], sync=False)
        except OSError as exc:
            self.stats.lost += 1
            self._lost_log.error(
                "usage record %s lost: queue full, spool unwritable: %s", record.request_id, exc
            )
            return
        self.stats.spooled += 1

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            await self._deliver(batch)
            if self.settled:
                self._caught_up.set()
            if self._closing and not self._queue:
                return
            # A backlog is delivered batch after batch without awaiting (spooling is
            # synchronous): let the rest of the loop run between two batches.
            await asyncio.sleep(0)

    async def _next_batch(self) -> list[UsageRecord]:
        pause = self._paused_until - time.monotonic()
        if pause > 0 and not self._closing:
            # A full queue keeps `_wake` set: wait on closing only, or this would spin.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._closed.wait()
        elif len(self._queue) < self._batch_size and not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._flush_interval_s):
                    await self._wake.wait()
        self._wake.clear()
        count = min(len(self._queue), self._batch_size)
        return [self._queue.popleft() for _ in range(count)]

    async def _deliver(self, batch: list[UsageRecord]) -> None:
        if not batch and not self._spool.pending:
            return  # nothing to try: the database's state is unknown, not recovered
        if self._retry_at and time.monotonic() < self._retry_at:
            self._spool_or_hold(batch)
            return
        try:
            if self._spool.pending:
                await self._replay()
            if batch:
                await self._write(batch)
        except _UNAVAILABLE as exc:
            self._unavailable(exc)
            self._spool_or_hold(batch)
            return
        if self._retry_at:
            log.warning("ledger database reachable again; spool replayed")
        self._retry_at = 0.0
        self._pause_s = 0.0

    async def _replay(self) -> None:
        while (segment := self._spool.next_segment()) is not None:
            with contextlib.closing(self._spool.read(segment, self._batch_size)) as chunks:
                for chunk in chunks:
                    await self._write(chunk)
                    self.stats.replayed += len(chunk)
            self._spool.finish(segment)

    async def _write(self, batch: Sequence[UsageRecord]) -> None:
        try:
            async with asyncio.timeout(self._timeout_s), self._db.connection() as conn:
                new = await store.insert_batch(conn, batch)
        except _INVALID as exc:
            await self._bisect(batch, exc)
            return
        self.stats.batches += 1
        self.stats.written += new
        self.stats.duplicates += len(batch) - new
        if self._on_commit is not None:
            self._on_commit(batch)

    async def _bisect(self, batch: Sequence[UsageRecord], exc: BaseException) -> None:
        if len(batch) == 1:
            self._spool.reject(batch, exc)
            self.stats.rejected += 1
            return
        half = len(batch) // 2
        await self._write(batch[:half])
        await self._write(batch[half:])

    def _unavailable(self, exc: BaseException) -> None:
        if not self._retry_at:
            self.stats.outages += 1
            log.warning("ledger database unreachable, spooling to %s: %s", self._spool.path, exc)
        self._retry_at = time.monotonic() + self._retry_interval_s

    def _spool_or_hold(self, batch: list[UsageRecord]) -> None:
        if not batch:
            return
        try:
            self._spool.append(batch)
        except OSError as exc:
            self.stats.spool_failures += 1
            if self._closing:
                self.stats.lost += len(batch)
                log.error("%d usage records lost: spool unwritable at close: %s", len(batch), exc)
            else:
                self._queue.extendleft(reversed(batch))
                self._pause_s = min(MAX_PAUSE_S, max(self._retry_interval_s, 2 * self._pause_s))
                self._paused_until = time.monotonic() + self._pause_s
                self._spool_log.error(
                    "spool %s unwritable, holding %d records in memory, next try in %.1fs: %s",
                    self._spool.path,
                    len(self._queue),
                    self._pause_s,
                    exc,
                )
            return
        self._pause_s = 0.0
        self.stats.spooled += len(batch)
