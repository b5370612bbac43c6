"""While Postgres is down, the catalog watcher (which retries every poll interval) says so once,
then once a minute, and once more when the database is back: it used to log a warning every
second for as long as the outage lasted."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
import pytest

from fleet_core.gateway.admission.catalog import CatalogWatcher
from fleet_core.gateway.admission.directory import Catalog, CatalogDirectory
from fleet_core.shared.storage.migrations import apply_migrations
from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory
from fleet_testing.waiting import eventually


async def test_an_outage_is_one_warning_then_one_line_when_it_ends(
    postgres_url: str, tcp_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await apply_migrations(conn)
    target = servers.address_of(postgres_url)
    proxy = tcp_proxy(target.host, target.port)
    watcher = CatalogWatcher(
        proxy.url_for(postgres_url), CatalogDirectory(Catalog()), poll_interval_s=0.02
    )
    caplog.set_level(logging.WARNING, logger="fleet.admission")
    running = asyncio.create_task(watcher.run())
    try:
        await asyncio.sleep(0.3)  # connected and listening
        assert not caplog.records
        await asyncio.to_thread(proxy.cut)
        await asyncio.sleep(1.0)  # some fifty retries
        down = [r.getMessage() for r in caplog.records]
        assert len(down) == 1, down
        assert "lost the database" in down[0]
        await asyncio.to_thread(proxy.resume)
        await eventually(lambda: len(caplog.records) == 2, within=5, what="the recovery line")
        assert "reached the database again" in caplog.records[1].getMessage()
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
