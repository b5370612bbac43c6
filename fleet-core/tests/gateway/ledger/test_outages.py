"""The writer with the database going away: the spool, the replay, and a restart in between.

The database connection runs through a `TcpProxy`: ``cut()`` resets every connection (mid-COPY,
mid-commit, wherever the writer is) and refuses new ones until ``resume()``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleet_core.gateway.ledger import LedgerWriter, Spool
from fleet_core.gateway.metering.records import EngineUsage
from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory, TcpProxy

from .conftest import rejected_bytes, settle, spool_files, totals, usage

N = 2000


def proxied(tcp_proxy: ProxyFactory, url: str) -> tuple[TcpProxy, str]:
    target = servers.address_of(url)
    proxy = tcp_proxy(target.host, target.port)
    return proxy, proxy.url_for(url)


def quick_writer(url: str, spool_path: Path) -> LedgerWriter:
    return LedgerWriter(
        url,
        spool_path=spool_path,
        batch_size=100,
        flush_interval_s=0.01,
        retry_interval_s=0.1,
        timeout_s=2.0,
    )


async def test_an_outage_mid_load_loses_and_doubles_nothing(
    ledger_url: str, spool_path: Path, tcp_proxy: ProxyFactory
) -> None:
    proxy, url = proxied(tcp_proxy, ledger_url)
    async with quick_writer(url, spool_path) as writer:
        for n in range(N):
            engine = EngineUsage(100 + n % 13, 10 + n % 3, n % 50) if n % 3 else None
            writer.record(usage(n, engine=engine, done_at=1_699_999_980.0 + n * 0.1))
            if n % 20 == 19:
                await asyncio.sleep(0.002)  # requests keep arriving while batches are written
            if n == N // 2:
                proxy.cut()
        await asyncio.sleep(0.3)  # still down: later batches go to the spool as well
        assert not writer.available
        proxy.resume()
        await settle(writer)
    assert writer.stats.spooled > 0
    assert writer.stats.replayed >= writer.stats.spooled
    assert proxy.accepted >= 2  # it reconnected
    count, ledger, rollup = await totals(ledger_url)
    assert count == N
    assert ledger.requests == rollup.requests == N
    assert ledger == rollup
    assert spool_files(spool_path) == {}


async def test_a_flapping_database_still_gets_each_request_once(
    ledger_url: str, spool_path: Path, tcp_proxy: ProxyFactory
) -> None:
    proxy, url = proxied(tcp_proxy, ledger_url)
    async with quick_writer(url, spool_path) as writer:
        flips = {300: proxy.cut, 700: proxy.resume, 1300: proxy.cut, 1600: proxy.resume}
        for n in range(N):
            writer.record(usage(n, engine=EngineUsage(50, 5, n % 7) if n % 2 else None))
            if n % 20 == 19:
                await asyncio.sleep(0.005)
            if flip := flips.get(n):
                flip()
            if n == 1000:
                await settle(writer)  # back on the database before the next cut
        await settle(writer)
    assert writer.stats.outages == 2
    assert proxy.accepted >= 3
    count, ledger, rollup = await totals(ledger_url)
    assert count == N
    assert ledger == rollup
    assert spool_files(spool_path) == {}


async def test_a_writer_closed_during_an_outage_is_replayed_by_the_next(
    ledger_url: str, spool_path: Path, tcp_proxy: ProxyFactory
) -> None:
    proxy, url = proxied(tcp_proxy, ledger_url)
    proxy.cut()
    async with quick_writer(url, spool_path) as first:
        for n in range(300):
            first.record(usage(n))
    assert first.stats.spooled == 300
    assert first.stats.written == 0
    assert spool_files(spool_path) == {"ledger.jsonl": 300}
    assert (await totals(ledger_url))[0] == 0

    proxy.resume()
    async with quick_writer(url, spool_path) as second:
        await settle(second)
    assert second.stats.replayed == 300
    count, ledger, rollup = await totals(ledger_url)
    assert count == 300
    assert ledger == rollup
    assert spool_files(spool_path) == {}


async def test_a_line_torn_by_a_crash_is_set_aside_and_the_rest_replayed(
    ledger_url: str, spool_path: Path
) -> None:
    write_torn_spool(spool_path)
    Spool(spool_path).append([usage(9)])  # after the torn line, on a line of its own
    async with quick_writer(ledger_url, spool_path) as writer:
        await settle(writer)
    assert writer.stats.replayed == 4
    assert (await totals(ledger_url))[0] == 4
    assert spool_files(spool_path) == {"ledger.jsonl.rejected": 1}
    assert rejected_bytes(spool_path) == b'{"requestId":"req-torn","ki\n'


def write_torn_spool(spool_path: Path) -> None:
    """Three whole records, then one cut short as by a crash mid-append."""
    spool_path.parent.mkdir(parents=True)
    whole = b"".join(
        f'{{"requestId":"req-{n}","kind":"chat","model":"m","servedModel":"m",'
        f'"endpoint":null,"status":200,"outcome":"ok","stream":false,"receivedAt":1.0,'
        f'"firstByteAt":null,"doneAt":2.0,"engine":null,'
        f'"gateway":{{"promptTokens":3,"completionTokens":4,"method":"x"}}}}\n'.encode()
        for n in range(3)
    )
    spool_path.write_bytes(whole + b'{"requestId":"req-torn","ki')
