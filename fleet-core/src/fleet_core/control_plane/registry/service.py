"""The model registry: models, their pulls and what the gateway and operator need from them.

One ``RegistryService`` per control plane, opened with the resources (``RegistryService.running``):
it owns the pulls as asyncio tasks (at most one per model), resumes at start the pulls a restart
interrupted, and cancels and awaits them on shutdown. One control-plane replica should pull: a
second would resume the first one's pulls after its own restart.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from psycopg_pool import AsyncConnectionPool

from fleet_contract import ModelWeights, WeightFile
from fleet_core.control_plane.inventory.store import InventoryStore
from fleet_core.control_plane.rates import wire as rates_wire
from fleet_core.control_plane.registry import verifying
from fleet_core.control_plane.registry.formats import FormatError
from fleet_core.control_plane.registry.hubclient import HubClient
from fleet_core.control_plane.registry.importing import Import, UploadInterrupted
from fleet_core.control_plane.registry.objects import DirectoryStore, ObjectStore, ObjectStoreError
from fleet_core.control_plane.registry.pulling import Pull
from fleet_core.control_plane.registry.s3 import S3Store
from fleet_core.control_plane.registry.settings import RegistrySettings
from fleet_core.control_plane.registry.store import ModelRecord, ModelStore, PlannedFile
from fleet_core.control_plane.registry.transfers import (
    Mismatch,
    Stop,
    Transfer,
    TransferDeps,
    object_prefix,
    progress_of,
)
from fleet_core.control_plane.registry.wire import (
    EngineFit,
    ImportPlan,
    Model,
    ModelCreate,
    ModelPatch,
    PullProgress,
    Source,
)
from fleet_core.shared import paging
from fleet_core.shared.errors import Conflict, InvalidRequest, NotFound, Unavailable

__all__ = ["RegistryService", "StoredFile", "hub_location", "open_object_store"]

log = logging.getLogger("fleet.registry")

_HF_URI = re.compile(
    r"^hf://(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?)"
    r"(@(?P<revision>[A-Za-z0-9][A-Za-z0-9._/-]*))?$"
)


def _one_source(source: Source) -> None:
    given = [x for x in (source.huggingface, source.uri, source.local) if x is not None]
    if len(given) != 1:
        raise InvalidRequest(
            "give exactly one of source.huggingface, source.uri or source.local", param="source"
        )


def hub_location(source: Source) -> tuple[str, str]:
    """(repo, revision) on the hub; InvalidRequest naming the field when there is none."""
    _one_source(source)
    if source.local is not None:
        raise InvalidRequest(
            "a model with source.local is imported (POST /api/v1/models/{id}/import), not pulled",
            param="source",
        )
    if source.huggingface is not None:
        return source.huggingface.repo, source.huggingface.revision
    match = _HF_URI.match(source.uri or "")
    if match is None:
        raise InvalidRequest(
            "source.uri must be hf://owner/name[@revision] (the only scheme supported)",
            param="source.uri",
        )
    return match["repo"], match["revision"] or "main"


def _origin_name(source: Source) -> str:
    """The repository, or for an import the file or directory name without its suffix."""
    _one_source(source)
    if source.local is None:
        return hub_location(source)[0]
    return source.local.origin.removesuffix(".gguf").removesuffix(".safetensors")


def _default_id(repo: str) -> str:
    name = re.sub(r"[^a-z0-9._-]+", "-", repo.rsplit("/", 1)[-1].lower()).strip("-._")
    if not name:
        raise InvalidRequest("cannot derive an id from the repository; give one", param="id")
    return name[:63]


def _model(record: ModelRecord) -> Model:
    return Model(
        id=record.id,
        source=record.source,
        format=record.format,
        status=record.status,
        reason=record.reason,
        revision=record.revision,
        facts=record.facts if record.status == "Ready" else None,
        rates=record.rates,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


@dataclass(frozen=True)
class StoredFile:
    """One of a Ready model's files, as its facts list it, and where its bytes are stored.

    Nothing is read until :meth:`body` is iterated: a HEAD answers from ``file`` alone.
    """

    file: WeightFile
    objects: ObjectStore
    key: str

    def direct_url(self) -> str | None:
        """Where pods can fetch the file from the store itself (a presigned S3 URL), if anywhere."""
        return self.objects.download_url(self.key)

    def body(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """The bytes from ``start`` up to and including ``end`` (default: to the end)."""
        return self.objects.stream(self.key, start, end)


@contextlib.asynccontextmanager
async def open_object_store(settings: RegistrySettings) -> AsyncIterator[ObjectStore]:
    if settings.s3 is None:
        yield DirectoryStore(Path(settings.models_dir))
        return
    store = S3Store(settings.s3)
    try:
        await store.ensure_bucket()
        yield store
    finally:
        store.close()


class RegistryService:
    def __init__(
        self,
        store: ModelStore,
        objects: ObjectStore,
        hub: HubClient,
        inventory: InventoryStore,
        *,
        settings: RegistrySettings,
    ) -> None:
        self.store, self.objects, self.inventory = store, objects, inventory
        self._deps = TransferDeps(
            store, objects, hub,
            persist_every_s=settings.persist_every_s, stall_timeout_s=settings.stall_timeout_s,
        )  # fmt: skip
        self._settings = settings
        self._transfers: dict[str, Transfer] = {}
        """The pull or import running for a model: at most one each."""

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, pool: AsyncConnectionPool, inventory: InventoryStore, settings: RegistrySettings
    ) -> AsyncIterator[RegistryService]:
        async with (
            open_object_store(settings) as objects,
            aiohttp.ClientSession(auto_decompress=False) as session,
        ):
            hub = HubClient(
                session,
                settings.hub_url,
                token=settings.hf_token,
                stall_timeout_s=settings.stall_timeout_s,
                chunk_size=settings.chunk_size,
            )
            service = cls(ModelStore(pool), objects, hub, inventory, settings=settings)
            await service.recover()
            try:
                yield service
            finally:
                await service.shutdown()

    # --- models ------------------------------------------------------------------------------
    async def register(self, new: ModelCreate) -> Model:
        model_id = new.id or _default_id(_origin_name(new.source))
        record = await self.store.insert(model_id, new.source, new.format)
        if record is None:
            raise Conflict(f"model {model_id!r} already exists", param="id")
        return _model(record)

    async def list_models(self, page: paging.Page) -> paging.Listing[Model]:
        rows = [_model(r) for r in await self.store.page(page)]
        return paging.listing(rows, page, lambda m: (m.created_at, m.id))

    async def get(self, model_id: str) -> Model:
        return _model(await self._record(model_id))

    async def patch(self, model_id: str, patch: ModelPatch) -> Model:
        await self._record(model_id)
        if patch.rates is not None:
            await self.store.upsert_rates(
                model_id, rates_wire.stored_rates(patch.rates, at="rates.")
            )
        return await self.get(model_id)

    async def delete(self, model_id: str) -> Model:
        model = await self.get(model_id)
        users = await self._users(model_id)
        if users:
            raise Conflict(
                f"model {model_id!r} is used by FleetModel(s) {', '.join(users)}; "
                "delete those first",
                code="model_in_use",
            )
        await self._stop(model_id, "cancel")
        await self.objects.delete_prefix(object_prefix(model_id))
        await self.store.delete(model_id)
        return model

    async def _users(self, model_id: str) -> list[str]:
        reports = await self.inventory.latest()
        return sorted(
            f"{r.cluster_id}/{d.namespace}/{d.name}"
            for r in reports
            for d in r.deployments
            if model_id in (d.registry_model, d.served_model_name, d.name)
        )

    async def fit(self, model_id: str, engine: str) -> EngineFit:
        if engine not in verifying.ENGINE_FORMATS:
            raise InvalidRequest(
                f"engine must be one of {', '.join(sorted(verifying.ENGINE_FORMATS))}",
                param="engine",
            )
        record = await self._record(model_id)
        if record.status != "Ready" or record.facts is None:
            raise Conflict(f"model {model_id!r} is {record.status}, not Ready", code="not_ready")
        reason = verifying.engine_fit(engine, record.facts.format, model=f"model {model_id!r}")
        if reason is not None:
            raise Conflict(reason, param="engine", code="engine_mismatch")
        return EngineFit(
            model=model_id,
            engine="vllm" if engine == "vllm" else "llamacpp",
            format=record.facts.format,
            fits=True,
            reason=f"{engine} loads {record.facts.format} weights",
        )

    async def tokenizer(self, model_id: str) -> AsyncIterator[bytes]:
        record = await self._record(model_id)
        if record.status != "Ready" or record.facts is None or not record.facts.tokenizer:
            raise NotFound(
                f"model {model_id!r} has no tokenizer.json"
                + ("" if record.status == "Ready" else f" yet (it is {record.status})"),
                code="tokenizer_not_found",
            )
        return self.objects.stream(object_prefix(model_id) + "tokenizer.json")

    async def weights(self, model_id: str) -> ModelWeights:
        """The contract's view of a model for the operator: its state, and its files once Ready."""
        record = await self._record(model_id)
        facts = record.facts if record.status == "Ready" else None
        return ModelWeights(
            model_id=record.id,
            status=record.status,
            reason=record.reason or None,
            format=facts.format if facts else record.format,
            files=facts.files if facts else (),
        )

    async def file(self, model_id: str, name: str) -> StoredFile:
        """A file named in the Ready model's ``facts.files``; only those names reach the store,
        so no name (``../other/tokenizer.json``) can read an object outside the model."""
        record = await self._record(model_id)
        if record.status != "Ready" or record.facts is None:
            raise Conflict(
                f"model {model_id!r} is {record.status}; its files are served once it is Ready",
                code="model_not_ready",
            )
        listed = next((f for f in record.facts.files if f.path == name), None)
        if listed is None:
            raise NotFound(
                f"model {model_id!r} has no file {name!r}; GET /api/v1/models/{model_id} lists "
                "its files (facts.files)",
                param="name",
                code="file_not_found",
            )
        return StoredFile(listed, self.objects, object_prefix(model_id) + listed.path)

    # --- pulls and imports --------------------------------------------------------------------
    async def start_pull(self, model_id: str) -> PullProgress:
        """Starts a pull, or reports the one running (or the Ready model): idempotent."""
        if model_id in self._transfers:
            return self._transfers[model_id].snapshot()
        record = await self._record(model_id)
        if record.source.local is not None and record.status != "Ready":
            raise Conflict(
                f"model {model_id!r} holds imported files ({record.source.local.origin}); "
                "there is nothing to pull: import them again (fleet models import)",
                code="imported_model",
            )
        if await self.store.claim_pull(model_id):
            self._start(await self._record(model_id), resume=False)
        return await self.progress(model_id)  # ours, or the one a concurrent request started

    def _start(self, record: ModelRecord, *, resume: bool) -> None:
        repo, revision = hub_location(record.source)
        pull = Pull(record, repo, revision, self._deps)
        self._transfers[record.id] = pull
        pull.start(resume=resume).add_done_callback(lambda _: self._forget(pull))

    def _forget(self, transfer: Transfer) -> None:
        if self._transfers.get(transfer.model_id) is transfer:
            del self._transfers[transfer.model_id]

    async def start_import(self, model_id: str, plan: ImportPlan) -> PullProgress:
        """Claims the model for the planned files; each then arrives with ``receive``."""
        record = await self._record(model_id)
        if record.source.local is None:
            raise Conflict(
                f"model {model_id!r} is pulled from its hub; register a model with "
                "source.local to import files",
                code="not_an_import",
            )
        paths = [f.path for f in plan.files]
        if len(set(paths)) != len(paths):
            raise InvalidRequest("the plan names a file twice", param="files")
        if model_id in self._transfers or not await self.store.claim_pull(model_id):
            raise Conflict(
                f"model {model_id!r} is {record.status}: delete it to import other files"
                if record.status == "Ready"
                else f"model {model_id!r} is being imported already",
                code="model_busy",
            )
        files = tuple(PlannedFile(path=f.path, size=f.size, sha256=f.sha256) for f in plan.files)
        await self.store.save_progress(model_id, revision=None, files=files, bytes_done=0)
        started = Import(await self._record(model_id), self._deps)
        self._transfers[model_id] = started
        return started.snapshot()

    async def receive(self, model_id: str, name: str, chunks: AsyncIterator[bytes]) -> PullProgress:
        """One planned file of the import running for ``model_id``, stored from ``chunks``."""
        running = self._transfers.get(model_id)
        if not isinstance(running, Import):
            record = await self._record(model_id)
            raise Conflict(
                f"model {model_id!r} has no import running (it is {record.status}); start one "
                f"with POST /api/v1/models/{model_id}/import",
                code="no_import",
            )
        try:
            return await running.receive(name, chunks)
        except (Mismatch, UploadInterrupted, FormatError) as exc:
            raise InvalidRequest(str(exc), param="name", code="import_failed") from exc
        except ObjectStoreError as exc:
            raise Unavailable(str(exc), code="object_store_unavailable") from exc
        finally:
            if running.status != "Pulling":
                self._forget(running)

    async def progress(self, model_id: str) -> PullProgress:
        if model_id in self._transfers:
            return self._transfers[model_id].snapshot()
        return progress_of(await self._record(model_id))

    async def events(self, model_id: str) -> AsyncIterator[PullProgress]:
        """Checked now (404 before the stream starts); then snapshots until the transfer ends."""
        running = self._transfers.get(model_id)
        if running is not None:
            return running.changes()
        return _once(await self.progress(model_id))  # read after: one that just ended is final

    async def cancel(self, model_id: str) -> PullProgress:
        await self._record(model_id)
        await self._stop(model_id, "cancel")
        return progress_of(await self._record(model_id))

    async def _stop(self, model_id: str, why: Stop) -> None:
        running = self._transfers.get(model_id)
        if running is None:
            return
        await running.halt(why)
        self._forget(running)
        if why == "cancel" and running.status == "Pulling":  # cancelled before it ever ran
            await self.objects.delete_prefix(object_prefix(model_id))
            await self.store.finish(
                model_id, "Cancelled", reason="cancelled by a client", facts=None
            )

    async def recover(self) -> None:
        """Transfers a restart interrupted: pulls resumed (or Failed), imports Failed."""
        for record in await self.store.pulling():
            if record.source.local is None and self._settings.resume_on_start:
                log.info("resuming the pull of %s", record.id)
                self._start(record, resume=True)
                continue
            reason = (
                "interrupted by a control-plane restart; import the files again"
                if record.source.local is not None
                else "interrupted by a control-plane restart (resume is off); pull again"
            )
            await self.objects.delete_prefix(object_prefix(record.id))
            await self.store.finish(record.id, "Failed", reason=reason, facts=None)

    async def shutdown(self) -> None:
        for model_id in list(self._transfers):
            await self._stop(model_id, "shutdown")

    async def _record(self, model_id: str) -> ModelRecord:
        record = await self.store.get(model_id)
        if record is None:
            raise NotFound(f"no model {model_id!r}", param="id", code="model_not_found")
        return record


async def _once(progress: PullProgress) -> AsyncIterator[PullProgress]:
    yield progress
