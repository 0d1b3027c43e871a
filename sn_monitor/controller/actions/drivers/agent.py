"""Commands for agents (throttle, release, checkpoint), delivered in report replies.

Agents have no inbound port for commands: the controller answers each report with the
commands queued for that node (DESIGN, data flow). So the "driver" for agent actions
only queues; delivery and acknowledgement happen on the report path:

1. :meth:`AgentCommandDriver.run` turns an action into a :class:`~sn_monitor.model.Command`
   whose id is the action id, and :meth:`AgentCommandQueue.put` queues it for the node.
2. Each report's handler calls :meth:`AgentCommandQueue.take` and puts the commands in
   the reply. A taken command stays *in flight*: if no result comes back within
   ``redeliver_after`` (the reply was lost, the agent restarted) the next ``take`` sends
   it again. Agents must therefore treat command ids idempotently.
3. The agent reports :class:`~sn_monitor.model.CommandResult` entries in a later report;
   the handler calls :meth:`AgentCommandQueue.complete`, which removes the commands,
   keeps the results (:meth:`AgentCommandQueue.result`) and calls ``on_result`` so the
   controller can close the action in its audit trail.

A command nobody collects (the node is gone) expires after ``expire_after`` and is
completed with a synthetic failed result, so its action does not stay open forever.
The queue lives in memory: after a controller restart :meth:`AgentCommandDriver.reconcile`
says "not done" and the runner queues the command again.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, cast

from sn_monitor.clock import Clock, SystemClock
from sn_monitor.config import Duration, at_least_one, fraction, positive, setting
from sn_monitor.controller.actions.base import Outcome, PermanentError, TemporaryError
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.model import Command, CommandKind, CommandResult

log = logging.getLogger(__name__)

#: ``on_result(node, result)``: called once per completed command, outside the lock.
ResultCallback = Callable[[str, CommandResult], None]


@dataclass(frozen=True)
class AgentQueueSettings:
    """Bounds and timers of the per-node command queues.

    ``redeliver_after`` should be a few report intervals: long enough for the agent to
    act and report back, short enough that a lost reply costs little.
    """

    max_per_node: int = setting(default=32, check=at_least_one)
    redeliver_after: Duration = setting(default=Duration(10.0), check=positive)
    expire_after: Duration = setting(default=Duration(600.0), check=positive)
    results_kept: int = setting(default=10_000, check=at_least_one)
    #: Throttle to this fraction of the default power limit when the action says nothing.
    power_fraction: float = setting(default=0.7, check=fraction)


@dataclass
class _Entry:
    command: Command
    queued_seconds: float
    delivered_seconds: float | None = None  # monotonic time of the last take()
    deliveries: int = 0


class AgentCommandQueue:
    """Per-node queues of commands, with redelivery until acknowledged. Thread-safe."""

    def __init__(self, settings: AgentQueueSettings | None = None, *,
                 clock: Clock | None = None, on_result: ResultCallback | None = None) -> None:
        self.settings = settings or AgentQueueSettings()
        self.clock = clock or SystemClock()
        self.on_result = on_result
        self._lock = threading.Lock()
        self._queues: dict[str, OrderedDict[str, _Entry]] = {}
        self._results: OrderedDict[str, CommandResult] = OrderedDict()

    def put(self, node: str, command: Command) -> bool:
        """Queue ``command`` for ``node``; False when that id is already queued.

        Raises TemporaryError when the node's queue is full (the node is not taking its
        commands; it may come back).
        """
        with self._lock:
            queue = self._queues.setdefault(node, OrderedDict())
            if command.id in queue:
                return False
            if len(queue) >= self.settings.max_per_node:
                raise TemporaryError(
                    f"command queue for {node} is full ({len(queue)} not acknowledged)",
                    retry_after=self.settings.redeliver_after)
            queue[command.id] = _Entry(command, self.clock.monotonic())
            return True

    def take(self, node: str) -> list[Command]:
        """Commands for ``node``'s reply: new ones, and in-flight ones now overdue."""
        if node not in self._queues:  # every report asks; almost always nothing is queued
            return []
        now = self.clock.monotonic()
        expired = self._expire(node, now)
        out: list[Command] = []
        with self._lock:
            for entry in self._queues.get(node, {}).values():
                last = entry.delivered_seconds
                if last is None or now - last >= self.settings.redeliver_after:
                    if last is not None:
                        log.info("agent: re-delivering command %s to %s (attempt %d)",
                                 entry.command.id, node, entry.deliveries + 1,
                                 extra={"node": node})
                    entry.delivered_seconds = now
                    entry.deliveries += 1
                    out.append(entry.command)
        self._notify(node, expired)
        return out

    def complete(self, node: str, results: Iterable[CommandResult]) -> list[str]:
        """Acknowledge ``results`` from ``node``; returns the ids that were pending.

        Results for ids not pending (a duplicate report, a queue lost in a restart) are
        ignored: each command's result is reported to ``on_result`` once.
        """
        done: list[CommandResult] = []
        with self._lock:
            queue = self._queues.get(node)
            for result in results:
                if queue is None or queue.pop(result.id, None) is None:
                    log.debug("agent: result for unknown command %s from %s", result.id, node)
                    continue
                self._keep(result)
                done.append(result)
            if queue is not None and not queue:
                del self._queues[node]
        self._notify(node, done)
        return [r.id for r in done]

    def result(self, command_id: str) -> CommandResult | None:
        """The agent's result for ``command_id`` (kept for the last ``results_kept``)."""
        with self._lock:
            return self._results.get(command_id)

    def pending(self, node: str) -> list[Command]:
        """Commands queued or in flight for ``node``, oldest first."""
        with self._lock:
            return [e.command for e in self._queues.get(node, {}).values()]

    def is_pending(self, command_id: str) -> bool:
        """Whether ``command_id`` is queued or in flight for any node."""
        with self._lock:
            return any(command_id in queue for queue in self._queues.values())

    def _expire(self, node: str, now: float) -> list[CommandResult]:
        """Drop ``node``'s commands older than ``expire_after``, as failed results."""
        limit = self.settings.expire_after
        expired: list[CommandResult] = []
        with self._lock:
            queue = self._queues.get(node)
            if queue is None:
                return expired
            for command_id in [i for i, e in queue.items() if now - e.queued_seconds >= limit]:
                entry = queue.pop(command_id)
                result = CommandResult(
                    id=command_id, ok=False, time_seconds=self.clock.time(),
                    message=f"expired: not acknowledged by {node} within {limit:g}s "
                            f"({entry.deliveries} deliveries)")
                self._keep(result)
                expired.append(result)
        for result in expired:
            log.warning("agent: %s", result.message, extra={"node": node})
        return expired

    def _keep(self, result: CommandResult) -> None:
        self._results[result.id] = result
        self._results.move_to_end(result.id)
        while len(self._results) > self.settings.results_kept:
            self._results.popitem(last=False)

    def _notify(self, node: str, results: list[CommandResult]) -> None:
        callback = self.on_result
        if callback is None:
            return
        for result in results:
            callback(node, result)


#: The actions an agent carries out itself (a command of the same kind).
_AGENT_KINDS: Final = frozenset({"throttle", "release", "checkpoint", "reset_gpu", "reboot",
                                 "verify"})


def command_for(request: ActionRequest, default_fraction: float = 0.7) -> Command:
    """The agent command for an action an agent carries out (:data:`_AGENT_KINDS`).

    Throttle takes ``params["power_watts"]`` if given, else ``params["power_fraction"]``
    (default ``default_fraction``) of the GPU's default limit; ``request.gpu`` None means
    every GPU on the node. Bad parameters are permanent errors.
    """
    kind: CommandKind
    if request.action in _AGENT_KINDS:
        kind = cast(CommandKind, request.action)
    else:
        raise PermanentError(f"agents cannot {request.action}")
    if kind == "reset_gpu" and request.gpu is None:
        raise PermanentError("reset_gpu needs a GPU (the ladder resets one GPU at a time)")
    if len(request.id) > 128 or not request.id:
        raise PermanentError("an agent command id must be 1-128 characters")
    watts: float | None = None
    fraction: float | None = None
    if kind == "throttle":
        watts = _number(request.params.get("power_watts"), "power_watts")
        if watts is not None and watts <= 0:
            raise PermanentError(f"power_watts must be positive, got {watts}")
        if watts is None:
            fraction = _number(request.params.get("power_fraction"), "power_fraction")
            fraction = default_fraction if fraction is None else fraction
            if not 0 < fraction <= 1:
                raise PermanentError(f"power_fraction must be in (0, 1], got {fraction}")
    return Command(id=request.id, kind=kind, gpu=request.gpu, power_watts=watts,
                   power_fraction=fraction, reason=request.reason[:4096])


def _number(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PermanentError(f"{name} must be a number, got {value!r}")
    return float(value)


class AgentCommandDriver:
    """An agent's own actions on its node (:data:`_AGENT_KINDS`), through the command queue."""

    name = "agent"
    #: The command id is the action id, and put() ignores an id already queued.
    idempotent = True
    actions = _AGENT_KINDS

    def __init__(self, queue: AgentCommandQueue) -> None:
        self.queue = queue

    def run(self, request: ActionRequest) -> Outcome:
        """Queue the command; the agent gets it in the reply to its next report."""
        if not request.node:
            raise PermanentError(f"{request.action} needs a node")
        command = command_for(request, self.queue.settings.power_fraction)
        added = self.queue.put(request.node, command)
        return Outcome(
            f"queued for agent on {request.node}" if added
            else f"already queued for agent on {request.node}",
            {"command_id": command.id, "kind": command.kind, "queued": added},
        )

    def result(self, command_id: str) -> CommandResult | None:
        """The agent's result for the command of action ``command_id``, once reported."""
        return self.queue.result(command_id)

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Done if the agent reported success or the command is still on its way."""
        result = self.queue.result(request.id)
        if result is not None:
            return result.ok
        return self.queue.is_pending(request.id)
