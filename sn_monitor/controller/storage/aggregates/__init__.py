"""The store's rows, one module per aggregate, each a part of :class:`~..store.Store`.

``nodes`` (nodes and their state transitions), ``incidents``, ``actions`` (the audit
trail), ``jobs``, ``recoveries``, ``events`` (what the agents reported), ``meta`` (values
kept across restarts) and ``lease`` (the controllers' lease): each defines its row type
and a class of the queries on its tables. ``base`` holds what they share: the
database, the lease fence every write checks, and the reads built by
``storage/query.py``; ``columns`` the encoding of JSON columns. ``Store`` inherits
them all, so that callers see one object with one fence.

May import ``database/``, ``query`` and the vocabulary (``audit``, ``model``); never
``store``, ``writer`` or ``health``, and no aggregate another (``.importlinter``:
``storage-layers``, ``store-aggregates``).
"""
