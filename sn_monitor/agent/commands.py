"""Carries out the commands the controller put in its reply to a report.

``throttle`` and ``release`` go through the :class:`ThermalGuard`'s bookkeeping rather
than straight to NVML, so the operator's limit is saved before the first change and
put back by a release, at agent stop or after a crash, whoever capped the GPU (see
:mod:`sn_monitor.agent.guard` for how the guard and the controller share a cap).

``checkpoint`` is not the agent's to do: the job's client library takes checkpoints, and
the controller reaches it through the job's control webhook. An agent that receives one
answers ``ok=False`` with "not handled by the agent", so a misrouted command shows up in
the controller's audit trail instead of being silently swallowed.

``reset_gpu``, ``reboot`` and ``verify`` (the remediation ladder and the return-to-service
check, :class:`Remedies`) take seconds to minutes, so they run one at a time on a
worker thread of their own, never on the report thread: reports (and the node's
heartbeat) go on meanwhile, and each result is handed to the report after it finishes
(:meth:`CommandExecutor.finished`). ``reset_gpu`` is refused while a process uses the
GPU, ``reboot`` while a process uses any GPU of the node; reset and reboot are dry runs
unless ``remediation.mode`` is ``enforce``; a reboot is logged and recorded in the state
directory before it runs (:class:`~sn_monitor.agent.remedy.RebootLedger`). ``verify``
changes nothing, so it runs in every mode.

Each command id is carried out once. The controller resends a command whose result it
has not seen (the report carrying the result may have been lost, or the command is
still running); a repeat gets the stored result again, or nothing while it runs, and
nothing is done twice. The last :data:`REMEMBERED_COMMANDS` ids are remembered.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sn_monitor.agent.guard import CapOutcome, ThermalGuard
from sn_monitor.agent.nvml import GpuUnreachable, NvmlError
from sn_monitor.agent.remedy import Actuator, RebootLedger
from sn_monitor.agent.settings import RemediationSettings
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.agent.verify import GpuCountMemory, summary, verify_node
from sn_monitor.clock import Clock
from sn_monitor.model import CheckResult, Command, CommandResult

log = logging.getLogger(__name__)

REMEMBERED_COMMANDS = 1024
_MAX_MESSAGE = 4096
#: The kinds that run on the worker thread, one at a time.
SLOW_KINDS = frozenset({"reset_gpu", "reboot", "verify"})


@dataclass
class Remedies:
    """What ``reset_gpu``, ``reboot`` and ``verify`` need.

    ``running_pids(gpu)``: :meth:`~sn_monitor.agent.nvml.NvmlLibrary.running_pids`.
    ``reboots``: where reboots are recorded before they run (None: not recorded, a
    repeated command after the restart would reboot again: tests and the simulator).
    """

    settings: RemediationSettings
    actuator: Actuator
    running_pids: Callable[[int], tuple[int, ...]]
    reboots: RebootLedger | None = None
    gpu_count: GpuCountMemory = field(default_factory=lambda: GpuCountMemory(None))


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
        remedies: Remedies | None = None,
    ) -> None:
        self._guard = guard
        self._clock = clock
        self._dry_run = dry_run
        self._remember = remember
        self._remedies = remedies
        self._lock = threading.Condition()
        self._done: OrderedDict[str, CommandResult] = OrderedDict()
        self._queue: deque[Command] = deque()
        self._running: set[str] = set()
        self._finished: list[CommandResult] = []
        self._latest: NodeSnapshot | None = None
        self._stopping = False
        self._worker: threading.Thread | None = None

    def execute(self, commands: Sequence[Command]) -> list[CommandResult]:
        """Carry out ``commands`` in order; one result per command, for the next report.

        The slow kinds (:data:`SLOW_KINDS`) are queued for the worker and answer
        nothing now: their results come from :meth:`finished`.
        """
        results: list[CommandResult] = []
        for command in commands:
            with self._lock:
                previous = self._done.get(command.id)
                if previous is not None:
                    self._done.move_to_end(command.id)
                running = command.id in self._running
            if previous is not None:
                log.info("command %s already carried out: resending its result", command.id)
                results.append(previous)
                continue
            if running:
                log.debug("command %s (%s) is still running", command.id, command.kind)
                continue
            if command.kind in SLOW_KINDS and self._remedies is not None:
                refusal = self._precheck(command)
                if refusal is None:
                    self._submit(command)
                    continue
                result = refusal
            else:
                result = self._execute(command)
            self._store(command, result)
            results.append(result)
        return results

    def finished(self) -> list[CommandResult]:
        """The results of slow commands finished since the last call (report thread)."""
        with self._lock:
            done, self._finished = self._finished, []
        return done

    def observe(self, snapshot: NodeSnapshot) -> None:
        """The sampling thread's latest snapshot (a verification waits for a fresh one)."""
        with self._lock:
            self._latest = snapshot
            self._lock.notify_all()
        if self._remedies is not None:
            self._remedies.gpu_count.observe(len(snapshot.gpus))

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no slow command is queued or running; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._running, timeout=timeout)

    def close(self, timeout: float) -> None:
        """Stop the worker after the command it runs now (waits at most ``timeout``)."""
        with self._lock:
            self._stopping = True
            self._queue.clear()
            self._lock.notify_all()
            worker = self._worker
        if worker is not None and worker.is_alive():
            worker.join(timeout=timeout)

    def _store(self, command: Command, result: CommandResult) -> None:
        with self._lock:
            self._done[command.id] = result
            while len(self._done) > self._remember:
                self._done.popitem(last=False)
        level = logging.INFO if result.ok else logging.WARNING
        log.log(level, "command %s (%s): %s", command.id, command.kind, result.message,
                extra={"gpu": command.gpu} if command.gpu is not None else None)

    def _execute(self, command: Command) -> CommandResult:
        if command.kind == "throttle":
            return self._throttle(command)
        if command.kind == "release":
            return self._release(command)
        if command.kind == "checkpoint":
            return self._result(command, False, "checkpoint is not handled by the agent: "
                                                "the job's client takes checkpoints")
        if command.kind in SLOW_KINDS:
            return self._result(command, False, f"{command.kind} is not set up on this agent")
        return self._result(command, False, f"unknown command kind {command.kind!r}")

    # ---------------------------------------------------------------- the worker

    def _submit(self, command: Command) -> None:
        with self._lock:
            if self._stopping:
                return
            self._running.add(command.id)
            self._queue.append(command)
            self._lock.notify_all()
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="agent-remedy",
                                                daemon=True)
                self._worker.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._queue or self._stopping)
                if self._stopping:
                    self._running.clear()
                    self._lock.notify_all()
                    return
                command = self._queue.popleft()
            try:
                result = self._slow(command)
            except Exception as err:  # a bug must not kill the worker; it is the result
                log.exception("command %s (%s) failed", command.id, command.kind)
                result = self._result(command, False, f"agent error: {err!r}")
            self._store(command, result)
            with self._lock:
                self._finished.append(result)
                self._running.discard(command.id)
                self._lock.notify_all()

    def _slow(self, command: Command) -> CommandResult:
        if command.kind == "reset_gpu":
            return self._reset_gpu(command)
        if command.kind == "reboot":
            return self._reboot(command)
        return self._verify(command)

    def _precheck(self, command: Command) -> CommandResult | None:
        """A refusal that needs no waiting (a missing or unknown GPU), else None."""
        if command.kind != "reset_gpu":
            return None
        if command.gpu is None:
            return self._result(command, False, "reset_gpu needs a gpu (one GPU at a time)")
        targets = self._targets(command)
        return self._result(command, False, targets) if isinstance(targets, str) else None

    def _enforcing(self) -> bool:
        assert self._remedies is not None
        return self._remedies.settings.enforce and not self._dry_run

    def _reset_gpu(self, command: Command) -> CommandResult:
        remedies = self._remedies
        assert remedies is not None
        assert command.gpu is not None
        gpu = command.gpu
        note = ""
        try:
            pids = remedies.running_pids(gpu)
        except GpuUnreachable as err:
            pids, note = (), f" ({err}: no process can be using it)"
        except NvmlError as err:
            return self._result(command, False, f"not resetting GPU {gpu}: {err}",
                                dry_run=not self._enforcing())
        if pids:
            listed = ", ".join(map(str, pids[:16])) + (" ..." if len(pids) > 16 else "")
            return self._result(command, False,
                                f"not resetting GPU {gpu}: in use by process {listed}",
                                dry_run=not self._enforcing())
        if not self._enforcing():
            return self._result(command, True, "dry run: would run "
                                f"{remedies.actuator.describe_reset(gpu)}{note}", dry_run=True)
        log.warning("resetting GPU %d for controller command %s (%s): %s", gpu, command.id,
                    command.reason or "no reason given", remedies.actuator.describe_reset(gpu),
                    extra={"gpu": gpu})
        outcome = remedies.actuator.reset_gpu(gpu)
        return self._result(command, outcome.ok, outcome.message + note, dry_run=False)

    def _reboot(self, command: Command) -> CommandResult:
        remedies = self._remedies
        assert remedies is not None
        ledger = remedies.reboots
        earlier = ledger.find(command.id) if ledger is not None else None
        if ledger is not None and earlier is not None:
            return self._rebooted(command, earlier.time_seconds, earlier.boot_id,
                                  ledger.boot_id())
        what = remedies.actuator.describe_reboot()
        busy = self._busy_gpus()
        if busy:
            return self._result(command, False, f"not rebooting: {busy} (a reboot would kill "
                                "that work; the controller waits or pages a person)",
                                dry_run=not self._enforcing())
        if not self._enforcing():
            return self._result(command, True, f"dry run: would run {what}", dry_run=True)
        log.warning("REBOOTING this node for controller command %s (%s): %s", command.id,
                    command.reason or "no reason given", what)
        if ledger is not None:
            try:
                ledger.record(command.id, self._clock.time())
            except OSError as err:
                return self._result(command, False, f"not rebooting: cannot record it ({err}); "
                                    "the agent after the reboot would reboot again",
                                    dry_run=False)
        outcome = remedies.actuator.reboot()
        return self._result(command, outcome.ok, outcome.message, dry_run=False)

    def _busy_gpus(self) -> str:
        """Which GPUs of the node processes use ("" when none, or none can be asked)."""
        remedies = self._remedies
        assert remedies is not None
        with self._lock:
            latest = self._latest
        busy: list[str] = []
        for gpu in (g.index for g in latest.gpus) if latest is not None else ():
            try:
                pids = remedies.running_pids(gpu)
            except (GpuUnreachable, NvmlError):
                continue  # a lost GPU runs nothing; an unknown list is no proof of work
            if pids:
                busy.append(f"GPU {gpu} in use by process {', '.join(map(str, pids[:4]))}")
        return "; ".join(busy)

    def _rebooted(self, command: Command, at: float, before: str | None,
                  now: str | None) -> CommandResult:
        """The answer to a reboot command carried out before this agent started."""
        if before is not None and now is not None and before == now:
            return self._result(command, False, f"the reboot ordered at {at:.0f} did not "
                                "happen: the node is still in the same boot", dry_run=False)
        how = "the node has rebooted" if before and now else "this agent has restarted"
        return self._result(command, True, f"reboot carried out at {at:.0f}; {how} since",
                            dry_run=False)

    def _verify(self, command: Command) -> CommandResult:
        remedies = self._remedies
        assert remedies is not None
        settings = remedies.settings.verify
        asked = self._clock.time()
        with self._lock:
            fresh = self._lock.wait_for(
                lambda: (self._latest is not None and self._latest.timestamp_seconds >= asked)
                or self._stopping, timeout=settings.sample_wait)
            snapshot = self._latest
        if snapshot is None:
            return self._result(command, False, "verification: no sample of this node yet",
                                dry_run=False)
        extra: list[CheckResult] = []
        if not fresh:
            extra.append(CheckResult(
                name="sample", ok=False,
                detail=f"no sample within {settings.sample_wait:g}s of the question; the "
                       f"latest is {asked - snapshot.timestamp_seconds:.0f}s old"))
        checks = verify_node(snapshot, settings, remedies.gpu_count, extra=extra)
        return self._result(command, all(c.ok for c in checks), summary(checks),
                            dry_run=False, checks=checks)

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
        self, command: Command, ok: bool, message: str, dry_run: bool = False,
        checks: Sequence[CheckResult] = (),
    ) -> CommandResult:
        """The agent's ``dry_run`` marks the guard's commands; the slow kinds say their own."""
        return CommandResult(
            id=command.id,
            ok=ok,
            time_seconds=self._clock.time(),
            message=message[:_MAX_MESSAGE],
            dry_run=dry_run or (self._dry_run and command.kind not in SLOW_KINDS),
            checks=list(checks),
        )
