"""A local, append-only file of usage records the database could not take yet.

A bill must survive a database outage, and a restart in the middle of one, so records that cannot
be written go here: one msgspec JSON line per record, fsync'd before the writer moves on. Replay
first renames the file aside (``<spool>.replaying``), so records spooled during the replay land in
a fresh file and nothing is deleted that was not read; the renamed file is deleted only after
every record in it was committed. A crash in between leaves it in place and the next replay starts
with it again, which is safe because the ledger ignores request ids it already has.

An append that fails midway (a full disk, an I/O error) is cut back to where it started, so no
partial line is left to swallow the next record; if even that fails, the next append first ends
the torn line. Lines that cannot be decoded (an append torn by a crash) and records the database
refuses as invalid go to ``<spool>.rejected`` with an error logged: set aside for a person,
never dropped.

Every call is synchronous and belongs on the event loop's thread: appends and the rotation then
stay ordered without a lock, at the price of one fsync per spooled batch, during outages only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Sequence
from pathlib import Path

import msgspec

from fleet_core.gateway.metering.records import UsageRecord

__all__ = ["Spool"]

log = logging.getLogger("fleet.ledger")


class Spool:
    """The spool at ``path``, with its ``.replaying`` and ``.rejected`` companions beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.replaying = path.with_name(path.name + ".replaying")
        self.rejected = path.with_name(path.name + ".rejected")
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(UsageRecord)
        path.parent.mkdir(parents=True, exist_ok=True)
        _end_torn_line(path)
        self._torn = False
        self._pending = self.replaying.exists() or _size(path) > 0

    @property
    def pending(self) -> bool:
        """Whether records wait here for the database."""
        return self._pending

    def append(self, records: Sequence[UsageRecord], *, sync: bool = True) -> None:
        """Add ``records``; with ``sync`` they are on disk when this returns, else in the OS's
        cache (safe from this process crashing, not from the machine crashing)."""
        if not records:
            return
        if self._torn:
            _end_torn_line(self.path)
            self._torn = False
        try:
            _append(self.path, self._encoder.encode_lines(records), sync=sync)
        except _Torn as torn:
            self._torn = True
            raise torn.error from None
        self._pending = True

    def next_segment(self) -> Path | None:
        """The file to replay next: one left from an unfinished replay, else the spool renamed
        aside; None once nothing is pending."""
        if self.replaying.exists():
            return self.replaying
        if _size(self.path) > 0:
            os.replace(self.path, self.replaying)
            _sync_dir(self.path.parent)
            return self.replaying
        self._pending = False
        return None

    def read(self, segment: Path, size: int) -> Generator[list[UsageRecord], None, None]:
        """The records in ``segment``, in lists of at most ``size``."""
        chunk: list[UsageRecord] = []
        with segment.open("rb") as lines:
            for line in lines:
                if (record := self._decode(line)) is not None:
                    chunk.append(record)
                if len(chunk) >= size:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    def finish(self, segment: Path) -> None:
        """Forget ``segment``: every record in it is committed."""
        segment.unlink()
        _sync_dir(segment.parent)

    def reject(self, records: Sequence[UsageRecord], reason: BaseException) -> None:
        """Set aside records the database refuses, so they stop blocking the rest: each line
        the record with ``rejectedBecause`` (its reason) added, still readable as a record."""
        ids = ", ".join(r.request_id for r in records)
        log.error("ledger refused %s (set aside in %s): %s", ids, self.rejected, reason)
        because = msgspec.json.encode(f"{type(reason).__name__}: {reason}")
        lines = b"".join(
            self._encoder.encode(r)[:-1] + b',"rejectedBecause":' + because + b"}\n"
            for r in records
        )
        _append(self.rejected, lines, sync=True)

    def _decode(self, line: bytes) -> UsageRecord | None:
        if not line.strip():
            return None
        try:
            return self._decoder.decode(line)
        except msgspec.DecodeError as exc:
            log.error("unreadable spool line (set aside in %s): %s", self.rejected, exc)
            _append(self.rejected, line if line.endswith(b"\n") else line + b"\n", sync=True)
            return None


class _Torn(OSError):
    """An append failed and could not be cut back: a partial line may end the file."""

    def __init__(self, error: OSError) -> None:
        self.error = error


def _append(path: Path, data: bytes, *, sync: bool) -> None:
    """Append ``data`` whole or not at all: a failed write is truncated back to the old end.

    Unbuffered, so nothing is left in a buffer to be flushed (half) on close after a failure.
    """
    created = not path.exists()
    with path.open("ab", buffering=0) as file:
        start = os.fstat(file.fileno()).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[file.write(view) or 0 :]
            if sync:
                os.fsync(file.fileno())
        except OSError as exc:
            try:
                os.ftruncate(file.fileno(), start)
            except OSError:
                raise _Torn(exc) from exc
            raise
    if created and sync:
        _sync_dir(path.parent)


def _end_torn_line(path: Path) -> None:
    """After a crash mid-append, end the partial line, so the next append starts a line of its
    own instead of gluing a good record onto the torn one."""
    if _size(path) == 0:
        return
    with path.open("rb+") as file:
        file.seek(-1, os.SEEK_END)
        if file.read(1) != b"\n":
            file.write(b"\n")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _sync_dir(directory: Path) -> None:
    """Make a file's creation, rename or removal durable, not only its contents."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
