"""The store's schema: every table and index, as the migrations that built them.

``MIGRATIONS[i]`` is the DDL (``;``-separated, in SQLite's spelling; the PostgreSQL
backend translates it) that takes a database from schema version i to i + 1; a backend
runs the steps a database lacks, in order, inside one transaction, and records the new
version (SQLite's ``PRAGMA user_version``, PostgreSQL's ``sn_schema`` table). A step,
once released, never changes: a database written by an older sn-monitor must end up
with exactly the tables of a new one. A change of schema is a new step at the end and
a new :data:`SCHEMA_VERSION`.

Imports nothing: it is data.
"""

from __future__ import annotations

from typing import Final

#: The schema this code writes; older files are migrated on open, newer ones refused.
SCHEMA_VERSION: Final = 5

#: 0 -> 1: nodes and their transitions, incidents, actions, meta, reported events
FIRST_SCHEMA: Final = """
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
    """

#: 1 -> 2: training jobs and their recoveries (sn_monitor.controller.jobs.orchestrator)
JOBS_AND_RECOVERIES: Final = """
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
    """

#: 2 -> 3: the lease of a pair of controllers (sn_monitor.controller.ha)
CONTROLLER_LEASE: Final = """
    CREATE TABLE controller_lease (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        acquired_at REAL NOT NULL,
        renewed_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    """

#: 3 -> 4: a refusal's typed reason, and the process (job recovery) an action belongs to
ACTION_REFUSAL_AND_OWNER: Final = """
    ALTER TABLE actions ADD COLUMN refusal TEXT;
    ALTER TABLE actions ADD COLUMN owner TEXT;
    CREATE INDEX actions_owner ON actions (owner);
    """

#: 4 -> 5: an incident's actions by its id (GET /api/v1/incidents/ID), however old
ACTIONS_BY_INCIDENT: Final = """
    CREATE INDEX actions_incident ON actions (incident_id, created_at);
    """

#: ``MIGRATIONS[i]`` takes a database from version i to i + 1, in this order.
MIGRATIONS: Final[tuple[str, ...]] = (
    FIRST_SCHEMA,
    JOBS_AND_RECOVERIES,
    CONTROLLER_LEASE,
    ACTION_REFUSAL_AND_OWNER,
    ACTIONS_BY_INCIDENT,
)
