"""Calls that need the store, and what the controller knows of the store's health.

A store that takes no writes means no audit record, and without a record the controller
does not act: such a call is skipped, logged once, remembered (``/healthz`` says so, and
the sweep probes until the store takes writes again). A conflict (a record changed
meanwhile) is logged and skipped too, but says nothing about the disk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sn_monitor.controller.storage.store import StoreError, StoreUnavailable

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")


class StoreHealth:
    """Whether the store takes writes; :meth:`attempt` makes a call that needs it."""

    def __init__(self) -> None:
        #: Why the store took no write last (None: it takes them).
        self.error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def attempt(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
                ) -> _T | None:
        """``fn(*args, **kwargs)``, or None if the store refused it (logged, remembered)."""
        try:
            return fn(*args, **kwargs)
        except StoreUnavailable as err:
            if self.error is None:
                log.error("store unavailable, refusing to act without a record: %s", err)
            self.error = str(err)
        except StoreError as err:  # a conflict (a record changed meanwhile), not the disk
            log.error("store refused %s: %s", getattr(fn, "__name__", fn), err)
        return None

    def recovered(self) -> None:
        """A probe write went through: the store takes writes again."""
        self.error = None
