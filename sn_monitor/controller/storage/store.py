"""The controller's memory: nodes, incidents, the audit trail of actions, jobs, the lease.

Every query is in ``aggregates/`` (one module per aggregate: nodes, incidents,
actions, jobs, recoveries, events, meta, the lease), in the SQL that SQLite and
PostgreSQL both speak, the tables in ``schema.py``; the engine is a
:class:`~sn_monitor.controller.storage.database.Database` (``database/sqlite.py``: one file in
the state directory, for one controller; ``database/postgres.py``: a server two
controllers share, for high availability). So that a restarted controller, or the
standby taking over, knows what was being done.

Durability. Action, job and recovery rows are promises that an outside system was (or
is about to be) changed: they are written in durable transactions, which survive a
power cut; node and incident rows, which the next reports rebuild, are not.

Fencing. In a pair of controllers (``sn_monitor.controller.ha``) the active one holds a
lease whose epoch grows at every change of holder; once :meth:`Store.fence` is set,
every write transaction first checks that the lease still names this controller and
epoch, and raises :class:`Fenced` otherwise (before anything is written).

Failure. A full disk, a read-only file, a missing directory or an unreachable server
raise :class:`StoreUnavailable`, so that callers can refuse to act without a record
rather than act unrecorded.
"""

from __future__ import annotations

from pathlib import Path

from sn_monitor.controller.storage.aggregates.actions import ActionStore, UnknownAction
from sn_monitor.controller.storage.aggregates.events import EventStore
from sn_monitor.controller.storage.aggregates.incidents import (
    Incident,
    IncidentStatus,
    IncidentStore,
)
from sn_monitor.controller.storage.aggregates.jobs import JobRow, JobStore
from sn_monitor.controller.storage.aggregates.lease import LeaseRecord, LeaseStore
from sn_monitor.controller.storage.aggregates.meta import MetaStore
from sn_monitor.controller.storage.aggregates.nodes import NodeRecord, NodeStore, Transition
from sn_monitor.controller.storage.aggregates.recoveries import RecoveryRow, RecoveryStore
from sn_monitor.controller.storage.database.base import (
    Database,
    Fenced,
    StoreError,
    StoreUnavailable,
)
from sn_monitor.controller.storage.database.sqlite import SQLiteDatabase
from sn_monitor.controller.storage.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = [
    "Fenced",
    "Incident",
    "IncidentStatus",
    "JobRow",
    "LeaseRecord",
    "NodeRecord",
    "RecoveryRow",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Transition",
    "UnknownAction",
]


class Store(NodeStore, IncidentStore, ActionStore, JobStore, RecoveryStore, EventStore,
            MetaStore, LeaseStore):
    """The controller's database. Safe to share between threads.

    ``where`` is a :class:`Database`, or a SQLite file path or ``file:`` URI (e.g.
    ``file:/x.db?mode=ro``); ``max_bytes`` caps a SQLite file's size: past it writes
    raise StoreUnavailable, as on a full disk, so that an audit trail cannot fill the
    controller's state volume. Opening migrates the schema (``schema.py``) to
    ``schema.SCHEMA_VERSION``. The queries are the aggregates' (``aggregates/``), which
    share this one database and this one fence.
    """

    def __init__(self, where: Database | Path | str, *, max_bytes: int | None = None
                 ) -> None:
        if isinstance(where, Path | str):
            where = SQLiteDatabase(where, max_bytes=max_bytes)
        self.db: Database = where
        self.path = where.name
        self._fence: tuple[str, int] | None = None
        try:
            where.migrate(MIGRATIONS, SCHEMA_VERSION)
        except BaseException:
            where.close()
            raise

    def schema_version(self) -> int:
        """The schema version of the open database."""
        return self.db.schema_version()

    def close(self) -> None:
        """Close the connection."""
        self.db.close()
