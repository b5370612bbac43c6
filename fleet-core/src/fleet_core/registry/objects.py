"""Where pulled weights are kept: the ``ObjectStore`` interface and its directory implementation.

A pull writes each file through an ``ObjectWriter``: bytes go in as they arrive, and the object
appears under its key only at ``commit()``; ``abort()`` leaves nothing behind. The directory store
keeps an unfinished file under ``.partial/`` so a pull interrupted by a restart can resume where it
stopped (``offset``); the S3 store (``registry.s3``) cannot resume a multipart upload through the
SDK and starts the file again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO, Protocol

__all__ = ["DirectoryStore", "ObjectStore", "ObjectStoreError", "ObjectWriter"]

PARTIAL = ".partial"


class ObjectStoreError(Exception):
    """The store refused or failed an operation; ``str()`` is the reason shown on the model."""


class ObjectWriter(Protocol):
    offset: int
    """Bytes already stored by an earlier, interrupted attempt (the download resumes there)."""

    def existing(self) -> AsyncIterator[bytes]:
        """Those ``offset`` bytes, to hash before appending to them."""
        ...

    async def write(self, chunk: bytes) -> None: ...

    async def commit(self) -> None: ...

    async def abort(self) -> None:
        """Drop what was written; no object and no partial upload remain."""
        ...

    async def suspend(self) -> None:
        """Stop without committing, keeping what can be resumed (a shutdown, not a cancel)."""
        ...


class ObjectStore(Protocol):
    description: str

    async def writer(self, key: str, *, resume: bool) -> ObjectWriter: ...

    async def size(self, key: str) -> int | None: ...

    async def read(self, key: str, offset: int, length: int) -> bytes: ...

    def stream(self, key: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """The bytes of ``key`` from ``start`` up to and including ``end`` (default: the last)."""
        ...

    def download_url(self, key: str) -> str | None:
        """A URL engine pods can fetch ``key`` from directly, or None to stream it through us."""
        ...

    async def keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, unfinished files included (tests: "nothing left")."""
        ...

    async def delete_prefix(self, prefix: str) -> None: ...


class DirectoryStore:
    """Objects as files under ``root``; keys are relative paths."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.description = f"directory {root}"

    def _path(self, key: str, *, partial: bool = False) -> Path:
        path = (self.root / PARTIAL / key) if partial else (self.root / key)
        if ".." in Path(key).parts:
            raise ValueError(f"object key {key!r} leaves the store")
        return path

    async def writer(self, key: str, *, resume: bool) -> ObjectWriter:
        partial = self._path(key, partial=True)
        final = self._path(key)

        def open_file() -> BinaryIO:
            partial.parent.mkdir(parents=True, exist_ok=True)
            return partial.open("ab" if resume else "wb")

        opening = asyncio.ensure_future(asyncio.to_thread(open_file))
        try:
            handle = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The thread opens the file whatever happens to us: close it once it has, rather
            # than leave an open handle to the garbage collector.
            opening.add_done_callback(_close_opened)
            raise
        return _FileWriter(handle, partial, final)

    async def size(self, key: str) -> int | None:
        with contextlib.suppress(FileNotFoundError):
            return (await asyncio.to_thread(self._path(key).stat)).st_size
        return None

    async def read(self, key: str, offset: int, length: int) -> bytes:
        def read() -> bytes:
            with self._path(key).open("rb") as handle:
                handle.seek(offset)
                return handle.read(length)

        return await asyncio.to_thread(read)

    async def stream(
        self, key: str, start: int = 0, end: int | None = None
    ) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(self._path(key).open, "rb")
        try:
            handle.seek(start)
            left = float("inf") if end is None else end + 1 - start
            while left > 0 and (
                chunk := await asyncio.to_thread(handle.read, int(min(1 << 20, left)))
            ):
                left -= len(chunk)
                yield chunk
        finally:
            handle.close()

    def download_url(self, key: str) -> str | None:
        return None  # a directory is reached only through the control plane

    async def keys(self, prefix: str) -> list[str]:
        def walk() -> list[str]:
            found = []
            for base in (self.root / prefix, self.root / PARTIAL / prefix):
                if base.is_dir():
                    found += [str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file()]
            return sorted(found)

        return await asyncio.to_thread(walk)

    async def delete_prefix(self, prefix: str) -> None:
        for base in (self._path(prefix), self._path(prefix, partial=True)):
            await asyncio.to_thread(shutil.rmtree, base, True)


def _close_opened(opening: asyncio.Future[BinaryIO]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


class _FileWriter:
    def __init__(self, handle: BinaryIO, partial: Path, final: Path) -> None:
        self._handle, self._partial, self._final = handle, partial, final
        self.offset = handle.tell()

    async def existing(self) -> AsyncIterator[bytes]:
        with self._partial.open("rb") as handle:
            remaining = self.offset
            while remaining and (
                chunk := await asyncio.to_thread(handle.read, min(remaining, 1 << 20))
            ):
                remaining -= len(chunk)
                yield chunk

    async def write(self, chunk: bytes) -> None:
        await asyncio.to_thread(self._handle.write, chunk)

    async def commit(self) -> None:
        def finish() -> None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            self._final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._partial, self._final)

        await asyncio.to_thread(finish)

    async def abort(self) -> None:
        def drop() -> None:
            self._handle.close()
            self._partial.unlink(missing_ok=True)

        await asyncio.to_thread(drop)

    async def suspend(self) -> None:
        """Keep the partial file for a resume (shutdown, not cancel)."""
        await asyncio.to_thread(self._handle.close)
