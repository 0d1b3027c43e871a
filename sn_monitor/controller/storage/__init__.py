"""The store: nodes, incidents, actions, jobs, recoveries, events, the lease.

``store`` (the one object callers use) over a ``database/`` backend (SQLite or
PostgreSQL); its queries in ``aggregates/`` (one module per aggregate: nodes, incidents,
actions, jobs, recoveries, events, meta, lease), built with ``query`` (the one
filtered-SELECT builder); the tables in ``schema`` (the migrations, in order); the
``writer`` thread that takes store writes off the report path, and ``health`` (is the
store taking writes). Imports only the vocabulary (``audit``, ``errors``, ``model``).
"""
