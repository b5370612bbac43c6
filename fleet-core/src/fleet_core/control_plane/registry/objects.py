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
import threading
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

        opening = _Opening(partial, append=resume)
        try:
            handle = await asyncio.to_thread(opening.open)
        except asyncio.CancelledError:
            opening.abandon()
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


class _Opening:
    """A file opened in a thread for a caller that may be cancelled meanwhile. The thread opens
    it whatever happens to the caller, and the loop may end before anything it schedules runs
    (the control plane stopping), so whichever of the two comes second closes the file: the
    thread, if the caller gave up before it opened; the caller, if the file opened before it
    gave up. Nothing is left to the garbage collector."""

    def __init__(self, path: Path, *, append: bool) -> None:
        self._path, self._append = path, append
        self._lock = threading.Lock()
        self._handle: BinaryIO | None = None
        self._abandoned = False

    def open(self) -> BinaryIO:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        handle = self._path.open("ab") if self._append else self._path.open("wb")
        with self._lock:
            if self._abandoned:
                handle.close()
            else:
                self._handle = handle
        return handle

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


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
