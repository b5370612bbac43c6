"""What a pull from the hub and an import from a user's files share: bytes arriving for a model's
planned files, hashed as they come, watched while they move, and one ending.

A ``Transfer`` keeps its progress in memory for ``GET …/pull`` and its event stream, writes it to
Postgres every ``persist_every_s`` and after each file, and ends the model ``Ready`` (the stored
files parsed into facts), ``Failed`` or ``Cancelled``; every ending but Ready removes the objects.
``pulling.Pull`` fetches the files from the hub in a task of its own; ``importing.Import`` stores
the files a client uploads, one request per file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

from fleet_core.control_plane.registry import verifying
from fleet_core.control_plane.registry.formats import Blob
from fleet_core.control_plane.registry.hubclient import HubClient
from fleet_core.control_plane.registry.objects import ObjectStore, ObjectWriter
from fleet_core.control_plane.registry.store import ModelRecord, ModelStore, PlannedFile
from fleet_core.control_plane.registry.wire import (
    ModelFacts,
    ModelStatus,
    PullProgress,
    WeightFormat,
)

__all__ = ["Hashes", "Mismatch", "Transfer", "TransferDeps", "object_prefix", "progress_of"]

log = logging.getLogger("fleet.registry")

Stop = Literal["cancel", "shutdown"]
TERMINAL: tuple[ModelStatus, ...] = ("Ready", "Failed", "Cancelled", "Registered")
_NOTIFY_EVERY_S = 0.1
_WRITE_SIZE = 1 << 20


@dataclass(frozen=True)
class TransferDeps:
    store: ModelStore
    objects: ObjectStore
    hub: HubClient
    persist_every_s: float = 1.0
    stall_timeout_s: float = 30.0


def object_prefix(model_id: str) -> str:
    return f"models/{model_id}/"


def progress_of(record: ModelRecord) -> PullProgress:
    """A transfer's progress as last persisted (none running in this process)."""
    files = record.files
    done = sum(f.size for f in files if f.done)
    return PullProgress(
        model=record.id,
        status=record.status,
        reason=record.reason,
        files_done=sum(1 for f in files if f.done),
        files_total=len(files),
        bytes_done=record.bytes_done if record.status == "Pulling" else done,
        bytes_total=sum(f.size for f in files),
        bytes_per_second=0,
        eta_seconds=None,
    )


class Mismatch(Exception):
    """The stored bytes are not what was promised (hash or size)."""


class Transfer:
    """The bytes of one model's files on their way into the store; ``snapshot()`` and
    ``changes()`` watch it, ``halt()`` stops it (a client's cancel, or a shutdown)."""

    promised_by = "the hub"
    """Who promised the hashes, for the reason of a mismatch."""

    def __init__(self, record: ModelRecord, deps: TransferDeps) -> None:
        self.model_id = record.id
        self.requested: WeightFormat | None = record.format
        self._deps = deps
        self.commit = record.revision
        self.files = list(record.files)
        self.status: ModelStatus = "Pulling"
        self.reason = ""
        self.current: str | None = None
        self.stop: Stop | None = None
        self._partial = 0  # bytes of the file in flight
        self._started = time.monotonic()
        self._base = self._done_bytes()
        self._persisted = self._notified = 0.0
        self._version = 0
        self._changed = asyncio.Condition()

    @property
    def prefix(self) -> str:
        return object_prefix(self.model_id)

    async def halt(self, why: Stop) -> None:
        """Stops whatever is moving bytes and waits until it has (subclasses)."""
        raise NotImplementedError

    # --- watching ----------------------------------------------------------------------------
    def snapshot(self) -> PullProgress:
        done, total = self._done_bytes() + self._partial, sum(f.size for f in self.files)
        rate = int((done - self._base) / max(time.monotonic() - self._started, 1e-3))
        eta = int((total - done) / rate) if rate > 0 and self.status == "Pulling" else None
        return PullProgress(
            model=self.model_id,
            status=self.status,
            reason=self.reason,
            files_done=sum(1 for f in self.files if f.done),
            files_total=len(self.files),
            bytes_done=done,
            bytes_total=total,
            bytes_per_second=max(rate, 0),
            eta_seconds=eta,
            current_file=self.current,
        )

    async def changes(self, *, keepalive_s: float = 15.0) -> AsyncIterator[PullProgress]:
        """Snapshots as the transfer moves, ending with the one in its final state."""
        seen = -1
        while True:
            async with self._changed:
                if seen == self._version:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._changed.wait_for(self._moved(seen)), keepalive_s
                        )
                seen = self._version
                snapshot = self.snapshot()
            yield snapshot
            if snapshot.status in TERMINAL:
                return

    def _moved(self, seen: int) -> Callable[[], bool]:
        return lambda: self._version != seen

    async def _notify(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._notified >= _NOTIFY_EVERY_S:
            self._notified = now
            async with self._changed:
                self._version += 1
                self._changed.notify_all()

    # --- moving bytes ------------------------------------------------------------------------
    async def _store(
        self, chunks: AsyncIterator[bytes], writer: ObjectWriter, hashes: Hashes, *, limit: int
    ) -> None:
        """Hashes and writes ``chunks`` (the network hands out small pieces; the store gets
        ~1 MiB writes). More than ``limit`` bytes in all is a Mismatch, caught as it happens."""
        pending = bytearray()
        async for chunk in chunks:
            hashes.update(chunk)
            pending += chunk
            self._partial += len(chunk)
            if self._partial > limit:
                raise Mismatch(f"{self.current}: more than the {limit} bytes promised")
            if len(pending) >= _WRITE_SIZE:
                await writer.write(bytes(pending))
                pending.clear()
            await self._tick()
        if pending:
            await writer.write(bytes(pending))

    async def _file_done(self, index: int, digest: str) -> None:
        planned = self.files[index]
        self.files[index] = PlannedFile(
            path=planned.path, size=planned.size, sha256=planned.sha256,
            blob_id=planned.blob_id, done=True, stored_sha256=digest,
        )  # fmt: skip
        self._partial = 0
        await self._persist()
        await self._notify(force=True)

    async def _tick(self) -> None:
        await self._notify()
        if time.monotonic() - self._persisted >= self._deps.persist_every_s:
            await self._persist()

    # --- ending ------------------------------------------------------------------------------
    async def _verify(self) -> ModelFacts:
        objects, prefix = self._deps.objects, self.prefix

        def blob(planned: PlannedFile) -> Blob:
            key = prefix + planned.path
            return Blob(planned.path, planned.size, lambda o, n: objects.read(key, o, n))

        digests = {f.path: f.stored_sha256 or "" for f in self.files}
        blobs = [blob(f) for f in self.files]
        return await verifying.model_facts(blobs, digests, requested=self.requested)

    async def _persist(self) -> None:
        self._persisted = time.monotonic()
        await self._deps.store.save_progress(
            self.model_id,
            revision=self.commit,
            files=tuple(self.files),
            bytes_done=self._done_bytes() + self._partial,
        )

    async def _end(self, status: ModelStatus, reason: str, facts: ModelFacts | None) -> None:
        if status != "Ready":
            await self._deps.objects.delete_prefix(self.prefix)
        await self._persist()
        await self._deps.store.finish(self.model_id, status, reason=reason, facts=facts)
        self.status, self.reason, self.current = status, reason, None
        log.info("transfer of %s ended %s %s", self.model_id, status, reason)
        await self._notify(force=True)

    def _done_bytes(self) -> int:
        return sum(f.size for f in self.files if f.done)


class Hashes:
    """sha256 of every file, and the git blob sha1 for files the hub keeps in git (no LFS)."""

    def __init__(self, planned: PlannedFile, promised_by: str) -> None:
        self._sha256 = hashlib.sha256()
        self._blob = None
        self._by = promised_by
        if planned.sha256 is None and planned.blob_id is not None:
            self._blob = hashlib.sha1(f"blob {planned.size}\0".encode(), usedforsecurity=False)

    def update(self, chunk: bytes) -> None:
        self._sha256.update(chunk)
        if self._blob is not None:
            self._blob.update(chunk)

    def check(self, planned: PlannedFile) -> str:
        got = self._sha256.hexdigest()
        if planned.sha256 is not None and got != planned.sha256:
            raise Mismatch(
                f"sha256 mismatch for {planned.path}: {self._by} says {planned.sha256}, "
                f"the bytes received hash to {got}"
            )
        if self._blob is not None and self._blob.hexdigest() != planned.blob_id:
            raise Mismatch(
                f"git blob id mismatch for {planned.path}: {self._by} says {planned.blob_id}, "
                f"the bytes received give {self._blob.hexdigest()}"
            )
        return got
