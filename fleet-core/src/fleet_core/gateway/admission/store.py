"""Token buckets and budget books in Redis, shared by every gateway process.

Each reserve and each settle is one Lua script call (one round trip, atomic across all of a
request's buckets), timed by Redis's own clock; the scripts decide with the arithmetic of
`buckets`, which they mirror (as does `memory_store.MemoryStore`, the store of one process).
Budget books (one entry per gateway process per rule: `limits.Hold`) live beside the buckets and
grow in the same call, so every gateway sees every other's. `batching_store.BatchingStore` sits in
front to share one call among the reservations of one event-loop tick.

This is the only module that talks to Redis for admission, so it is where Redis's exceptions
become `StoreUnavailable`; what to do then (admit or refuse) is the policy's business, not ours.
"""

from __future__ import annotations

import importlib.resources
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, RedisError
from redis.retry import Retry
from redis.typing import EncodableT
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    import hiredis

from fleet_core.gateway.admission.limits import (
    ADMITTED,
    Charge,
    Decision,
    Hold,
    HoldUpdate,
    StoreUnavailable,
    hash_tag,
    merged_charges,
)

__all__ = [
    "Ask",
    "RedisStore",
    "epoch_key",
    "expiry_key",
    "open_redis_store",
    "script_source",
    "settled_key",
]

log = logging.getLogger("fleet.admission")

NEVER_MS = -1
"""The admit script's retry_ms for an amount that can never fit."""
HOLD_REFUSED = 2
"""The admit script's verdict when a budget hold does not fit."""
SETTLED_TTL_S = 600
"""How long settle.lua remembers a batch it applied: longer than `Admission` retries one."""
INCLUDE = "-- #include "
"""A Lua script's line naming a shared helper file to put in its place (`script_source`)."""
Ask = tuple[Sequence[Charge], Sequence[Hold]]
"""One reservation: its bucket charges and its budget asks (growths of its gateway's entries)."""


def expiry_key(book: str) -> str:
    """The sorted set of a hold book's expiries (same hash tag as the book)."""
    return f"{book}:expiry"


def epoch_key(key: str) -> str:
    """The state epoch of ``key``'s hash tag (lib_buckets.lua's ``epoch``; ADR 0023): the prefix
    up to and including the tag, then ``:epoch``, so it shares the tag's Cluster slot."""
    tag = hash_tag(key)
    return f"{key[: key.find(tag) + len(tag)]}:epoch"


def settled_key(bucket: str, batch_id: str) -> str:
    """settle.lua's marker that batch ``batch_id`` was applied (same hash tag as ``bucket``)."""
    return f"{bucket}:settled:{batch_id}"


class RedisStore:
    """Buckets in Redis, shared by every gateway process; one script call per reserve or settle.

    The client should fail fast and never retry (see `open_redis_store`): a retried script call
    could charge twice, and a request must not wait on a dead Redis.
    """

    def __init__(self, client: Redis) -> None:
        self._client = client
        self._epochs: dict[str, str] = {}
        """The state epoch last seen per hash tag's epoch key (`epoch_key`)."""
        self._lost: list[Callable[[], None]] = []
        # register_script gives EVALSHA, falling back to loading the script on NOSCRIPT.
        self._admit = client.register_script(script_source("admit.lua"))
        self._settle = client.register_script(script_source("settle.lua"))
        self._holds = client.register_script(script_source("holds.lua"))

    async def reserve(self, charges: Sequence[Charge], holds: Sequence[Hold] = ()) -> Decision:
        [decision] = await self.reserve_many([(charges, holds)])
        return decision

    async def reserve_many(self, reservations: Sequence[Ask]) -> list[Decision]:
        """Judge several reservations in order, in one script call (all keys of one tenant);
        each ask's ``granted`` is set from the reply."""
        merged = [(merged_charges(charges), holds) for charges, holds in reservations]
        sent = [(m, h) for m, h in merged if m or h]
        if not sent:
            return [ADMITTED for _ in merged]
        keys, args = _admit_call(sent)
        epoch = epoch_key(keys[0])
        args.insert(len(args) - 1, self._epochs.get(epoch, ""))
        answer = await self._run(self._admit, [*keys, epoch], args)
        self._saw(epoch, answer.pop())
        reply = iter(answer)
        with_asks = any(holds for _, holds in sent)
        decisions = []
        for m, holds in merged:
            if not (m or holds):
                decisions.append(ADMITTED)
                continue
            decisions.append(_decision([next(reply), next(reply), next(reply)], m))
            if with_asks:
                for ask in holds:
                    ask.granted = next(reply)
        return decisions

    async def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        """Apply ``updates`` once per batch id (each update's ``batch``; all of one call share
        one), one script call per hash tag, however often a batch is sent."""
        by_book: dict[str, list[HoldUpdate]] = {}
        for update in updates:
            by_book.setdefault(update.key, []).append(update)
        by_tag: dict[str, list[str]] = {}
        for book in by_book:
            by_tag.setdefault(hash_tag(book), []).append(book)
        fresh = uuid.uuid4().hex
        for books in by_tag.values():
            batch = by_book[books[0]][0].batch or fresh
            keys = [settled_key(books[0], batch)]
            args: list[int | str] = [SETTLED_TTL_S]
            for book in books:
                keys += (book, expiry_key(book))
                args.append(len(by_book[book]))
                args += [
                    v for u in by_book[book] for v in (u.owner, u.delta, u.keep, u.ttl_ms, u.grant)
                ]
            await self._run(self._holds, keys, args)

    def _saw(self, key: str, epoch: bytes | str) -> None:
        """Note the epoch a script answered with; a different one than before means the store
        lost this tag's state (restarted empty, flushed, failed over): tell `on_lost`."""
        seen = epoch.decode() if isinstance(epoch, bytes) else epoch
        if not seen:
            return  # a settlement batch applied before: it answers no epoch
        before = self._epochs.get(key)
        self._epochs[key] = seen
        if before is not None and before != seen:
            log.warning("the rate-limit store lost its state for %s: rebuilding", key)
            for callback in self._lost:
                callback()

    def on_lost(self, callback: Callable[[], None]) -> None:
        self._lost.append(callback)

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        """Apply ``charges`` (all under one hash tag) once per ``batch_id``, however often sent.

        A batch sent again under the same id (its reply was lost, so it may have run) is skipped
        by the script for `SETTLED_TTL_S`; without an id the batch gets a fresh one."""
        merged = [charge for charge in merged_charges(charges) if charge.amount != 0]
        if merged:
            marker = settled_key(merged[0].bucket.key, batch_id or uuid.uuid4().hex)
            epoch = epoch_key(marker)
            keys = [marker, *(charge.bucket.key for charge in merged), epoch]
            args: list[int | str] = [SETTLED_TTL_S]
            args += (v for c in merged for v in (c.bucket.capacity, c.amount))
            args.append(self._epochs.get(epoch, ""))
            self._saw(epoch, await self._run(self._settle, keys, args))

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except (RedisError, OSError):
            return False

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _run(self, script: AsyncScript, keys: list[str], args: Sequence[int | str]) -> Any:
        try:
            try:
                return await script(keys=keys, args=args)
            except RedisConnectionError:
                # A pooled socket to a server that went away (restarted, failed over): every
                # idle one is as stale, so drop them all and try once more on a new connection.
                # Each used to fail a request of its own (a restarted Redis answered 503 for
                # 20 s). Once more is safe: every settlement and entry update is applied once
                # per batch id, and a reservation made twice only holds more than it needs.
                await self._client.connection_pool.disconnect(inuse_connections=False)
                return await script(keys=keys, args=args)
        except (RedisError, OSError) as exc:  # OSError: a socket error redis-py did not wrap
            raise StoreUnavailable(f"rate-limit store: {exc}") from exc


async def open_redis_store(url: str, *, timeout_s: float = 0.5) -> RedisStore:
    """A `RedisStore` on a client that gives up after ``timeout_s`` and never retries.

    Connections open lazily, so a gateway starts even while Redis is down; each request then
    meets `StoreUnavailable` within ``timeout_s`` until Redis is back, when the pool reconnects.
    """
    client = Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        # No retries of any kind (redis-py's own default retries 10 times with backoff; a timed-out
        # script may have run, and running it again would charge twice). This also replaces the
        # deprecated retry_on_timeout=False.
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,  # the pool already drops connections the server has closed
    )
    if HIREDIS_AVAILABLE:
        pool = client.connection_pool
        pool.connection_class = type(
            f"CPacked{pool.connection_class.__name__}", (_CPacked, pool.connection_class), {}
        )
    return RedisStore(client)


class _CPacked:
    """Packs commands with hiredis, in C, before the connection class (plain, TLS or unix
    socket, whichever the URL chose) it is mixed into.

    redis-py's asyncio connections pack every command in Python (its synchronous ones use
    hiredis when installed); admission's script calls carry tens of arguments per request (the
    budget holds' ids, amounts and lifetimes), which packed in Python cost about 0.8 µs each,
    a tenth of what database mode adds per request. hiredis packs them 3x faster, into the
    same bytes (``tests/gateway/admission/test_stores.py``)."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        command = args[0]  # several words ("SCRIPT LOAD") are sent as several arguments
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes) and b" " in command:
            args = (*command.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]  # type: ignore[arg-type]  # its stub: a 1-tuple
        except TypeError as exc:  # as redis-py's own packers say it
            raise DataError(str(exc)) from exc


def _admit_call(sent: Sequence[Ask]) -> tuple[list[str], list[int | str]]:
    """admit.lua's keys and arguments for ``sent`` (see the script), in one pass."""
    buckets_at: dict[str, int] = {}
    books_at: dict[str, int] = {}
    capacities: list[int | str] = []
    rules: list[int | str] = []
    body: list[int | str] = [len(sent)]
    any_holds = any(holds for _, holds in sent)
    for charges, holds in sent:
        body.append(len(charges))
        for charge in charges:
            index = buckets_at.get(charge.bucket.key)
            if index is None:
                index = buckets_at[charge.bucket.key] = len(buckets_at) + 1
                capacities.append(charge.bucket.capacity)
            body += (index, charge.amount)
        if not any_holds:
            continue
        body.append(len(holds))
        for hold in holds:
            rule = books_at.get(hold.key)
            if rule is None:
                rule = books_at[hold.key] = len(books_at) + 1
                rules += (hold.limit, hold.base)
            body += (rule, hold.owner, hold.grant, hold.need, hold.extra, hold.keep, hold.ttl_ms)
    keys = list(buckets_at)
    for book in books_at:
        keys += (book, expiry_key(book))
    return keys, [*capacities, *rules, *body, len(books_at)]


def _decision(reply: list[int], charges: Sequence[Charge]) -> Decision:
    if reply[0] == 1:
        return ADMITTED
    if reply[0] == HOLD_REFUSED:
        return Decision(False, refused_hold=reply[1] - 1, excess=reply[2])
    _, index, retry_ms = reply
    retry_after = math.inf if retry_ms == NEVER_MS else retry_ms / 1000
    return Decision(False, charges[index - 1].bucket, retry_after)


def script_source(name: str) -> str:
    """Script ``name``'s text, each ``-- #include <file>`` line replaced by that file's text.

    A Redis script cannot include another, so the helpers two scripts share live once in a
    ``lib_*.lua`` file and are put in here (one level: a library includes nothing)."""
    folder = importlib.resources.files("fleet_core.gateway.admission").joinpath("lua")
    lines = folder.joinpath(name).read_text("utf-8").splitlines(keepends=True)
    return "".join(
        folder.joinpath(line.removeprefix(INCLUDE).strip()).read_text("utf-8")
        if line.startswith(INCLUDE)
        else line
        for line in lines
    )
