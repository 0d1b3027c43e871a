"""Carries out the commands the controller put in its reply to a report.

``throttle`` and ``release`` go through the :class:`ThermalGuard`'s bookkeeping rather
than straight to NVML, so the operator's limit is saved before the first change and
put back by a release, at agent stop or after a crash, whoever capped the GPU (see
:mod:`sn_monitor.agent.guard` for how the guard and the controller share a cap).

``checkpoint`` is not the agent's to do: the job's client library takes checkpoints, and
the controller reaches it through the job's control webhook. An agent that receives one
answers ``ok=False`` with "not handled by the agent", so a misrouted command shows up in
the controller's audit trail instead of being silently swallowed.

Each command id is carried out once. The controller resends a command whose result it
has not seen (the report carrying the result may have been lost); a repeat gets the
stored result again, and nothing is done twice. The last :data:`REMEMBERED_COMMANDS`
ids are remembered.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

from sn_monitor.agent.guard import CapOutcome, ThermalGuard
from sn_monitor.clock import Clock
from sn_monitor.model import Command, CommandResult

log = logging.getLogger(__name__)

REMEMBERED_COMMANDS = 1024
_MAX_MESSAGE = 4096


class CommandExecutor:
    """Turns :class:`Command` into guard actions and :class:`CommandResult` records.

    ``dry_run`` (the agent's) reports what each command would do and changes nothing.
    """

    def __init__(
        self,
        guard: ThermalGuard,
        clock: Clock,
        *,
        dry_run: bool = False,
        remember: int = REMEMBERED_COMMANDS,
    ) -> None:
        self._guard = guard
        self._clock = clock
        self._dry_run = dry_run
        self._remember = remember
        self._done: OrderedDict[str, CommandResult] = OrderedDict()

    def execute(self, commands: Sequence[Command]) -> list[CommandResult]:
        """Carry out ``commands`` in order; one result per command, for the next report."""
        results: list[CommandResult] = []
        for command in commands:
            previous = self._done.get(command.id)
            if previous is not None:
                log.info("command %s already carried out: resending its result", command.id)
                self._done.move_to_end(command.id)
                results.append(previous)
                continue
            result = self._execute(command)
            self._done[command.id] = result
            while len(self._done) > self._remember:
                self._done.popitem(last=False)
            level = logging.INFO if result.ok else logging.WARNING
            log.log(level, "command %s (%s): %s", command.id, command.kind, result.message,
                    extra={"gpu": command.gpu} if command.gpu is not None else None)
            results.append(result)
        return results

    def _execute(self, command: Command) -> CommandResult:
        if command.kind == "throttle":
            return self._throttle(command)
        if command.kind == "release":
            return self._release(command)
        if command.kind == "checkpoint":
            return self._result(command, False, "checkpoint is not handled by the agent: "
                                                "the job's client takes checkpoints")
        return self._result(command, False, f"unknown command kind {command.kind!r}")

    def _targets(self, command: Command) -> list[int] | str:
        """The GPUs a command names, or why it names none."""
        known = self._guard.known_gpus()
        if command.gpu is None:
            return known if known else "no GPU on this node"
        if command.gpu not in known:
            return f"GPU {command.gpu} is not present on this node"
        return [command.gpu]

    def _throttle(self, command: Command) -> CommandResult:
        if (command.power_watts is None) == (command.power_fraction is None):
            return self._result(command, False,
                                "throttle needs exactly one of power_watts and power_fraction")
        if command.power_watts is not None and command.power_watts <= 0:
            return self._result(command, False, "power_watts must be greater than 0")
        targets = self._targets(command)
        if isinstance(targets, str):
            return self._result(command, False, targets)
        reason = command.reason or f"controller command {command.id}"
        outcomes: list[CapOutcome] = []
        for gpu in targets:
            watts = command.power_watts
            if watts is None:
                default = self._guard.default_limit_watts(gpu)
                if default is None:
                    outcomes.append(CapOutcome(False, f"GPU {gpu}: default power limit unknown"))
                    continue
                watts = (command.power_fraction or 1.0) * default
            outcomes.append(self._guard.apply_cap(gpu, watts, reason, dry_run=self._dry_run))
        return self._combine(command, outcomes)

    def _release(self, command: Command) -> CommandResult:
        targets = self._targets(command)
        if isinstance(targets, str):
            return self._result(command, False, targets)
        reason = command.reason or f"controller command {command.id}"
        outcomes = [self._guard.release(gpu, reason, dry_run=self._dry_run) for gpu in targets]
        return self._combine(command, outcomes)

    def _combine(self, command: Command, outcomes: Sequence[CapOutcome]) -> CommandResult:
        ok = all(o.ok for o in outcomes)
        dry_run = any(o.dry_run for o in outcomes)
        return self._result(command, ok, "; ".join(o.message for o in outcomes), dry_run)

    def _result(
        self, command: Command, ok: bool, message: str, dry_run: bool = False
    ) -> CommandResult:
        return CommandResult(
            id=command.id,
            ok=ok,
            time_seconds=self._clock.time(),
            message=message[:_MAX_MESSAGE],
            dry_run=dry_run or self._dry_run,
        )
