"""The store: nodes, incidents, actions, jobs, recoveries, events, the lease.

``store`` over a ``database/`` backend (SQLite or PostgreSQL), the ``writer`` thread that
takes store writes off the report path, and ``health`` (is the store taking writes).
Imports only the vocabulary (``audit``, ``errors``).
"""
