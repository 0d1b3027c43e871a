"""The lease: which of a pair of controllers is active, and its fencing epoch.

Its transactions are durable (a lease granted must survive the database's crash) and
not fenced: they are how a controller takes the lease. See ``sn_monitor.controller.ha``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sn_monitor.controller.storage.aggregates.base import LEASE_NAME, StoreBase


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


class LeaseStore(StoreBase):
    """The ``controller_lease`` table: take, renew, release, read."""

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
