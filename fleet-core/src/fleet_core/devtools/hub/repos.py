"""The synthetic hub's repositories: what each serves, and how each misbehaves.

A file's content is either bytes (small files) or a generated size (large ones, streamed from a
repeated pattern so a 1 GiB file costs no memory). Misbehaviour is per file: ``break_at`` closes the
connection after that many bytes, ``stall_at`` stops sending and holds the connection open,
``bytes_per_s`` throttles, ``declared_sha256`` lies about the content's hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from fleet_core.devtools.hub import files

__all__ = ["HubFile", "Repo", "default_repos", "generated_repo", "large_safetensors"]


@dataclass(frozen=True)
class HubFile:
    name: str
    content: bytes = b""
    generated_size: int | None = None
    """Set for a large generated file: its size, ``content`` first and a repeated pattern after."""
    lfs: bool = True
    break_at: int | None = None
    stall_at: int | None = None
    bytes_per_s: int | None = None
    declared_sha256: str | None = None

    @property
    def size(self) -> int:
        return self.generated_size if self.generated_size is not None else len(self.content)

    def chunks(self, start: int = 0, *, block: int = 1 << 16) -> Iterator[bytes]:
        """The bytes from ``start`` on, in pieces of at most ``block``."""
        if self.generated_size is None:
            for at in range(start, len(self.content), block):
                yield self.content[at : at + block]
            return
        position = 0
        for piece in self._generated(block):
            end = position + len(piece)
            if end > start:
                yield piece[max(0, start - position) :]
            position = end

    def _generated(self, block: int) -> Iterator[bytes]:
        assert self.generated_size is not None
        for at in range(0, len(self.content), block):
            yield self.content[at : at + block]
        yield from files.tiled(self.generated_size - len(self.content), block=block)

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for piece in self.chunks(block=1 << 20):
            digest.update(piece)
        return digest.hexdigest()

    def git_blob_id(self) -> str:
        """The git blob sha1 the hub reports for a non-LFS file."""
        digest = hashlib.sha1(f"blob {self.size}\0".encode())
        for piece in self.chunks(block=1 << 20):
            digest.update(piece)
        return digest.hexdigest()


@dataclass(frozen=True)
class Repo:
    id: str
    files: tuple[HubFile, ...] = field(default_factory=tuple)

    def commit(self) -> str:
        """A stable 40-hex commit id derived from the repository's file names and sizes."""
        digest = hashlib.sha1(self.id.encode())
        for item in self.files:
            digest.update(f"{item.name}:{item.size}:{item.declared_sha256}".encode())
        return digest.hexdigest()

    def file(self, name: str) -> HubFile | None:
        return next((item for item in self.files if item.name == name), None)


def _safetensors_repo(repo_id: str, *, weights: HubFile | None = None) -> Repo:
    tensors = [
        ("model.embed_tokens.weight", "F32", (len(files.WORDS), 16)),
        ("model.layers.0.self_attn.q_proj.weight", "BF16", (16, 16)),
        ("lm_head.weight", "F32", (len(files.WORDS), 16)),
    ]
    weights = weights or HubFile("model.safetensors", files.safetensors_bytes(tensors))
    return Repo(
        repo_id,
        (
            HubFile("config.json", files.config_json(), lfs=False),
            HubFile("tokenizer.json", files.tokenizer_json(), lfs=False),
            weights,
        ),
    )


def _tiny_weights() -> bytes:
    return files.safetensors_bytes(
        [
            ("model.embed_tokens.weight", "F32", (len(files.WORDS), 16)),
            ("lm_head.weight", "F32", (len(files.WORDS), 16)),
        ]
    )


def default_repos(*, slow_bytes_per_s: int = 256 * 1024) -> dict[str, Repo]:
    """The three repositories of the dev hub plus the slow one, and the failure cases tests use."""
    weights = _tiny_weights()
    truncated = weights[: len(weights) - 100]
    repos = [
        _safetensors_repo("fleet/tiny-safetensors"),
        Repo(
            "fleet/tiny-gguf",
            (
                HubFile("README.md", b"# tiny gguf\n", lfs=False),
                HubFile("tiny-q8_0.gguf", files.gguf_bytes()),
            ),
        ),
        _safetensors_repo(
            "fleet/fails-mid-pull",
            weights=HubFile("model.safetensors", weights, break_at=len(weights) // 2),
        ),
        _safetensors_repo("fleet/slow", weights=large_safetensors(4 << 20, slow_bytes_per_s)),
        _safetensors_repo(
            "fleet/sha-mismatch",
            weights=HubFile("model.safetensors", weights, declared_sha256="0" * 64),
        ),
        _safetensors_repo("fleet/truncated", weights=HubFile("model.safetensors", truncated)),
        _safetensors_repo(
            "fleet/stalls",
            weights=HubFile("model.safetensors", weights, stall_at=len(weights) // 3),
        ),
        Repo("fleet/gguf-named-safetensors", (HubFile("model.safetensors", files.gguf_bytes()),)),
    ]
    return {repo.id: repo for repo in repos}


def large_safetensors(size: int, bytes_per_s: int | None = None) -> HubFile:
    """``model.safetensors`` of about ``size`` bytes: one F32 tensor, its data generated."""
    head, data = files.safetensors_head([("model.embed_tokens.weight", "F32", (size // 4,))])
    return HubFile(
        "model.safetensors", head, generated_size=len(head) + data, bytes_per_s=bytes_per_s
    )


def generated_repo(repo_id: str, size: int, *, bytes_per_s: int | None = None) -> Repo:
    """A safetensors repository whose weights are ``size`` generated bytes (benchmarks, resume)."""
    return _safetensors_repo(repo_id, weights=large_safetensors(size, bytes_per_s))
