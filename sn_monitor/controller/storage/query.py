"""The one way the store builds a filtered read: ``SELECT … WHERE … ORDER BY … LIMIT ?``.

The ``list_*`` and ``count_*`` methods take optional filters (a column equal to a value,
at least a value, one of several values); :class:`Select` turns the filters given into
the WHERE clause and its arguments. Values are only ever arguments (``?`` placeholders,
which both backends take: PostgreSQL's turns them into ``%s``), never part of the SQL
text; table, column and ORDER BY names come from the store's own code, never from a
caller's input.

Imports nothing of the controller.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


class Select:
    """One SELECT over one table, built up by chained calls.

    ``Select("actions").equal("node", node).order_by("created_at DESC").limit(100)``;
    :meth:`statement` gives the SQL and its arguments. A filter whose value is None is
    left out (the caller did not ask for it). :attr:`matches_nothing` is True once
    :meth:`one_of` was given no values: the caller answers "none" without asking the
    database (``IN ()`` is not SQL).
    """

    def __init__(self, table: str, columns: str = "*") -> None:
        self._table = table
        self._columns = columns
        self._where: list[str] = []
        self._args: list[Any] = []
        self._order: tuple[str, ...] = ()
        self._limit: int | None = None
        self.matches_nothing = False

    def equal(self, column: str, value: Any) -> Select:
        """Keep rows whose ``column`` is ``value`` (no filter if ``value`` is None)."""
        return self._add(f"{column} = ?", value)

    def at_least(self, column: str, value: Any) -> Select:
        """Keep rows whose ``column`` is ``value`` or more (no filter if None)."""
        return self._add(f"{column} >= ?", value)

    def one_of(self, column: str, values: Collection[Any] | None) -> Select:
        """Keep rows whose ``column`` is one of ``values`` (sorted, once each); None: all."""
        if values is None:
            return self
        wanted = sorted(set(values))
        if not wanted:
            self.matches_nothing = True
            return self
        self._where.append(f"{column} IN ({', '.join('?' for _ in wanted)})")
        self._args.extend(wanted)
        return self

    def order_by(self, *terms: str) -> Select:
        """Order by these terms (``"created_at DESC"``), first one first."""
        self._order = terms
        return self

    def limit(self, count: int) -> Select:
        """At most ``count`` rows (after the order)."""
        self._limit = count
        return self

    def statement(self) -> tuple[str, tuple[Any, ...]]:
        """The SQL and its arguments, in placeholder order."""
        sql = f"SELECT {self._columns} FROM {self._table}"
        args = list(self._args)
        if self._where:
            sql += " WHERE " + " AND ".join(self._where)
        if self._order:
            sql += " ORDER BY " + ", ".join(self._order)
        if self._limit is not None:
            sql += " LIMIT ?"
            args.append(self._limit)
        return sql, tuple(args)

    def reordered(self, *terms: str) -> tuple[str, tuple[Any, ...]]:
        """The rows of this query (the newest ``limit``, say) in another order."""
        sql, args = self.statement()
        return f"SELECT * FROM ({sql}) AS newest ORDER BY {', '.join(terms)}", args

    def _add(self, clause: str, value: Any) -> Select:
        if value is not None:
            self._where.append(clause)
            self._args.append(value)
        return self
