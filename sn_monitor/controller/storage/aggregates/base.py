"""What every aggregate of the store shares: the database, the fence, reads and upserts.

Fencing. Once ``StoreBase._fence`` is set (by ``fence``, in ``lease.py``), every write
transaction opened with :meth:`StoreBase._tx` first checks that the lease row still
names that holder and epoch, and raises :class:`Fenced` otherwise, before anything is
written. The lease's own transactions (``aggregates/lease.py``) are not fenced: they
are how a controller takes the lease.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

from sn_monitor.controller.storage.aggregates.columns import to_json
from sn_monitor.controller.storage.database.base import Database, Fenced, Row, Transaction
from sn_monitor.controller.storage.query import Select

#: The one lease row's name (a table keyed by name leaves room for more).
LEASE_NAME: Final = "controller"


class StoreBase:
    """The database and the fence; the plumbing the aggregates' queries run on."""

    db: Database
    _fence: tuple[str, int] | None = None

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

    def _select(self, select: Select) -> list[Row]:
        """The rows of a built query ([] without asking when it matches nothing)."""
        if select.matches_nothing:
            return []
        return self.db.query(*select.statement())

    def _count(self, select: Select) -> int:
        """The ``n`` of a ``Select(table, "COUNT(*) AS n")``."""
        if select.matches_nothing:
            return 0
        return int(self._select(select)[0]["n"])

    def _replace(self, table: str, columns: Sequence[str], json_columns: Collection[str],
                 row: Any) -> None:
        """Insert or replace one dataclass row, keyed by ``columns[0]``.

        ``json_columns`` are encoded. Durable.
        """
        values = [to_json(getattr(row, c)) if c in json_columns else getattr(row, c)
                  for c in columns]
        marks = ", ".join("?" for _ in columns)
        with self._tx(durable=True) as db:
            db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
                       f" ON CONFLICT ({columns[0]}) DO UPDATE SET "
                       + ", ".join(f"{c} = excluded.{c}" for c in columns[1:]), values)
