"""The client side of ``fleet models import``: hash local files, announce them, upload each.

Files are hashed before anything is sent, so the control plane can check every byte it stores
against the client's own sha256 (as a pull checks the hub's). A directory is walked for its
regular files (symlinks followed, as in a Hugging Face cache snapshot); anything whose path has a
segment starting with ``.`` (``.git``, ``.cache``) is left out. Both passes show a progress bar.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from fleet_core.cli.client import Api, ApiError

__all__ = ["LocalFile", "LocalFilesError", "default_id", "plan", "progress_columns", "run"]

_CHUNK = 1 << 20
_NOT_FOUND = 404


class LocalFilesError(Exception):
    """The path to import holds nothing that can be imported; ``str()`` says what."""


@dataclass(frozen=True)
class LocalFile:
    path: str
    """As the model will list it: relative to the directory, '/' between segments."""
    source: Path
    size: int
    sha256: str = ""


def default_id(path: Path) -> str:
    """The file or directory name, lowercased, without a weights suffix."""
    name = path.resolve().name.removesuffix(".gguf").removesuffix(".safetensors").lower()
    return re.sub(r"[^a-z0-9._-]+", "-", name).strip("-._")[:63] or "model"


def _files(path: Path) -> list[LocalFile]:
    if path.is_file():
        return [LocalFile(path.name, path, path.stat().st_size)]
    if not path.is_dir():
        raise LocalFilesError(f"{path} is neither a file nor a directory")
    found = [
        LocalFile(p.relative_to(path).as_posix(), p, p.stat().st_size)
        for p in sorted(path.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    ]
    if not found:
        raise LocalFilesError(f"{path} holds no files to import")
    return found


def progress_columns() -> tuple[Any, ...]:
    """The columns of every transfer bar: name, bar, bytes, speed, time left, current file."""
    return (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[file]}"),
    )


async def plan(path: Path, console: Console) -> list[LocalFile]:
    """Every file to import with its size and sha256, hashed with a progress bar."""
    files = await asyncio.to_thread(_files, path)
    with Progress(*progress_columns(), console=console) as bar:
        task = bar.add_task("hashing", total=sum(f.size for f in files), file="")

        def advance(name: str, n: int) -> None:
            bar.update(task, advance=n, file=name)

        return [
            LocalFile(f.path, f.source, f.size, await asyncio.to_thread(_sha256, f, advance))
            for f in files
        ]


def _sha256(file: LocalFile, advance: Callable[[str, int], None]) -> str:
    digest = hashlib.sha256()
    with file.source.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            advance(file.path, len(chunk))
    return digest.hexdigest()


async def run(
    api: Api, model_id: str, files: list[LocalFile], args: argparse.Namespace, console: Console
) -> dict[str, Any]:
    """Registers ``model_id`` if needed, announces the files, uploads each: the final progress."""
    existing = await _existing(api, model_id)
    if existing is None:
        body: dict[str, Any] = {"id": model_id, "source": {"local": {"origin": _origin(args)}}}
        if args.format:
            body["format"] = args.format
        await api.call("POST", "/api/v1/models", body)
    elif existing["status"] == "Ready" and _same(existing, files):
        console.print(f"{model_id} is already Ready with these files")
        return dict(existing)
    manifest = [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in files]
    last = await api.call("POST", f"/api/v1/models/{model_id}/import", {"files": manifest})
    with Progress(*progress_columns(), console=console) as bar:
        task = bar.add_task("uploading", total=sum(f.size for f in files), file="")
        for file in files:
            bar.update(task, file=file.path)
            body_chunks = _read(file, lambda n: bar.update(task, advance=n))
            where = f"/api/v1/models/{model_id}/import/{quote(file.path)}"
            last = await api.upload(where, body_chunks, file.size)
    return dict(last)


async def _existing(api: Api, model_id: str) -> dict[str, Any] | None:
    try:
        return dict(await api.call("GET", f"/api/v1/models/{model_id}"))
    except ApiError as exc:
        if exc.status == _NOT_FOUND:
            return None
        raise


def _origin(args: argparse.Namespace) -> str:
    return Path(args.path).resolve().name[:255]


def _same(model: dict[str, Any], files: list[LocalFile]) -> bool:
    stored = {(f["path"], f["size"], f["sha256"]) for f in model["facts"]["files"]}
    return stored == {(f.path, f.size, f.sha256) for f in files}


async def _read(file: LocalFile, advance: Callable[[int], None]) -> AsyncIterator[bytes]:
    with file.source.open("rb") as handle:
        while chunk := await asyncio.to_thread(handle.read, _CHUNK):
            advance(len(chunk))
            yield chunk
