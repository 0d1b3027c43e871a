"""Driver calls with a backstop timeout, and the calls that outlived it.

A driver call runs in its own (daemon) thread and the worker waits ``timeout`` for it.
Python cannot stop a thread, so a call that timed out may still be running (or may
still succeed): it is kept, abandoned, until the action's next attempt looks at it
(:meth:`DriverCalls.abandoned`) and lets it go (:meth:`DriverCalls.forget`).

Imports the drivers' vocabulary and the audit records only.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from sn_monitor.controller.actions.base import Driver, Outcome
from sn_monitor.controller.audit import ActionRequest


class DriverCalls:
    """Runs driver calls, each waited on for ``timeout`` seconds; keeps those that timed out."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._abandoned: dict[str, Future[Outcome]] = {}  # timed-out calls still running

    def run(self, driver: Driver, request: ActionRequest, action_id: str) -> Outcome:
        """``driver.run(request)``: its outcome, or the error it raised.

        Raises :class:`concurrent.futures.TimeoutError` when the call took longer than
        ``timeout``; the call is then kept as the action's abandoned call.
        """
        call: Future[Outcome] = Future()
        thread = threading.Thread(target=_call, args=(driver, request, call),
                                  name=f"sn-driver-{action_id}", daemon=True)
        thread.start()
        try:
            return call.result(timeout=self.timeout)
        except FutureTimeout:
            with self._lock:
                self._abandoned[action_id] = call
            raise

    def abandoned(self, action_id: str) -> Future[Outcome] | None:
        """The action's call that timed out (it may still be running), if any."""
        with self._lock:
            return self._abandoned.get(action_id)

    def forget(self, action_id: str) -> None:
        """The action's abandoned call has returned and was looked at."""
        with self._lock:
            del self._abandoned[action_id]


def _call(driver: Driver, request: ActionRequest, result: Future[Outcome]) -> None:
    """The driver call, in its own thread; every result or error goes to ``result``."""
    if not result.set_running_or_notify_cancel():
        return
    try:
        result.set_result(driver.run(request))
    except BaseException as err:  # noqa: BLE001 -- handed to the worker, which classifies it
        result.set_exception(err)
