"""One pull: hub → sha256 → object store, file by file, with progress, cancel and resume.

Bytes stream through: a chunk read from the hub is hashed and handed to the store's writer, never
gathered into a whole file (``transfers.Transfer`` keeps the progress and the ending). A control
plane that restarts mid-pull resumes from the row: finished files are not fetched again, and an
unfinished one continues with a Range request where the store kept its bytes (directory) or starts
again (S3).

How a pull stops decides what is left: a client's cancel or a failure removes every object; a
shutdown keeps them, and the row stays ``Pulling`` for the next start to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fleet_core.control_plane.registry.formats import FormatError
from fleet_core.control_plane.registry.hubclient import HubError, RemoteFile
from fleet_core.control_plane.registry.objects import ObjectStoreError, ObjectWriter
from fleet_core.control_plane.registry.store import ModelRecord, PlannedFile
from fleet_core.control_plane.registry.transfers import (
    Hashes,
    Mismatch,
    Stop,
    Transfer,
    TransferDeps,
)

__all__ = ["Pull"]

log = logging.getLogger("fleet.registry")


class Pull(Transfer):
    """The pull of one model, run as one task (``start``)."""

    def __init__(self, record: ModelRecord, repo: str, revision: str, deps: TransferDeps) -> None:
        super().__init__(record, deps)
        self.repo, self.revision = repo, revision
        self.task: asyncio.Task[None] | None = None

    def start(self, *, resume: bool) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run(resume=resume), name=f"pull {self.model_id}")
        return self.task

    async def halt(self, why: Stop) -> None:
        if self.task is None:
            return
        self.stop = why
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def run(self, *, resume: bool) -> None:
        try:
            await self._pull(resume=resume)
        except asyncio.CancelledError:
            if self.stop == "shutdown":
                await self._persist()
                raise
            await self._end("Cancelled", "cancelled by a client", None)
            raise
        except (HubError, ObjectStoreError, FormatError, Mismatch) as exc:
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
                await self._file_done(index, await self._fetch(planned, resume=resume))
        self.current = None
        facts = await self._verify()
        await self._end("Ready", "", facts)

    async def _fetch(self, planned: PlannedFile, *, resume: bool) -> str:
        """The file, stored; its sha256."""
        self.current = planned.path
        key = self.prefix + planned.path
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
        return digest

    async def _download(self, planned: PlannedFile, writer: ObjectWriter) -> str:
        hashes = Hashes(planned, self.promised_by)
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
            await self._store(body.chunks, writer, hashes, limit=planned.size)
        return hashes.check(planned)
