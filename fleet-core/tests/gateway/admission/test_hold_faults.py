"""Budget allowances when Redis is away: an entry update or a growth that met a dead Redis is
kept and sent again once it is back, under its batch id, and the entry ends exactly what the
gateway means it to be; a growth whose answer was lost is given back as the store-error policy says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from fleet_core.gateway.admission.allowances import book_key
from fleet_core.gateway.admission.batching_store import BatchingStore
from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook
from fleet_core.gateway.admission.directory import BudgetRule, StaticDirectory
from fleet_core.gateway.admission.key_ring import ANONYMOUS, Principal
from fleet_core.gateway.admission.rate_policy import Limits, RatePolicy
from fleet_core.gateway.admission.service import Admission, OnStoreError
from fleet_core.gateway.admission.store import open_redis_store
from fleet_core.shared.errors import Unavailable
from fleet_testing import servers
from fleet_testing.fix_proxy import ProxyFactory, TcpProxy
from fleet_testing.waiting import eventually

from .redis_books import entries


class _Ruled(StaticDirectory):
    """Environment mode's directory with one budget rule for everyone."""

    def __init__(self, rule: BudgetRule) -> None:
        super().__init__(keys=None, policy=RatePolicy(default=Limits(tpm=1_000_000)))
        self.rule = rule

    def rules(self, principal: Principal) -> Sequence[BudgetRule]:
        return (self.rule,)

    @property
    def has_rules(self) -> bool:
        return True


class _Errors:
    def __init__(self) -> None:
        self.store_errors = 0

    def refused(self, **_: str) -> None: ...

    def store_error(self) -> None:
        self.store_errors += 1

    def settlement_dropped(self) -> None: ...


async def _admission(
    redis_url: str, redis_prefix: str, tcp_proxy: ProxyFactory, on_store_error: OnStoreError
) -> tuple[Admission, BudgetBook, TcpProxy, _Errors, BudgetRule, BatchingStore]:
    target = servers.address_of(redis_url)
    proxy = tcp_proxy(target.host, target.port)
    store = BatchingStore(await open_redis_store(proxy.url_for(redis_url), timeout_s=1.0))
    rule = BudgetRule(
        f"rule_{redis_prefix.strip(':')}", "tenant", "anonymous", "tokens_total", 100_000, 3600
    )
    book = BudgetBook(prefix=redis_prefix)
    book.refreshed({rule.id: 0}, started_at=0.0)
    errors = _Errors()
    admission = Admission(
        directory=_Ruled(rule),
        store=store,
        metrics=errors,
        budgets=book,
        prefix=redis_prefix,
        on_store_error=on_store_error,
    )
    return admission, book, proxy, errors, rule, store


async def _until(check: Any, within_s: float = 5.0) -> None:
    await eventually(check, within=within_s, interval=0.01)


async def test_an_entry_update_that_met_a_dead_redis_lands_once_it_is_back(
    redis_url: str, redis_prefix: str, tcp_proxy: ProxyFactory
) -> None:
    """An overrun's growth is kept when the store fails and sent again, under its batch id,
    with the next touch; once Redis is back the entry is exactly what the gateway means."""
    admission, book, proxy, errors, rule, store = await _admission(
        redis_url, redis_prefix, tcp_proxy, "closed"
    )
    key = book_key(rule, prefix=redis_prefix)
    try:
        reservation = await admission.admit(ANONYMOUS, Amounts(tokens_output=100))
        assert entries(redis_url, key) == {book.owner: 500}  # 100 and 4 requests' slack
        await asyncio.to_thread(proxy.cut)
        admission.settle(reservation, Amounts(tokens_output=5_000), request_id="r1")
        await _until(lambda: errors.store_errors > 0)
        assert entries(redis_url, key) == {book.owner: 500}
        await asyncio.to_thread(proxy.resume)
        admission.keep_holds()  # what the refresh loop calls every interval
        await _until(lambda: entries(redis_url, key) == {book.owner: 5_000})
        admission.keep_holds()
        await asyncio.sleep(0.1)  # nothing further lands
        assert entries(redis_url, key) == {book.owner: 5_000}
        assert book.allowance(rule) == (5_000, 0, 5_000)
    finally:
        await admission.drain()
        await store.aclose()


@pytest.mark.parametrize("on_store_error", ["open", "closed"])
async def test_a_growth_that_met_a_dead_redis_is_given_back_as_configured(
    redis_url: str, redis_prefix: str, tcp_proxy: ProxyFactory, on_store_error: OnStoreError
) -> None:
    """Closed: refused (503), nothing counted. Open: admitted without a budget reservation
    (counted as unheld use once settled). Either way the growth, which may or may not have
    been made, is taken back once Redis answers again."""
    admission, book, proxy, errors, rule, store = await _admission(
        redis_url, redis_prefix, tcp_proxy, on_store_error
    )
    key = book_key(rule, prefix=redis_prefix)
    try:
        await asyncio.to_thread(proxy.cut)
        if on_store_error == "closed":
            with pytest.raises(Unavailable):
                await admission.admit(ANONYMOUS, Amounts(tokens_output=100))
        else:
            reservation = await admission.admit(ANONYMOUS, Amounts(tokens_output=100))
            assert reservation.hold is None
        assert book.allowance(rule) == (0, 0, 0)
        assert book.own() == 0
        await _until(lambda: errors.store_errors >= 2)  # the undo failed too: kept
        assert admission._settlements._unsent_holds
        await asyncio.to_thread(proxy.resume)
        admission.keep_holds()
        await _until(lambda: not admission._settlements._unsent_holds)
        assert entries(redis_url, key) in ({}, {book.owner: 0})
        reservation = await admission.admit(ANONYMOUS, Amounts(tokens_output=100))
        assert reservation.hold is not None
        assert entries(redis_url, key) == {book.owner: book.allowance(rule)[0]}
    finally:
        await admission.drain()
        await store.aclose()
