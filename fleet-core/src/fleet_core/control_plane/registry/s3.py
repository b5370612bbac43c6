"""The S3 object store, through the ``minio`` SDK: any S3-compatible endpoint.

The SDK blocks, so each call runs in a thread. An upload streams: the pull feeds chunks into a
bounded pipe and ``put_object`` (unknown length, fixed part size) reads parts from it in its thread,
so at most (parallel parts + 1) × part size bytes are in memory, whatever the file's size. An abort
makes the pipe raise inside the SDK, which aborts the multipart upload, so nothing is left behind.
Every SDK and transport exception is translated to ``ObjectStoreError`` here, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import BinaryIO, TypeVar, cast

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import MinioException, S3Error

from fleet_core.control_plane.registry.objects import ObjectStoreError, ObjectWriter

__all__ = ["S3Settings", "S3Store"]

T = TypeVar("T")
_EOF = b""
PRESIGN_REGION = "us-east-1"
"""The region presigned URLs are signed for; given, so that signing needs no request (S3-compatible
stores such as SeaweedFS and MinIO accept it)."""
_TRANSPORT_ERRORS = (MinioException, urllib3.exceptions.HTTPError, OSError, ValueError)


@dataclass(frozen=True)
class S3Settings:
    endpoint: str
    """host:port (FLEET_S3_ENDPOINT)."""
    bucket: str = "fleet-weights"
    """Created at start when missing (FLEET_S3_BUCKET)."""
    access_key: str = field(default="", repr=False)
    """FLEET_S3_ACCESS_KEY."""
    secret_key: str = field(default="", repr=False)
    """FLEET_S3_SECRET_KEY."""
    use_ssl: bool = True
    """FLEET_S3_USE_SSL (false for a local SeaweedFS or MinIO)."""
    part_size: int = 8 * 1024 * 1024
    """Multipart part size (≥ 5 MiB, the S3 minimum): the memory one part in flight costs."""
    parallel_parts: int = 2
    """Parts uploaded at once; memory is (this + 1) × part_size."""
    download_endpoint: str | None = None
    """host:port engine pods reach the store at (FLEET_S3_DOWNLOAD_ENDPOINT). When set, a model
    file's download is redirected to a presigned URL there instead of streaming through the
    control plane."""
    download_expiry: timedelta = timedelta(hours=1)
    """How long a presigned download URL stays valid."""


async def _call(function: Callable[[], T], what: str) -> T:
    try:
        return await asyncio.to_thread(function)
    except _TRANSPORT_ERRORS as exc:
        raise ObjectStoreError(f"object store: {what} failed: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, S3Error):
        return f"{exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


class S3Store:
    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self.bucket = settings.bucket
        self.description = f"s3 {settings.endpoint}/{settings.bucket}"
        # Our own pool (minio's defaults: 5 retries on 5xx, 5-minute timeouts), so that closing
        # the store closes its sockets instead of leaving them to the garbage collector.
        self._http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=300, read=300),
            maxsize=10,
            retries=urllib3.Retry(
                total=5, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]
            ),
        )
        self._client = Minio(
            settings.endpoint,
            access_key=settings.access_key or None,
            secret_key=settings.secret_key or None,
            secure=settings.use_ssl,
            http_client=self._http,
        )
        self._presigner = None
        if settings.download_endpoint is not None:
            self._presigner = Minio(
                settings.download_endpoint,
                access_key=settings.access_key or None,
                secret_key=settings.secret_key or None,
                secure=settings.use_ssl,
                region=PRESIGN_REGION,
            )

    def download_url(self, key: str) -> str | None:
        """A presigned GET for ``key`` on the download endpoint, or None without one. Signing is
        local (the region is given), so this makes no request."""
        if self._presigner is None:
            return None
        return self._presigner.presigned_get_object(
            self.bucket, key, expires=self.settings.download_expiry
        )

    def close(self) -> None:
        """Close every pooled connection (the store is not used afterwards)."""
        self._http.clear()

    async def ensure_bucket(self) -> None:
        def ensure() -> None:
            if not self._client.bucket_exists(self.bucket):
                self._client.make_bucket(self.bucket)

        await _call(ensure, f"creating bucket {self.bucket}")

    async def writer(self, key: str, *, resume: bool) -> ObjectWriter:
        return _UploadWriter(self, key)

    async def size(self, key: str) -> int | None:
        def stat() -> int | None:
            try:
                return self._client.stat_object(self.bucket, key).size
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchObject", "ResourceNotFound"):
                    return None
                raise

        return await _call(stat, f"stat {key}")

    async def read(self, key: str, offset: int, length: int) -> bytes:
        def read() -> bytes:
            response = self._client.get_object(self.bucket, key, offset=offset, length=length)
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

        return await _call(read, f"reading {key}")

    async def stream(
        self, key: str, start: int = 0, end: int | None = None
    ) -> AsyncIterator[bytes]:
        size = await self.size(key) or 0
        stop = size if end is None else min(size, end + 1)
        for offset in range(start, stop, 1 << 20):
            yield await self.read(key, offset, min(1 << 20, stop - offset))

    async def keys(self, prefix: str) -> list[str]:
        def names() -> list[str]:
            found = self._client.list_objects(self.bucket, prefix=prefix, recursive=True)
            return sorted(item.object_name or "" for item in found)

        return await _call(names, f"listing {prefix}")

    async def delete_prefix(self, prefix: str) -> None:
        keys = await self.keys(prefix)

        def delete() -> None:
            errors = self._client.remove_objects(self.bucket, [DeleteObject(k) for k in keys])
            for error in errors:  # lazy: consuming the iterator is what sends the request
                raise ObjectStoreError(f"object store: deleting {error.name}: {error.message}")

        if keys:
            await _call(delete, f"deleting {prefix}")

    async def remove(self, key: str) -> None:
        await _call(lambda: self._client.remove_object(self.bucket, key), f"deleting {key}")

    def put(self, key: str, pipe: _Pipe) -> None:
        """In a thread: the multipart upload, reading parts from ``pipe``."""
        self._client.put_object(
            self.bucket,
            key,
            cast(BinaryIO, pipe),  # the SDK only calls read()
            length=-1,
            part_size=self.settings.part_size,
            num_parallel_uploads=self.settings.parallel_parts,
        )


class _Aborted(Exception):
    """Raised inside the SDK's read so that it aborts the multipart upload."""


class _Pipe:
    """Chunks from the event loop to the SDK's thread; at most ``depth`` chunks waiting."""

    def __init__(self, loop: asyncio.AbstractEventLoop, depth: int = 4) -> None:
        self._loop = loop
        self._chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._room = asyncio.Semaphore(depth)
        self._rest = memoryview(b"")
        self._lock = threading.Lock()

    async def put(self, chunk: bytes) -> None:
        """``b""`` ends the upload."""
        await self._room.acquire()
        self._chunks.put(chunk)

    def abort(self) -> None:
        """Makes the SDK's next read raise (never waits for room: this runs while cancelling)."""
        self._chunks.put(None)

    def read(self, size: int = -1) -> bytes:
        with self._lock:
            if not self._rest:
                chunk = self._chunks.get()
                self._loop.call_soon_threadsafe(self._room.release)
                if chunk is None:
                    raise _Aborted("the pull stopped")
                self._rest = memoryview(chunk)
            size = len(self._rest) if size < 0 else size
            piece, self._rest = self._rest[:size], self._rest[size:]
            return bytes(piece)


class _UploadWriter:
    offset = 0  # a multipart upload cannot be resumed through the SDK: files start again

    def __init__(self, store: S3Store, key: str) -> None:
        self._store, self._key = store, key
        self._pipe = _Pipe(asyncio.get_running_loop())
        self._upload = asyncio.ensure_future(asyncio.to_thread(store.put, key, self._pipe))

    async def existing(self) -> AsyncIterator[bytes]:
        nothing: tuple[bytes, ...] = ()  # nothing kept: an async generator yielding nothing
        for chunk in nothing:
            yield chunk

    async def write(self, chunk: bytes) -> None:
        if self._upload.done():
            await self._finish()  # raises the upload's error
        await self._pipe.put(chunk)

    async def commit(self) -> None:
        await self._pipe.put(_EOF)
        await self._finish()

    async def _finish(self) -> None:
        try:
            await self._upload
        except _TRANSPORT_ERRORS as exc:
            raise ObjectStoreError(f"object store: uploading {self._key}: {_reason(exc)}") from exc

    async def abort(self) -> None:
        if not self._upload.done():
            self._pipe.abort()
        with contextlib.suppress(Exception):
            await self._upload
        with contextlib.suppress(ObjectStoreError):
            await self._store.remove(self._key)

    async def suspend(self) -> None:
        await self.abort()
