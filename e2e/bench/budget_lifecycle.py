"""What the budget rules cost a request in process: admit (check, knows and hold), settle, and
the ledger's commit per 100 records, a refresh every 2,000 requests, on three rules (the
database bench's).

Usage: python -m bench.budget_lifecycle [REQUESTS] [RUNS]   (PYTHONPATH=e2e)
Prints the median, fastest and slowest microseconds per request over RUNS runs. Not part of
``make bench``: a figure for ADR 0004 (the garbage collector is off, as a request's objects die
by reference count). The store is not called: a growth the book asks for is granted at once, as
Redis would. On a shared machine the times drift by a third between minutes; for a figure that
does not, count instructions: ``valgrind --tool=callgrind python -m bench.budget_lifecycle N 1``
for two N, and divide the difference of the totals by the difference of the Ns.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

from fleet_core.gateway.admission.budget_book import Amounts, BudgetBook
from fleet_core.gateway.admission.directory import BudgetRule

BIG = 10**12
RULES = (
    BudgetRule("rule_tenant", "tenant", "acme", "tokens_total", BIG, 2592000),
    BudgetRule("rule_project", "project", "acme/research", "units", BIG, 604800),
    BudgetRule("rule_day", "project", "acme/research", "tokens_output", BIG, 86400),
)
DEMAND = Amounts(tokens_input=10, tokens_output=16, units=7000)
USED = Amounts(tokens_input=10, tokens_output=11, units=5000)


def run(requests: int) -> float:
    """Microseconds per request of one run over a fresh book."""
    book = BudgetBook(ledger=True)
    book.refreshed({rule.id: 0 for rule in RULES}, started_at=time.monotonic())
    committed: list[str] = []
    started = time.perf_counter()
    for index in range(requests):
        admitted = book.admit(RULES, DEMAND)
        if admitted is None:
            raise SystemExit("bench.budget_lifecycle: a rule lost its figures")
        hold, asks = admitted
        if asks:
            for ask in asks:
                ask.granted = ask.need + ask.extra
            book.placed(hold)
        request_id = f"r{index}"
        book.settle(hold, USED, request_id=request_id)
        committed.append(request_id)
        if len(committed) == 100:
            book.committed(committed)
            committed = []
        if index % 2000 == 1999:
            book.refreshed({rule.id: 0 for rule in RULES}, started_at=time.monotonic())
    return (time.perf_counter() - started) / requests * 1e6


def main(requests: int, runs: int) -> None:
    gc.disable()
    figures = [run(requests) for _ in range(runs)]
    print(
        f"budget lifecycle: {statistics.median(figures):.2f} µs per request "
        f"(fastest {min(figures):.2f}, slowest {max(figures):.2f}; {runs} runs of {requests})"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 50_000, int(args[1]) if len(args) > 1 else 7)
