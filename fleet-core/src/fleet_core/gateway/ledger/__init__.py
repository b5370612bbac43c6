"""The usage ledger: every request's usage, kept in Postgres for billing, budgets and reports.

`LedgerWriter` is the `UsageSink` that gets records there in batches without ever blocking a
response, spooling to a local file while the database is away; `store` holds its SQL and the read
helpers; migration 0003 holds the tables.
"""

from fleet_core.gateway.ledger.spool import Spool
from fleet_core.gateway.ledger.writer import LedgerWriter, WriterStats

__all__ = ["LedgerWriter", "Spool", "WriterStats"]
