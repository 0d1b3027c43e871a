"""The controller's memory: nodes, incidents, the audit trail of actions, jobs, the lease.

Every query is here, in the SQL that SQLite and PostgreSQL both speak; the engine is a
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

import json
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from sn_monitor.controller.audit import (
    ACTION_STATES,
    ActionRecord,
    ActionRequest,
    ActionState,
    Refusal,
)
from sn_monitor.controller.storage.database.base import (
    Database,
    Row,
    Transaction,
)
from sn_monitor.controller.storage.database.base import Fenced as Fenced  # re-exported
from sn_monitor.controller.storage.database.base import StoreError as StoreError  # re-exported
from sn_monitor.controller.storage.database.base import (
    StoreUnavailable as StoreUnavailable,  # re-exported
)
from sn_monitor.controller.storage.database.sqlite import SQLiteDatabase
from sn_monitor.model import EventRecord

log = logging.getLogger(__name__)

IncidentStatus = Literal["open", "closed"]

#: The schema this code writes; older files are migrated on open, newer ones refused.
SCHEMA_VERSION: Final = 5

# _MIGRATIONS[i] takes a database from user_version i to i + 1.
_MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        labels TEXT NOT NULL DEFAULT '{}',
        state TEXT NOT NULL DEFAULT 'healthy',
        state_reason TEXT NOT NULL DEFAULT '',
        cordoned_by_us INTEGER NOT NULL DEFAULT 0,
        first_seen REAL NOT NULL,
        last_seen REAL NOT NULL
    );
    CREATE TABLE node_transitions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node TEXT NOT NULL,
        from_state TEXT,
        to_state TEXT NOT NULL,
        reason TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX node_transitions_node ON node_transitions (node, at);
    CREATE TABLE incidents (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        rule TEXT NOT NULL,
        node TEXT NOT NULL,
        subject TEXT NOT NULL DEFAULT '',
        gpu INTEGER,
        severity TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('open', 'closed')),
        message TEXT NOT NULL,
        observed_at REAL NOT NULL,
        detected_at REAL NOT NULL,
        closed_at REAL,
        value REAL
    );
    -- at most one open incident per (rule, node, subject): the dedup rule, held by the db
    CREATE UNIQUE INDEX incidents_open ON incidents (rule, node, subject)
        WHERE status = 'open';
    CREATE INDEX incidents_node ON incidents (node, detected_at);
    CREATE TABLE actions (
        id TEXT PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        action TEXT NOT NULL,
        node TEXT,
        gpu INTEGER,
        rule TEXT,
        incident_id INTEGER,
        severity TEXT NOT NULL,
        reason TEXT NOT NULL,
        labels TEXT NOT NULL DEFAULT '{}',
        params TEXT NOT NULL DEFAULT '{}',
        requested_by TEXT NOT NULL,
        state TEXT NOT NULL,
        verdict_reason TEXT NOT NULL DEFAULT '',
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        outcome_message TEXT NOT NULL DEFAULT '',
        outcome TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX actions_state ON actions (state);
    CREATE INDEX actions_node ON actions (node, created_at);
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    -- events the agents reported (XIDs, GPU lost, guard actions): an agent drops an event
    -- from its spool only once it is here. (node, event_id, time) identifies a retry.
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        node TEXT NOT NULL,
        event_id INTEGER NOT NULL,
        kind TEXT NOT NULL,
        source TEXT NOT NULL,
        time REAL NOT NULL,
        received_at REAL NOT NULL,
        gpu INTEGER,
        code INTEGER,
        pci_bus_id TEXT,
        device TEXT,
        message TEXT NOT NULL DEFAULT '',
        UNIQUE (node, event_id, time)
    );
    CREATE INDEX events_node ON events (node, received_at);
    """,
    # 1 -> 2: training jobs and their recoveries (sn_monitor.controller.jobs.orchestrator)
    """
    CREATE TABLE jobs (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        source TEXT NOT NULL,
        state TEXT NOT NULL,
        state_reason TEXT NOT NULL DEFAULT '',
        generation INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0,
        nodes TEXT NOT NULL DEFAULT '[]',
        added TEXT NOT NULL DEFAULT '[]',
        excluded TEXT NOT NULL DEFAULT '[]',
        pool TEXT NOT NULL DEFAULT '[]',
        data TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE recoveries (
        id TEXT PRIMARY KEY,
        job TEXT NOT NULL,
        generation INTEGER NOT NULL,
        state TEXT NOT NULL,
        kind TEXT NOT NULL,
        strategy TEXT NOT NULL,
        failed_nodes TEXT NOT NULL DEFAULT '[]',
        replacement_nodes TEXT NOT NULL DEFAULT '[]',
        nodes TEXT NOT NULL DEFAULT '[]',
        incident_ids TEXT NOT NULL DEFAULT '[]',
        checkpoint_step INTEGER,
        checkpoint_path TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        deadline REAL,
        fault_seen REAL NOT NULL,
        detected REAL,
        evicted REAL,
        restore_sent REAL,
        resumed REAL,
        finished_at REAL,
        error TEXT NOT NULL DEFAULT '',
        actions TEXT NOT NULL DEFAULT '{}',
        data TEXT NOT NULL DEFAULT '{}',
        history TEXT NOT NULL DEFAULT '[]',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX recoveries_job ON recoveries (job, created_at);
    CREATE INDEX recoveries_state ON recoveries (state);
    """,
    # 2 -> 3: the lease of a pair of controllers (sn_monitor.controller.ha)
    """
    CREATE TABLE controller_lease (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        acquired_at REAL NOT NULL,
        renewed_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    """,
    # 3 -> 4: a refusal's typed reason, and the process (job recovery) an action belongs to
    """
    ALTER TABLE actions ADD COLUMN refusal TEXT;
    ALTER TABLE actions ADD COLUMN owner TEXT;
    CREATE INDEX actions_owner ON actions (owner);
    """,
    # 4 -> 5: an incident's actions by its id (GET /api/v1/incidents/ID), however old
    """
    CREATE INDEX actions_incident ON actions (incident_id, created_at);
    """,
)

class UnknownAction(StoreError):
    """No action with that id."""


class _Unset:
    """Marks "leave this column alone" where ``None`` is a value (NULL)."""


_UNSET: Final = _Unset()


@dataclass(frozen=True)
class NodeRecord:
    """A node as the store knows it; times are wall-clock seconds."""

    name: str
    labels: Mapping[str, str]
    state: str
    state_reason: str
    cordoned_by_us: bool
    first_seen: float
    last_seen: float


@dataclass(frozen=True)
class Transition:
    """One change of a node's state."""

    node: str
    from_state: str | None
    to_state: str
    reason: str
    at: float


@dataclass(frozen=True)
class Incident:
    """A fault the rules found, open until its rule clears.

    ``observed_at`` is when the agent first saw the fault, ``detected_at`` when the
    controller opened the incident: the gap is the detection latency.
    """

    id: int
    rule: str
    node: str
    subject: str
    gpu: int | None
    severity: str
    status: IncidentStatus
    message: str
    observed_at: float
    detected_at: float
    closed_at: float | None
    value: float | None


@dataclass(frozen=True)
class JobRow:
    """A training job as the store keeps it (see :mod:`sn_monitor.controller.jobs.orchestrator`).

    ``spec`` is the DistributedJob as plain data (``spec.job_to_dict``); ``nodes`` the
    job's members when last computed; ``added`` the replacement nodes taken into the job,
    ``excluded`` the nodes failed out of it (back only through ``return_to_pool``),
    ``pool`` the spares left; ``data`` the orchestrator's own bookkeeping.
    """

    name: str
    spec: Mapping[str, Any]
    source: str
    state: str
    created_at: float
    updated_at: float
    state_reason: str = ""
    generation: int = 0
    failures: int = 0
    nodes: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    pool: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RecoveryRow:
    """One recovery of a job: a persisted state machine (see the orchestrator).

    Times are wall-clock seconds; ``actions`` maps each step (``evict:node-3``,
    ``restore``) to the id of the action submitted for it.
    """

    id: str
    job: str
    generation: int
    state: str
    kind: str
    strategy: str
    fault_seen: float
    created_at: float
    updated_at: float
    failed_nodes: tuple[str, ...] = ()
    replacement_nodes: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    incident_ids: tuple[int, ...] = ()
    checkpoint_step: int | None = None
    checkpoint_path: str | None = None
    attempts: int = 0
    deadline: float | None = None
    detected: float | None = None
    evicted: float | None = None
    restore_sent: float | None = None
    resumed: float | None = None
    finished_at: float | None = None
    error: str = ""
    actions: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)
    history: tuple[Mapping[str, Any], ...] = ()


_RECOVERY_COLUMNS: Final = (
    "id", "job", "generation", "state", "kind", "strategy", "failed_nodes",
    "replacement_nodes", "nodes", "incident_ids", "checkpoint_step", "checkpoint_path",
    "attempts", "deadline", "fault_seen", "detected", "evicted", "restore_sent", "resumed",
    "finished_at", "error", "actions", "data", "history", "created_at", "updated_at",
)
_RECOVERY_JSON: Final = frozenset(
    {"failed_nodes", "replacement_nodes", "nodes", "incident_ids", "actions", "data",
     "history"})
_JOB_COLUMNS: Final = (
    "name", "spec", "source", "state", "state_reason", "generation", "failures", "nodes",
    "added", "excluded", "pool", "data", "created_at", "updated_at",
)
_JOB_JSON: Final = frozenset({"spec", "nodes", "added", "excluded", "pool", "data"})


def _to_json(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    elif isinstance(value, Mapping):
        value = dict(value)
    return json.dumps(value, sort_keys=True, default=str)


def _from_json(text: str) -> Any:
    value = json.loads(text)
    return tuple(value) if isinstance(value, list) else value


def _check_state(state: str) -> None:
    if state not in ACTION_STATES:
        raise ValueError(f"unknown action state {state!r}")


def _dumps(value: Mapping[str, Any]) -> str:
    # default=str: params may carry paths or enums; the audit trail wants them readable.
    return json.dumps(dict(value), sort_keys=True, default=str)


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds the controllers' lease, since when, and its fencing epoch.

    Times are wall-clock seconds of the candidates' clocks (as in a Kubernetes Lease):
    the controllers' clocks must agree to well within ``lease_duration``.
    """

    holder: str
    epoch: int
    acquired_at: float
    renewed_at: float
    expires_at: float


#: The one lease row's name (a table keyed by name leaves room for more).
LEASE_NAME: Final = "controller"


class Store:
    """The controller's database. Safe to share between threads.

    ``where`` is a :class:`Database`, or a SQLite file path or ``file:`` URI (e.g.
    ``file:/x.db?mode=ro``); ``max_bytes`` caps a SQLite file's size: past it writes
    raise StoreUnavailable, as on a full disk, so that an audit trail cannot fill the
    controller's state volume.
    """

    def __init__(self, where: Database | Path | str, *, max_bytes: int | None = None
                 ) -> None:
        if isinstance(where, Path | str):
            where = SQLiteDatabase(where, max_bytes=max_bytes)
        self.db: Database = where
        self.path = where.name
        self._fence: tuple[str, int] | None = None
        try:
            where.migrate(_MIGRATIONS, SCHEMA_VERSION)
        except BaseException:
            where.close()
            raise

    # -- plumbing ---------------------------------------------------------------------

    @contextmanager
    def _tx(self, *, durable: bool = False) -> Iterator[Transaction]:
        """One write transaction; ``durable`` commits to stable storage. Fenced, if set."""
        with self.db.transaction(durable=durable) as tx:
            if self._fence is not None:
                self._check_fence(tx, *self._fence)
            yield tx

    def _check_fence(self, tx: Transaction, holder: str, epoch: int) -> None:
        row = tx.one("SELECT holder, epoch FROM controller_lease WHERE name = ?"
                     + self.db.shared_lock_rows, (LEASE_NAME,))
        if row is None or (row["holder"], int(row["epoch"])) != (holder, epoch):
            now = "nobody" if row is None else f"{row['holder']} (epoch {row['epoch']})"
            raise Fenced(f"the lease is held by {now}, not by this controller ({holder}, "
                         f"epoch {epoch}): it may no longer write")

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[Row]:
        return self.db.query(sql, tuple(args))

    def schema_version(self) -> int:
        """The schema version of the open database."""
        return self.db.schema_version()

    def close(self) -> None:
        """Close the connection."""
        self.db.close()

    # -- the lease (high availability) ------------------------------------------------

    def acquire_lease(self, holder: str, now: float, duration: float, *,
                      force: bool = False) -> LeaseRecord | None:
        """Take the lease if free or expired, renew it if ``holder`` has it; None if not.

        Taking it from someone else (or ``force``: the Kubernetes Lease already decided)
        increments the epoch; a renewal keeps it. Concurrent candidates serialize on
        the row (``FOR UPDATE``; in SQLite the write transaction locks the file).
        Durable: a lease granted must survive the database's crash.
        """
        with self.db.transaction(durable=True) as tx:
            row = tx.one("SELECT * FROM controller_lease WHERE name = ?" + self.db.lock_rows,
                         (LEASE_NAME,))
            if row is None:
                taken = tx.execute(
                    "INSERT INTO controller_lease (name, holder, epoch, acquired_at,"
                    " renewed_at, expires_at) VALUES (?, ?, 1, ?, ?, ?)"
                    " ON CONFLICT (name) DO NOTHING",
                    (LEASE_NAME, holder, now, now, now + duration))
                return LeaseRecord(holder, 1, now, now, now + duration) if taken else None
            epoch = int(row["epoch"])
            if row["holder"] == holder and not force:
                tx.execute("UPDATE controller_lease SET renewed_at = ?, expires_at = ?"
                           " WHERE name = ?", (now, now + duration, LEASE_NAME))
                return LeaseRecord(holder, epoch, float(row["acquired_at"]), now,
                                   now + duration)
            if not force and float(row["expires_at"]) > now:
                return None
            tx.execute("UPDATE controller_lease SET holder = ?, epoch = ?, acquired_at = ?,"
                       " renewed_at = ?, expires_at = ? WHERE name = ?",
                       (holder, epoch + 1, now, now, now + duration, LEASE_NAME))
            return LeaseRecord(holder, epoch + 1, now, now, now + duration)

    def release_lease(self, holder: str, now: float) -> bool:
        """Let the lease expire now if ``holder`` has it (an orderly stop); True if it did."""
        with self.db.transaction(durable=True) as tx:
            return tx.execute("UPDATE controller_lease SET expires_at = ?"
                              " WHERE name = ? AND holder = ?", (now, LEASE_NAME, holder)) > 0

    def lease(self) -> LeaseRecord | None:
        """The lease as it is now, or None if nobody ever took it."""
        rows = self._query("SELECT * FROM controller_lease WHERE name = ?", (LEASE_NAME,))
        if not rows:
            return None
        r = rows[0]
        return LeaseRecord(str(r["holder"]), int(r["epoch"]), float(r["acquired_at"]),
                           float(r["renewed_at"]), float(r["expires_at"]))

    def fence(self, holder: str, epoch: int) -> None:
        """From now on write only while the lease names ``holder`` at ``epoch``."""
        self._fence = (holder, epoch)

    # -- nodes ------------------------------------------------------------------------

    def upsert_node(self, name: str, labels: Mapping[str, str], seen_wall: float) -> None:
        """Note that ``name`` reported at ``seen_wall``; a new node starts healthy."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO nodes (name, labels, first_seen, last_seen) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET labels = excluded.labels,"
                " last_seen = CASE WHEN excluded.last_seen > nodes.last_seen"
                " THEN excluded.last_seen ELSE nodes.last_seen END",
                (name, _dumps(labels), seen_wall, seen_wall),
            )

    def set_node_state(self, name: str, state: str, reason: str, at: float, *,
                       cordoned_by_us: bool | None = None) -> bool:
        """Set a node's state; a change is also written to ``node_transitions``.

        Returns True when the state changed. ``cordoned_by_us`` (when not None) records
        whether sn-monitor holds the node's cordon: only then may it uncordon the node.
        An unknown node is created (a node can be cordoned by hand before it reports).
        """
        with self._tx() as db:
            return self._set_node_state(db, name, state, reason, at, cordoned_by_us)

    def set_node_states(self, states: Sequence[tuple[str, str, str]], at: float) -> None:
        """(name, state, reason) of many nodes in one transaction (a fleet's first sweep)."""
        with self._tx() as db:
            for name, state, reason in states:
                self._set_node_state(db, name, state, reason, at, None)

    @staticmethod
    def _set_node_state(db: Transaction, name: str, state: str, reason: str, at: float,
                        cordoned_by_us: bool | None) -> bool:
        row = db.one("SELECT state FROM nodes WHERE name = ?", (name,))
        previous = None if row is None else str(row["state"])
        if row is None:
            db.execute(
                "INSERT INTO nodes (name, state, state_reason, first_seen, last_seen)"
                " VALUES (?, ?, ?, ?, ?)", (name, state, reason, at, at))
        else:
            db.execute("UPDATE nodes SET state = ?, state_reason = ? WHERE name = ?",
                       (state, reason, name))
        if cordoned_by_us is not None:
            db.execute("UPDATE nodes SET cordoned_by_us = ? WHERE name = ?",
                       (int(cordoned_by_us), name))
        changed = previous != state
        if changed:
            db.execute(
                "INSERT INTO node_transitions (node, from_state, to_state, reason, at)"
                " VALUES (?, ?, ?, ?, ?)", (name, previous, state, reason, at))
        return changed

    def set_cordoned_by_us(self, name: str, value: bool, at: float) -> None:
        """Record whether sn-monitor holds the node's cordon (set by the action runner)."""
        with self._tx(durable=True) as db:
            db.execute(
                "INSERT INTO nodes (name, cordoned_by_us, first_seen, last_seen)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE"
                " SET cordoned_by_us = excluded.cordoned_by_us", (name, int(value), at, at))

    @staticmethod
    def _node(row: Row) -> NodeRecord:
        return NodeRecord(
            name=row["name"], labels=json.loads(row["labels"]), state=row["state"],
            state_reason=row["state_reason"], cordoned_by_us=bool(row["cordoned_by_us"]),
            first_seen=row["first_seen"], last_seen=row["last_seen"],
        )

    def get_node(self, name: str) -> NodeRecord | None:
        """One node, or None."""
        rows = self._query("SELECT * FROM nodes WHERE name = ?", (name,))
        return self._node(rows[0]) if rows else None

    def list_nodes(self) -> list[NodeRecord]:
        """Every node, by name."""
        return [self._node(r) for r in self._query("SELECT * FROM nodes ORDER BY name")]

    def cordoned_by_us(self) -> set[str]:
        """The nodes whose cordon sn-monitor holds (read before every disruptive action)."""
        return {r["name"] for r in self._query(
            "SELECT name FROM nodes WHERE cordoned_by_us = 1")}

    def transitions(self, node: str, limit: int = 100) -> list[Transition]:
        """The node's last ``limit`` state changes, oldest first."""
        rows = self._query(
            "SELECT * FROM (SELECT * FROM node_transitions WHERE node = ?"
            " ORDER BY id DESC LIMIT ?) AS newest ORDER BY id", (node, limit))
        return [Transition(node=r["node"], from_state=r["from_state"],
                           to_state=r["to_state"], reason=r["reason"], at=r["at"])
                for r in rows]

    # -- incidents --------------------------------------------------------------------

    def open_incident(self, rule: str, node: str, subject: str = "", *, severity: str,
                      message: str, observed_at: float, detected_at: float,
                      gpu: int | None = None, value: float | None = None) -> int:
        """Open an incident, or return the id of the one already open for (rule, node, subject).

        ``subject`` tells apart faults of one rule on one node (``gpu3``, ``mlx5_0/1``);
        it is empty for node-wide rules.
        """
        with self._tx() as db:
            row = db.one(
                "SELECT id FROM incidents WHERE rule = ? AND node = ? AND subject = ?"
                " AND status = 'open'", (rule, node, subject))
            if row is not None:
                return int(row["id"])
            new = db.one(
                "INSERT INTO incidents (rule, node, subject, gpu, severity, status, message,"
                " observed_at, detected_at, value) VALUES (?, ?, ?, ?, ?, 'open', ?, ?, ?, ?)"
                " RETURNING id",
                (rule, node, subject, gpu, severity, message, observed_at, detected_at, value))
            assert new is not None  # RETURNING of an INSERT that ran
            return int(new["id"])

    def close_incident(self, rule: str, node: str, subject: str, at: float) -> int | None:
        """Close the open incident for (rule, node, subject); its id, or None if none was open."""
        with self._tx() as db:
            row = db.one(
                "SELECT id FROM incidents WHERE rule = ? AND node = ? AND subject = ?"
                " AND status = 'open'", (rule, node, subject))
            if row is None:
                return None
            db.execute("UPDATE incidents SET status = 'closed', closed_at = ? WHERE id = ?",
                       (at, row["id"]))
            return int(row["id"])

    @staticmethod
    def _incident(row: Row) -> Incident:
        return Incident(
            id=row["id"], rule=row["rule"], node=row["node"], subject=row["subject"],
            gpu=row["gpu"], severity=row["severity"], status=row["status"],
            message=row["message"], observed_at=row["observed_at"],
            detected_at=row["detected_at"], closed_at=row["closed_at"], value=row["value"],
        )

    def get_incident(self, incident_id: int) -> Incident | None:
        """One incident, or None."""
        rows = self._query("SELECT * FROM incidents WHERE id = ?", (incident_id,))
        return self._incident(rows[0]) if rows else None

    def list_incidents(self, status: IncidentStatus | None = None, node: str | None = None,
                       limit: int = 100) -> list[Incident]:
        """Incidents, newest first, optionally only one status or one node."""
        where: list[str] = []
        args: list[Any] = []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if node is not None:
            where.append("node = ?")
            args.append(node)
        sql = "SELECT * FROM incidents"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._query(sql + " ORDER BY id DESC LIMIT ?", (*args, limit))
        return [self._incident(r) for r in rows]

    def count_closed_incidents(self, rule: str, node: str, subject: str, since: float) -> int:
        """How many closed incidents of (rule, node, subject) were detected since ``since``."""
        return int(self._query(
            "SELECT COUNT(*) AS n FROM incidents WHERE node = ? AND detected_at >= ?"
            " AND rule = ? AND subject = ? AND status = 'closed'",
            (node, since, rule, subject))[0]["n"])

    def open_incident_count(self) -> int:
        """How many incidents are open (``sn_incidents_open``)."""
        return int(self._query(
            "SELECT COUNT(*) AS n FROM incidents WHERE status = 'open'")[0]["n"])

    # -- actions ----------------------------------------------------------------------

    def record_action(self, request: ActionRequest, state: ActionState = "pending",
                      reason: str = "", *, at: float | None = None
                      ) -> tuple[ActionRecord, bool]:
        """Write the audit record for ``request`` before anything is done about it.

        Idempotent on ``request.key``: if an action with that key exists, nothing is
        written and ``(existing record, False)`` comes back. Committed durably (see the
        module docstring). ``at`` defaults to ``request.created_seconds``.
        """
        _check_state(state)
        when = request.created_seconds if at is None else at
        record = ActionRecord.from_request(request, state, reason, when)
        with self._tx(durable=True) as db:
            inserted = db.execute(
                "INSERT INTO actions (id, key, action, node, gpu, rule, incident_id,"
                " severity, reason, labels, params, requested_by, state, verdict_reason,"
                " created_at, updated_at, owner)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (record.id, record.key, record.action, record.node, record.gpu, record.rule,
                 record.incident_id, record.severity, record.reason, _dumps(record.labels),
                 _dumps(record.params), record.requested_by, record.state,
                 record.verdict_reason, when, when, record.owner),
            )
            if inserted == 1:
                return record, True
            row = db.one("SELECT * FROM actions WHERE key = ?", (request.key,))
        if row is None:
            raise StoreError(f"action id {request.id} is already used by another key")
        return self._action(row), False

    def update_action(self, action_id: str, *, at: float,
                      state: ActionState | None = None,
                      expect_state: ActionState | None = None,
                      verdict_reason: str | None = None,
                      attempts: int | None = None,
                      next_attempt_at: float | _Unset | None = _UNSET,
                      outcome_message: str | None = None,
                      outcome: Mapping[str, Any] | None = None,
                      refusal: Refusal | _Unset | None = _UNSET) -> ActionRecord:
        """Change the named columns of an action (the others stay); the new record.

        ``expect_state`` makes the update conditional (compare-and-set): when the action
        is no longer in that state, StoreError is raised and nothing is written.
        ``next_attempt_at=None`` clears the retry time, ``refusal=None`` the refusal.
        Committed durably.
        """
        sets: list[str] = ["updated_at = ?"]
        args: list[Any] = [at]
        if state is not None:
            _check_state(state)
            sets.append("state = ?")
            args.append(state)
        if verdict_reason is not None:
            sets.append("verdict_reason = ?")
            args.append(verdict_reason)
        if attempts is not None:
            sets.append("attempts = ?")
            args.append(attempts)
        if not isinstance(next_attempt_at, _Unset):
            sets.append("next_attempt_at = ?")
            args.append(next_attempt_at)
        if outcome_message is not None:
            sets.append("outcome_message = ?")
            args.append(outcome_message)
        if outcome is not None:
            sets.append("outcome = ?")
            args.append(_dumps(outcome))
        if not isinstance(refusal, _Unset):
            sets.append("refusal = ?")
            args.append(None if refusal is None else str(refusal))
        with self._tx(durable=True) as db:
            row = db.one("SELECT state FROM actions WHERE id = ?", (action_id,))
            if row is None:
                raise UnknownAction(f"no action {action_id!r}")
            if expect_state is not None and row["state"] != expect_state:
                raise StoreError(
                    f"action {action_id} is {row['state']}, not {expect_state}")
            db.execute(f"UPDATE actions SET {', '.join(sets)} WHERE id = ?",
                       (*args, action_id))
            new = db.one("SELECT * FROM actions WHERE id = ?", (action_id,))
        assert new is not None  # read in the transaction that found it
        return self._action(new)

    @staticmethod
    def _action(row: Row) -> ActionRecord:
        return ActionRecord(
            id=row["id"], key=row["key"], action=row["action"], node=row["node"],
            reason=row["reason"], state=row["state"], created_at=row["created_at"],
            updated_at=row["updated_at"], rule=row["rule"], incident_id=row["incident_id"],
            gpu=row["gpu"], severity=row["severity"], labels=json.loads(row["labels"]),
            params=json.loads(row["params"]), requested_by=row["requested_by"],
            verdict_reason=row["verdict_reason"], attempts=row["attempts"],
            next_attempt_at=row["next_attempt_at"], outcome_message=row["outcome_message"],
            outcome=json.loads(row["outcome"]),
            refusal=Refusal(row["refusal"]) if row["refusal"] else None, owner=row["owner"],
        )

    def get_action(self, action_id: str) -> ActionRecord | None:
        """One action by id, or None."""
        rows = self._query("SELECT * FROM actions WHERE id = ?", (action_id,))
        return self._action(rows[0]) if rows else None

    def get_action_by_key(self, key: str) -> ActionRecord | None:
        """One action by idempotency key, or None."""
        rows = self._query("SELECT * FROM actions WHERE key = ?", (key,))
        return self._action(rows[0]) if rows else None

    def list_actions(self, *, node: str | None = None, action: str | None = None,
                     state: str | None = None, rule: str | None = None,
                     owner: str | None = None, incident_id: int | None = None,
                     since: float | None = None, limit: int = 100) -> list[ActionRecord]:
        """Actions, newest first, filtered by any of the named columns.

        ``since`` keeps actions updated at or after that wall time.
        """
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("node", node), ("action", action), ("state", state),
                              ("rule", rule), ("owner", owner),
                              ("incident_id", incident_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("updated_at >= ?")
            args.append(since)
        sql = "SELECT * FROM actions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._query(sql + " ORDER BY created_at DESC,"
                           f" {self.db.insertion_order} DESC LIMIT ?",
                           (*args, limit))
        return [self._action(r) for r in rows]

    def count_evictions(self, node: str, since: float) -> int:
        """How many times ``node`` was taken out of service (an eviction that ran) since then."""
        return int(self._query(
            "SELECT COUNT(*) AS n FROM actions WHERE node = ? AND action = 'evict'"
            " AND state = 'succeeded' AND created_at >= ?", (node, since))[0]["n"])

    def actions_in_states(self, states: Iterable[str]) -> list[ActionRecord]:
        """Every action in one of ``states``, oldest first (resume after a restart)."""
        wanted = sorted(set(states))
        for state in wanted:
            _check_state(state)
        if not wanted:
            return []
        marks = ", ".join("?" for _ in wanted)
        rows = self._query(
            f"SELECT * FROM actions WHERE state IN ({marks})"
            f" ORDER BY created_at, {self.db.insertion_order}",
            wanted)
        return [self._action(r) for r in rows]

    # -- jobs and recoveries ------------------------------------------------------------

    def _replace(self, table: str, columns: Sequence[str], json_columns: Collection[str],
                 row: Any) -> None:
        """Insert or replace one dataclass row, keyed by ``columns[0]``.

        ``json_columns`` are encoded. Durable.
        """
        values = [_to_json(getattr(row, c)) if c in json_columns else getattr(row, c)
                  for c in columns]
        marks = ", ".join("?" for _ in columns)
        with self._tx(durable=True) as db:
            db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
                       f" ON CONFLICT ({columns[0]}) DO UPDATE SET "
                       + ", ".join(f"{c} = excluded.{c}" for c in columns[1:]), values)

    def save_job(self, row: JobRow) -> None:
        """Insert or replace a job's row. Committed durably (it carries recovery state)."""
        self._replace("jobs", _JOB_COLUMNS, _JOB_JSON, row)

    @staticmethod
    def _job(row: Row) -> JobRow:
        values = {c: _from_json(row[c]) if c in _JOB_JSON else row[c] for c in _JOB_COLUMNS}
        return JobRow(**values)

    def get_job(self, name: str) -> JobRow | None:
        """One job, or None."""
        rows = self._query("SELECT * FROM jobs WHERE name = ?", (name,))
        return self._job(rows[0]) if rows else None

    def list_jobs(self) -> list[JobRow]:
        """Every job, by name."""
        return [self._job(r) for r in self._query("SELECT * FROM jobs ORDER BY name")]

    def delete_job(self, name: str) -> bool:
        """Forget a job (its recoveries stay, as history). True if it existed."""
        with self._tx(durable=True) as db:
            return db.execute("DELETE FROM jobs WHERE name = ?", (name,)) > 0

    def save_recovery(self, row: RecoveryRow) -> None:
        """Insert or replace a recovery's row. Committed durably: written before acting."""
        self._replace("recoveries", _RECOVERY_COLUMNS, _RECOVERY_JSON, row)

    @staticmethod
    def _recovery(row: Row) -> RecoveryRow:
        values = {c: _from_json(row[c]) if c in _RECOVERY_JSON else row[c]
                  for c in _RECOVERY_COLUMNS}
        values["incident_ids"] = tuple(int(i) for i in values["incident_ids"])
        return RecoveryRow(**values)

    def get_recovery(self, recovery_id: str) -> RecoveryRow | None:
        """One recovery, or None."""
        rows = self._query("SELECT * FROM recoveries WHERE id = ?", (recovery_id,))
        return self._recovery(rows[0]) if rows else None

    def list_recoveries(self, *, job: str | None = None,
                        states: Iterable[str] | None = None,
                        limit: int = 1000) -> list[RecoveryRow]:
        """Recoveries, oldest first (the newest ``limit``), optionally of one job / states."""
        where: list[str] = []
        args: list[Any] = []
        if job is not None:
            where.append("job = ?")
            args.append(job)
        if states is not None:
            wanted = sorted(set(states))
            if not wanted:
                return []
            where.append(f"state IN ({', '.join('?' for _ in wanted)})")
            args.extend(wanted)
        sql = "SELECT * FROM recoveries"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._query(
            f"SELECT * FROM ({sql} ORDER BY created_at DESC, id DESC LIMIT ?) AS newest"
            " ORDER BY created_at, id", (*args, limit))
        return [self._recovery(r) for r in rows]

    # -- meta -------------------------------------------------------------------------

    # ------------------------------------------------------------------ events

    def record_events(self, node: str, events: Iterable[EventRecord], at: float) -> int:
        """Store reported events durably; a retried event is stored once. How many were new."""
        return len(self.record_event_batches([(node, tuple(events), at)]))

    def record_event_batches(self, batches: Sequence[tuple[str, Sequence[EventRecord], float]]
                             ) -> list[EventRecord]:
        """Several reports' events (node, events, receive time) in one durable transaction.

        Returns the events that were new (a retried event is stored once).
        """
        rows = [((node, e.id, e.kind, e.source, e.time_seconds, at, e.gpu, e.code,
                  e.pci_bus_id, e.device, e.message), e)
                for node, events, at in batches for e in events]
        if not rows:
            return []
        with self._tx(durable=True) as db:
            return [event for row, event in rows if db.execute(
                "INSERT INTO events (node, event_id, kind, source, time, received_at,"
                " gpu, code, pci_bus_id, device, message) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT DO NOTHING", row)]

    def list_events(self, node: str | None = None, kind: str | None = None,
                    limit: int = 100) -> list[dict[str, Any]]:
        """Recent events, newest first."""
        where, args = [], []
        if node is not None:
            where.append("node = ?")
            args.append(node)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        sql = "SELECT * FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        return [{k: v for k, v in dict(row).items() if k != "seq"}  # PostgreSQL's rowid
                for row in self._query(sql, (*args, limit))]

    def count_events(self, node: str | None = None) -> int:
        """How many events are stored (for one node)."""
        if node is None:
            return int(self._query("SELECT COUNT(*) AS n FROM events")[0]["n"])
        return int(self._query("SELECT COUNT(*) AS n FROM events WHERE node = ?",
                               (node,))[0]["n"])

    def get_meta(self, key: str) -> str | None:
        """A value the controller kept across restarts (e.g. the breaker's state)."""
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0]["value"]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        """Keep ``value`` under ``key`` across restarts."""
        with self._tx() as db:
            db.execute("INSERT INTO meta (key, value) VALUES (?, ?)"
                       " ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

    def delete_meta(self, key: str) -> None:
        """Forget ``key``."""
        with self._tx() as db:
            db.execute("DELETE FROM meta WHERE key = ?", (key,))
