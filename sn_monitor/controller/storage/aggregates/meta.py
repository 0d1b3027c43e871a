"""Meta: small values the controller keeps across restarts (e.g. the breaker's state)."""

from __future__ import annotations

from sn_monitor.controller.storage.aggregates.base import StoreBase


class MetaStore(StoreBase):
    """The ``meta`` table: text values by key (not durable)."""

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
