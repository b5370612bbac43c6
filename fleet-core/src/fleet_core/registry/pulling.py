"""One pull: hub → sha256 → object store, file by file, with progress, cancel and resume.

Bytes stream through: a chunk read from the hub is hashed and handed to the store's writer, never
gathered into a whole file. Progress lives here, in memory, for ``GET …/pull`` and its event stream,
and is written to Postgres every ``persist_every_s`` and after each file, so a control plane that
restarts mid-pull resumes from the row: finished files are not fetched again, and an unfinished one
continues with a Range request where the store kept its bytes (directory) or starts again (S3).

How a pull stops decides what is left: a client's cancel or a failure removes every object; a
shutdown keeps them, and the row stays ``Pulling`` for the next start to resume.
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

from fleet_core.registry import verifying
from fleet_core.registry.formats import Blob, FormatError
from fleet_core.registry.hubclient import HubClient, HubError, RemoteFile
from fleet_core.registry.objects import ObjectStore, ObjectStoreError, ObjectWriter
from fleet_core.registry.store import ModelRecord, ModelStore, PlannedFile
from fleet_core.registry.wire import ModelFacts, ModelStatus, PullProgress, WeightFormat

__all__ = ["Pull", "PullDeps", "object_prefix", "progress_of"]

log = logging.getLogger("fleet.registry")

Stop = Literal["cancel", "shutdown"]
TERMINAL: tuple[ModelStatus, ...] = ("Ready", "Failed", "Cancelled", "Registered")
_NOTIFY_EVERY_S = 0.1
_WRITE_SIZE = 1 << 20


@dataclass(frozen=True)
class PullDeps:
    store: ModelStore
    objects: ObjectStore
    hub: HubClient
    persist_every_s: float = 1.0


def object_prefix(model_id: str) -> str:
    return f"models/{model_id}/"


def progress_of(record: ModelRecord) -> PullProgress:
    """A pull's progress as last persisted (no pull running in this process)."""
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


class _Verification(Exception):
    """A stored file is not what the hub promised (hash mismatch)."""


class Pull:
    """The pull of one model, run as one task; ``snapshot()`` and ``changes()`` watch it."""

    def __init__(self, record: ModelRecord, repo: str, revision: str, deps: PullDeps) -> None:
        self.model_id, self.repo, self.revision = record.id, repo, revision
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
        """Snapshots as the pull moves, ending with the one in its final state."""
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

    # --- running -----------------------------------------------------------------------------
    async def run(self, *, resume: bool) -> None:
        try:
            await self._pull(resume=resume)
        except asyncio.CancelledError:
            if self.stop == "shutdown":
                await self._persist()
                raise
            await self._end("Cancelled", "cancelled by a client", None)
            raise
        except (HubError, ObjectStoreError, FormatError, _Verification) as exc:
            await self._end("Failed", str(exc), None)
        except Exception as exc:  # a bug must still leave the model Failed, not stuck in Pulling
            log.exception("pull of %s crashed", self.model_id)
            await self._end("Failed", f"internal error: {type(exc).__name__}", None)

    async def _pull(self, *, resume: bool) -> None:
        if self.commit is None or not self.files:
            info = await self._deps.hub.info(self.repo, self.revision)
            self.commit = info.commit
            ordered = sorted(info.files, key=lambda f: (f.size, f.path))  # small files first
            self.files = [PlannedFile(path=f.path, size=f.size, sha256=f.sha256,
                                      blob_id=f.blob_id) for f in ordered]  # fmt: skip
            await self._persist()
            await self._notify(force=True)
        for index, planned in enumerate(self.files):
            if not planned.done:
                self.files[index] = await self._fetch(planned, resume=resume)
                self._partial = 0
                await self._persist()
                await self._notify(force=True)
        self.current = None
        facts = await self._verify()
        await self._end("Ready", "", facts)

    async def _fetch(self, planned: PlannedFile, *, resume: bool) -> PlannedFile:
        self.current = planned.path
        key = object_prefix(self.model_id) + planned.path
        writer = await self._deps.objects.writer(key, resume=resume)
        if writer.offset > planned.size:  # not a prefix of this file: start it again
            await writer.abort()
            writer = await self._deps.objects.writer(key, resume=False)
        try:
            digest = await self._download(planned, writer)
            await writer.commit()
        except BaseException:
            if self.stop == "shutdown":
                await writer.suspend()
            else:
                await writer.abort()
            raise
        return PlannedFile(
            path=planned.path, size=planned.size, sha256=planned.sha256,
            blob_id=planned.blob_id, done=True, stored_sha256=digest,
        )  # fmt: skip

    async def _download(self, planned: PlannedFile, writer: ObjectWriter) -> str:
        hashes = _Hashes(planned)
        offset = writer.offset
        if offset:
            async for chunk in writer.existing():
                hashes.update(chunk)
        self._partial = offset
        remote = RemoteFile(planned.path, planned.size, planned.sha256, planned.blob_id)
        assert self.commit is not None
        async with self._deps.hub.download(self.repo, self.commit, remote, offset=offset) as body:
            if body.start != offset:
                raise HubError(f"the hub ignored the Range request for {planned.path}")
            pending = bytearray()  # the network hands out small pieces; the store gets ~1 MiB
            async for chunk in body.chunks:
                hashes.update(chunk)
                pending += chunk
                self._partial += len(chunk)
                if len(pending) >= _WRITE_SIZE:
                    await writer.write(bytes(pending))
                    pending.clear()
                await self._tick()
            if pending:
                await writer.write(bytes(pending))
        return hashes.check(planned)

    async def _tick(self) -> None:
        await self._notify()
        if time.monotonic() - self._persisted >= self._deps.persist_every_s:
            await self._persist()

    async def _verify(self) -> ModelFacts:
        objects, prefix = self._deps.objects, object_prefix(self.model_id)

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
            await self._deps.objects.delete_prefix(object_prefix(self.model_id))
        await self._persist()
        await self._deps.store.finish(self.model_id, status, reason=reason, facts=facts)
        self.status, self.reason, self.current = status, reason, None
        log.info("pull of %s ended %s %s", self.model_id, status, reason)
        await self._notify(force=True)

    def _done_bytes(self) -> int:
        return sum(f.size for f in self.files if f.done)


class _Hashes:
    """sha256 of every file, and the git blob sha1 for files the hub keeps in git (no LFS)."""

    def __init__(self, planned: PlannedFile) -> None:
        self._sha256 = hashlib.sha256()
        self._blob = None
        if planned.sha256 is None and planned.blob_id is not None:
            self._blob = hashlib.sha1(f"blob {planned.size}\0".encode(), usedforsecurity=False)

    def update(self, chunk: bytes) -> None:
        self._sha256.update(chunk)
        if self._blob is not None:
            self._blob.update(chunk)

    def check(self, planned: PlannedFile) -> str:
        got = self._sha256.hexdigest()
        if planned.sha256 is not None and got != planned.sha256:
            raise _Verification(
                f"sha256 mismatch for {planned.path}: the hub says {planned.sha256}, "
                f"the bytes received hash to {got}"
            )
        if self._blob is not None and self._blob.hexdigest() != planned.blob_id:
            raise _Verification(
                f"git blob id mismatch for {planned.path}: the hub says {planned.blob_id}, "
                f"the bytes received give {self._blob.hexdigest()}"
            )
        return got
