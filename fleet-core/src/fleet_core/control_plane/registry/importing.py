"""An import: a client's own files (``fleet models import``) → sha256 → object store → Ready.

For air-gapped clusters: no hub is asked for anything. The client hashes its files, announces
them (path, size, sha256: the plan), then uploads each in one streamed request; the bytes are
hashed and written as they arrive, as a pull's are, through the control plane, because the client
may not reach (or hold credentials for) the store. The last file's arrival parses the whole set,
as a pull's end does, and the model is Ready or Failed in that request's answer. Any failure ends
the import (Failed, every object removed); the client imports again.

Each upload runs in a task of its own so that a cancel (or a shutdown) can stop it mid-file. An
import cannot outlive its process: a restart finds it ``Pulling`` with no client left, and marks
it Failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fleet_core.control_plane.registry.formats import FormatError
from fleet_core.control_plane.registry.objects import ObjectStoreError
from fleet_core.control_plane.registry.transfers import Hashes, Mismatch, Stop, Transfer
from fleet_core.control_plane.registry.wire import PullProgress
from fleet_core.shared.errors import Conflict, NotFound

__all__ = ["Import", "UploadInterrupted"]

log = logging.getLogger("fleet.registry")
SHUTDOWN_REASON = "the control plane stopped during the import; import the files again"


class UploadInterrupted(Exception):
    """The client stopped sending a file before its last byte (disconnected, or went silent)."""


class Import(Transfer):
    promised_by = "the import's plan"

    task: asyncio.Task[None] | None = None

    async def halt(self, why: Stop) -> None:
        self.stop = why
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.status == "Pulling":
            if why == "cancel":
                await self._end("Cancelled", "cancelled by a client", None)
            else:
                await self._end("Failed", SHUTDOWN_REASON, None)

    async def receive(self, name: str, chunks: AsyncIterator[bytes]) -> PullProgress:
        """Stores the planned file ``name`` from ``chunks``; the progress after it (Ready or
        Failed after the last file). Mismatch, UploadInterrupted, FormatError or
        ObjectStoreError when the import failed on it; Conflict when it was cancelled."""
        if self.task is not None:
            raise Conflict(
                f"another file of {self.model_id!r} is being uploaded; send one at a time",
                code="import_busy",
            )
        index = self._index(name)
        task = self.task = asyncio.create_task(self._receive(index, chunks))
        try:
            await asyncio.wait({task})
        finally:
            self.task = None
            if not task.done():  # the request itself was cancelled
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():
            raise Conflict(
                f"the import of {self.model_id!r} was stopped (cancelled, or the control plane "
                "is stopping)",
                code="import_stopped",
            )
        task.result()
        return self.snapshot()

    def _index(self, name: str) -> int:
        index = next((i for i, f in enumerate(self.files) if f.path == name), None)
        if index is None:
            raise NotFound(
                f"{name!r} is not in the import plan of {self.model_id!r}",
                param="name",
                code="file_not_found",
            )
        if self.files[index].done:
            raise Conflict(f"{name!r} is already stored", param="name", code="file_stored")
        return index

    async def _receive(self, index: int, chunks: AsyncIterator[bytes]) -> None:
        try:
            await self._file_done(index, await self._upload(index, chunks))
            if all(f.done for f in self.files):
                self.current = None
                await self._end("Ready", "", await self._verify())
        except (Mismatch, UploadInterrupted, FormatError, ObjectStoreError) as exc:
            await self._end("Failed", str(exc), None)
            raise
        except Exception as exc:  # a bug must still leave the model Failed, not stuck
            log.exception("import of %s crashed", self.model_id)
            await self._end("Failed", f"internal error: {type(exc).__name__}", None)
            raise

    async def _upload(self, index: int, chunks: AsyncIterator[bytes]) -> str:
        planned = self.files[index]
        self.current, self._partial = planned.path, 0
        writer = await self._deps.objects.writer(self.prefix + planned.path, resume=False)
        try:
            hashes = Hashes(planned, self.promised_by)
            patient = _patient(chunks, self._deps.stall_timeout_s)
            await self._store(patient, writer, hashes, limit=planned.size)
            if self._partial != planned.size:
                raise Mismatch(
                    f"{planned.path}: {self._partial} bytes arrived; the plan says {planned.size}"
                )
            digest = hashes.check(planned)
            await writer.commit()
        except UploadInterrupted as exc:
            await writer.abort()
            raise UploadInterrupted(
                f"the upload of {planned.path} stopped after {self._partial} of "
                f"{planned.size} bytes: {exc}"
            ) from exc
        except BaseException:
            await writer.abort()
            raise
        return digest


async def _patient(chunks: AsyncIterator[bytes], stall_s: float) -> AsyncIterator[bytes]:
    """``chunks``, or UploadInterrupted once the client sends nothing for ``stall_s``."""
    iterator = aiter(chunks)
    while True:
        try:
            chunk = await asyncio.wait_for(anext(iterator), stall_s)
        except StopAsyncIteration:
            return
        except TimeoutError as exc:
            raise UploadInterrupted(f"the client sent nothing for {stall_s:g} s") from exc
        yield chunk
