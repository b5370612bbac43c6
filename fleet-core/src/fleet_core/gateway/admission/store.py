"""The two places token buckets can live, behind one `LimitStore` interface.

`MemoryStore` keeps buckets in this process: one gateway process, development, tests. `RedisStore`
keeps them in Redis, so that every gateway process draws on the same buckets; each reserve and each
settle is one Lua script call (one round trip, atomic across all of a request's buckets), timed by
Redis's own clock. Both decide with the same arithmetic (`buckets`, which the scripts mirror).
Budget books (one entry per gateway process per rule: `limits.Hold`) live beside the buckets in
the same store and grow in the same call, so in Redis every gateway sees every other's.

This is the only module that talks to Redis for admission, so it is where Redis's exceptions
become `StoreUnavailable`; what to do then (admit or refuse) is the policy's business, not ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import math
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import DataError, RedisError
from redis.retry import Retry
from redis.typing import EncodableT
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    import hiredis

from fleet_core.gateway.admission import buckets
from fleet_core.gateway.admission.limits import (
    Charge,
    Decision,
    Hold,
    HoldUpdate,
    StoreUnavailable,
    hash_tag,
)

__all__ = [
    "BatchingStore",
    "MemoryStore",
    "RedisStore",
    "expiry_key",
    "open_redis_store",
    "script_source",
    "settled_key",
]

SWEEP_INTERVAL_S = 60.0
"""How often `MemoryStore` forgets expired buckets (a scan of all of them)."""
ADMITTED = Decision(True)
"""Every admission's decision, made once (it is frozen)."""
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


def settled_key(bucket: str, batch_id: str) -> str:
    """settle.lua's marker that batch ``batch_id`` was applied (same hash tag as ``bucket``)."""
    return f"{bucket}:settled:{batch_id}"


SLACK_SHARE = 16
"""A growth's slack is at most this share of the rule's room after its need (lib_holds.lua)."""
GRANT_TTL_S = 600.0
"""How long a growth's marker lives, for its undo (lib_holds.lua's MARK_TTL_MS)."""
UNDONE = -1
"""A grant marker's value once its growth was taken back (or given up before it came)."""


@dataclass
class _Book:
    """One budget rule's book in process memory: per gateway, its entry and expiry (clock)."""

    holds: dict[str, tuple[int, float]]

    def live(self, now: float) -> int:
        self.holds = {i: h for i, h in self.holds.items() if h[1] > now}
        return sum(amount for amount, _ in self.holds.values())

    def change(self, owner: str, delta: int, again: int, expires: float) -> None:
        """lib_holds.lua's ``change``: by ``delta`` (never below 0), or made again at
        ``again`` when gone (if ``again`` >= 0)."""
        old = self.holds.get(owner)
        if old is not None:
            self.holds[owner] = (max(0, old[0] + delta), expires)
        elif again >= 0:
            self.holds[owner] = (again, expires)


@dataclass(frozen=True, slots=True)
class _State:
    level: float
    stamp: float
    """Clock reading when ``level`` was last written."""
    expires: float


class MemoryStore:
    """Buckets in process memory. Each call runs without awaiting, so asyncio makes it atomic."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: dict[str, _State] = {}
        self._books: dict[str, _Book] = {}
        self._grants: dict[tuple[str, str], tuple[int, float]] = {}
        """(book, grant id) -> (what the growth made, or UNDONE; when the marker expires)."""
        self._batches: set[str] = set()
        """Hold-update batches applied (the process never loses a reply; kept for the mirror)."""
        self._next_sweep = clock() + SWEEP_INTERVAL_S

    def __len__(self) -> int:
        """Buckets held: those touched within their time to live (and not yet swept)."""
        return len(self._states)

    async def reserve(self, charges: Sequence[Charge], holds: Sequence[Hold] = ()) -> Decision:
        now = self._now()
        decision = self._judge(charges, holds, now)
        for hold in holds:
            hold.granted = 0
        if not decision.admitted:
            return decision
        for charge, level in zip(*self._levels(charges, now), strict=True):
            self._write(charge, level, now)
        for hold in holds:
            book = self._book(hold.key)
            room = hold.limit - hold.base - book.live(now) - hold.need
            grown = hold.need + max(0, min(hold.extra, room // SLACK_SHARE))
            if grown > 0:
                book.change(hold.owner, grown, hold.keep + grown, now + hold.ttl_ms / 1000)
                self._grants[(hold.key, hold.grant)] = (grown, now + GRANT_TTL_S)
            hold.granted = grown
        return ADMITTED

    def _judge(self, charges: Sequence[Charge], holds: Sequence[Hold], now: float) -> Decision:
        if holds and self._grants.get((holds[0].key, holds[0].grant), (0,))[0] == UNDONE:
            return Decision(False, refused_hold=0, excess=0)  # its gateway gave it up
        for index, hold in enumerate(holds):
            excess = hold.base + self._book(hold.key).live(now) + hold.need - hold.limit
            if hold.need > 0 and excess > 0:
                return Decision(False, refused_hold=index, excess=excess)
        merged, levels = self._levels(charges, now)
        refusal = buckets.admit(
            levels, [charge.amount for charge in merged], [c.bucket.capacity for c in merged]
        )
        if refusal is not None:
            return Decision(False, merged[refusal.index].bucket, refusal.retry_after)
        return ADMITTED

    def _levels(self, charges: Sequence[Charge], now: float) -> tuple[list[Charge], list[float]]:
        merged = _merged(charges)
        return merged, [self._level(charge, now) for charge in merged]

    async def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        """As holds.lua: each batch once (a batch id seen before is skipped)."""
        now = self._now()
        batches = {update.batch for update in updates if update.batch}
        if batches & self._batches:
            return
        self._batches |= batches
        for update in updates:
            delta = update.delta
            if update.grant:
                grown, _ = self._grants.get((update.key, update.grant), (0, 0.0))
                delta -= max(0, grown)
                self._grants[(update.key, update.grant)] = (UNDONE, now + GRANT_TTL_S)
            expires = now + update.ttl_ms / 1000
            self._book(update.key).change(update.owner, delta, update.keep, expires)

    def held(self, key: str) -> int:
        """The live sum of a rule's entries (for tests and checks)."""
        return self._book(key).live(self._now())

    def _book(self, key: str) -> _Book:
        return self._books.setdefault(key, _Book({}))

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        """Apply ``charges``; ``batch_id`` is ignored: a call here never loses its reply."""
        now = self._now()
        for charge in _merged(charges):
            self._write(charge, self._level(charge, now), now)

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._states.clear()
        self._books.clear()
        self._grants.clear()

    def _now(self) -> float:
        now = self._clock()
        if now >= self._next_sweep:
            self._states = {key: s for key, s in self._states.items() if s.expires > now}
            for book in self._books.values():
                book.live(now)
            self._books = {key: book for key, book in self._books.items() if book.holds}
            self._grants = {key: g for key, g in self._grants.items() if g[1] > now}
            self._batches.clear()  # a batch is sent again within seconds, never a sweep later
            self._next_sweep = now + SWEEP_INTERVAL_S
        return now

    def _level(self, charge: Charge, now: float) -> float:
        state, capacity = self._states.get(charge.bucket.key), charge.bucket.capacity
        if state is None:
            return float(capacity)
        return buckets.refill(state.level, now - state.stamp, capacity)

    def _write(self, charge: Charge, level: float, now: float) -> None:
        capacity = charge.bucket.capacity
        new = buckets.apply(level, charge.amount, capacity)
        self._states[charge.bucket.key] = _State(new, now, now + buckets.ttl(new, capacity))


class RedisStore:
    """Buckets in Redis, shared by every gateway process; one script call per reserve or settle.

    The client should fail fast and never retry (see `open_redis_store`): a retried script call
    could charge twice, and a request must not wait on a dead Redis.
    """

    def __init__(self, client: Redis) -> None:
        self._client = client
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
        merged = [(_merged(charges), holds) for charges, holds in reservations]
        sent = [(m, h) for m, h in merged if m or h]
        if not sent:
            return [ADMITTED for _ in merged]
        keys, args = _admit_call(sent)
        reply = iter(await self._run(self._admit, keys, args))
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

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        """Apply ``charges`` (all under one hash tag) once per ``batch_id``, however often sent.

        A batch sent again under the same id (its reply was lost, so it may have run) is skipped
        by the script for `SETTLED_TTL_S`; without an id the batch gets a fresh one."""
        merged = [charge for charge in _merged(charges) if charge.amount != 0]
        if merged:
            marker = settled_key(merged[0].bucket.key, batch_id or uuid.uuid4().hex)
            keys = [marker, *(charge.bucket.key for charge in merged)]
            args = [SETTLED_TTL_S, *(v for c in merged for v in (c.bucket.capacity, c.amount))]
            await self._run(self._settle, keys, args)

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except (RedisError, OSError):
            return False

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _run(self, script: AsyncScript, keys: list[str], args: Sequence[int | str]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except (RedisError, OSError) as exc:  # OSError: a socket error redis-py did not wrap
            raise StoreUnavailable(f"rate-limit store: {exc}") from exc


class BatchingStore:
    """Reservations of one tenant made in the same event-loop tick share one script call.

    Under load many requests are admitted per tick; each still gets its own all-or-nothing
    decision, judged in arrival order, and the round trips per admission drop below one. Nothing
    waits for a batch to fill: the batch is sent at the end of the tick it started in.

    A reservation is all or nothing for its waiter too: one cancelled while the batch was on the
    wire (its client left, or shutdown) is given back in full as soon as Redis admits it, since
    nobody will ever settle it. ``aclose`` waits for batches and give-backs still on the wire.
    """

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._queue: list[tuple[Ask, asyncio.Future[Decision]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def reserve(self, charges: Sequence[Charge], holds: Sequence[Hold] = ()) -> Decision:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Decision] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._flush)
        self._queue.append(((charges, holds), future))
        try:
            return await future
        except asyncio.CancelledError:
            # Answered, but cancelled before the waiter resumed: the answer is lost with it.
            # (Its budget holds are the caller's to release: `Admission.admit` does.)
            if future.done() and not future.cancelled() and future.result().admitted:
                self._spawn(self._give_back(charges))
            raise

    def _flush(self) -> None:
        queue, self._queue = self._queue, []
        groups: dict[str, list[tuple[Ask, asyncio.Future[Decision]]]] = {}
        for item in queue:
            charges, holds = item[0]
            first = charges[0].bucket.key if charges else holds[0].key if holds else ""
            groups.setdefault(hash_tag(first), []).append(item)
        for group in groups.values():
            self._spawn(self._send(group))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, group: list[tuple[Ask, asyncio.Future[Decision]]]) -> None:
        try:
            decisions = await self._store.reserve_many([ask for ask, _ in group])
        except StoreUnavailable as exc:
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        orphans: list[Charge] = []
        for ((charges, _), future), decision in zip(group, decisions, strict=True):
            if not future.done():
                future.set_result(decision)
            elif decision.admitted:  # its waiter was cancelled: nobody else will give it back
                orphans += charges
        if orphans:
            await self._give_back(orphans)

    async def _give_back(self, charges: Sequence[Charge]) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self._store.settle([Charge(c.bucket, -c.amount) for c in charges])

    async def settle(self, charges: Sequence[Charge], batch_id: str | None = None) -> None:
        await self._store.settle(charges, batch_id)

    async def update_holds(self, updates: Sequence[HoldUpdate]) -> None:
        await self._store.update_holds(updates)

    async def ping(self) -> bool:
        return await self._store.ping()

    async def aclose(self) -> None:
        await asyncio.gather(*self._sending, return_exceptions=True)
        await self._store.aclose()


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
    same bytes (``tests/admission/test_stores.py``)."""

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


def _merged(charges: Sequence[Charge]) -> list[Charge]:
    """One charge per key, amounts summed, so a bucket named twice is charged once, in full."""
    if len({charge.bucket.key for charge in charges}) == len(charges):
        return list(charges)  # the usual case: every key once, nothing to sum
    by_key: dict[str, Charge] = {}
    for charge in charges:
        seen = by_key.get(charge.bucket.key)
        amount = charge.amount + (seen.amount if seen else 0)
        by_key[charge.bucket.key] = Charge(seen.bucket if seen else charge.bucket, amount)
    return list(by_key.values())


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
