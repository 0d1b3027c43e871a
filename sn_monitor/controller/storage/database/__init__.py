"""Where the store's rows live: SQLite for one controller, PostgreSQL for two (HA).

:class:`~.base.Database` is the whole interface the store uses: transactions that run
``?``-placeholder SQL in the subset both engines speak, a schema version, and errors
turned into :class:`~.base.StoreUnavailable` where the database cannot take writes.
The storage package owns the schema (``storage/schema.py``) and every query (the store's
``storage/aggregates/``, built with ``storage/query.py``); a backend owns only its
connection, its durability switch and its error codes.
"""

from sn_monitor.controller.storage.database.base import (
    Database,
    Fenced,
    Row,
    StoreError,
    StoreUnavailable,
    Transaction,
)

__all__ = ["Database", "Fenced", "Row", "StoreError", "StoreUnavailable", "Transaction"]
