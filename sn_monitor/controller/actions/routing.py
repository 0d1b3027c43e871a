"""Which driver carries out which action: built once from the ``drivers:`` and ``routes:``.

The Kubernetes drivers are imported here only when they are configured (the client is
an optional extra, ``pip install 'sn-monitor[kubernetes]'``); every other driver needs
nothing beyond the package's own dependencies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.base import Driver, Outcome, PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.agent import (
    AgentCommandDriver,
    AgentCommandQueue,
    AgentQueueSettings,
)
from sn_monitor.controller.actions.drivers.alertmanager import (
    AlertmanagerDriver,
    AlertmanagerSettings,
)
from sn_monitor.controller.actions.drivers.command import CommandDriver, CommandSettings
from sn_monitor.controller.actions.drivers.job_control import (
    JobControl,
    JobControlDriver,
    TrainingClientControl,
)
from sn_monitor.controller.actions.drivers.slack import SlackDriver, SlackSettings
from sn_monitor.controller.actions.drivers.slurm import SlurmDriver, SlurmSettings
from sn_monitor.controller.actions.drivers.slurm_jobs import SlurmJobControl
from sn_monitor.controller.actions.drivers.webhook import WebhookDriver, WebhookSettings
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.k8s.settings import KubernetesSettings
from sn_monitor.model import ActionName

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobControlSettings:
    """Where checkpoint / restore / failover go: exactly one of a webhook or a command."""

    webhook: WebhookSettings | None = None
    command: CommandSettings | None = None

    def __post_init__(self) -> None:
        if (self.webhook is None) == (self.command is None):
            raise ValueError("give exactly one of webhook and command")


@dataclass(frozen=True)
class DriverSettings:
    """The outside systems the controller may act through; each is off unless set."""

    alertmanager: AlertmanagerSettings | None = None
    webhook: WebhookSettings | None = None
    slack: SlackSettings | None = None
    kubernetes: KubernetesSettings | None = None
    slurm: SlurmSettings | None = None
    command: CommandSettings | None = None
    job: JobControlSettings | None = None
    agent: AgentQueueSettings = field(default_factory=AgentQueueSettings)


DRIVER_NAMES = ("alertmanager", "webhook", "slack", "kubernetes", "slurm", "command", "job",
                "agent")


def check_routes(value: dict[str, list[str]]) -> None:
    """Settings check of ``routes``: known actions, known driver names."""
    for action, drivers in value.items():
        if action not in ActionName.__args__:  # type: ignore[attr-defined]
            raise ValueError(f"unknown action {action!r}")
        for driver in drivers:
            if driver not in DRIVER_NAMES:
                raise ValueError(f"unknown driver {driver!r} for {action} "
                                 f"(drivers: {', '.join(DRIVER_NAMES)})")


NODE_ACTIONS = ("cordon", "uncordon", "evict")
AGENT_ACTIONS = ("throttle", "release", "reset_gpu", "reboot", "verify")
JOB_ACTIONS = ("checkpoint", "restore", "failover")


class AlertFanout:
    """One ``alert`` action delivered to every alert destination.

    A destination that took the alert is not sent it again when the action is retried
    for another that failed (remembered per action id while the controller runs).
    """

    name = "alert"

    def __init__(self, destinations: Sequence[Driver]) -> None:
        self.destinations = list(destinations)
        self.idempotent = all(getattr(d, "idempotent", False) for d in destinations)
        self._done: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def run(self, request: ActionRequest) -> Outcome:
        with self._lock:
            done = set(self._done.get(request.id, set()))
        failures: list[str] = []
        temporary = False
        for driver in self.destinations:
            if driver.name in done:
                continue
            try:
                driver.run(request)
            except TemporaryError as err:
                temporary = True
                failures.append(f"{driver.name}: {err}")
                continue
            except PermanentError as err:
                failures.append(f"{driver.name}: {err}")
                continue
            done.add(driver.name)
        with self._lock:
            if temporary:
                self._done[request.id] = done
            else:
                self._done.pop(request.id, None)
        if temporary:
            raise TemporaryError("; ".join(failures))
        if failures and not done:
            raise PermanentError("; ".join(failures))
        message = f"sent to {', '.join(sorted(done))}"
        if failures:
            message += f" (failed: {'; '.join(failures)})"
        return Outcome(message, {"destinations": sorted(done)})


class LogAlert:
    """Alerts with no destination configured: written to the log, never lost silently."""

    name = "log"
    idempotent = True

    def run(self, request: ActionRequest) -> Outcome:
        status = request.params.get("status", "firing")
        log.warning("alert %s (%s): %s", status, request.severity, request.reason,
                    extra={"node": request.node, "rule": request.rule, "gpu": request.gpu})
        return Outcome("logged (no alert destination configured)")


def job_control_driver(control: JobControl, clock: Clock) -> JobControlDriver:
    """The driver for a job's ``spec.control``: webhook, command, kubernetes or slurm."""
    kubernetes = None
    if control.kubernetes is not None:
        from sn_monitor.controller.actions.drivers.k8s_jobs import KubernetesJobControl

        kubernetes = KubernetesJobControl(control.kubernetes)
    return JobControlDriver(
        webhook=WebhookDriver(control.webhook, clock=clock) if control.webhook else None,
        command=CommandDriver(control.command) if control.command else None,
        kubernetes=kubernetes,
        slurm=SlurmJobControl(control.slurm) if control.slurm else None,
    )


class JobControlDrivers:
    """One driver per job, built from its ``spec.control`` and rebuilt when that changes.

    Shared by the routers of checkpoint, restore and failover (one API client per job).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._drivers: dict[str, tuple[JobControl, JobControlDriver]] = {}
        self._lock = threading.Lock()

    def get(self, job: str, control: JobControl) -> JobControlDriver:
        """The driver of ``job`` (a bad control, e.g. no Kubernetes config: PermanentError)."""
        stale: JobControlDriver | None = None
        with self._lock:
            cached = self._drivers.get(job)
            if cached is None or cached[0] is not control:
                try:
                    driver = job_control_driver(control, self._clock)
                except ValueError as err:
                    raise PermanentError(f"job {job}: cannot reach its launcher "
                                         f"({control.kind}): {err}") from None
                stale = cached[1] if cached is not None else None
                cached = (control, driver)
                self._drivers[job] = cached
        if stale is not None:
            stale.close()
        return cached[1]

    def close(self) -> None:
        with self._lock:
            drivers = [d for _, d in self._drivers.values()]
            self._drivers.clear()
        for driver in drivers:
            driver.close()


#: The ``spec.control`` of a job by name (None: it names none); KeyError: no such job.
ControlOf = Callable[[str], JobControl | None]


class JobControlRouter:
    """checkpoint / restore / failover to the launcher of the job they are about.

    A DistributedJob names its own launcher (``spec.control``: a webhook, a command,
    Kubernetes or Slurm); an action whose ``params["job"]`` names a known job goes there.
    A known job that names none goes to the controller-wide job driver, else to its
    training client (:class:`TrainingClientControl`). An action about no known job goes
    to the controller-wide driver, if there is one.
    """

    name = "job-router"

    def __init__(self, fallback: Driver | None, control_of: ControlOf,
                 clock: Clock, drivers: JobControlDrivers | None = None) -> None:
        self._fallback = fallback
        self._control_of = control_of
        self._drivers = drivers if drivers is not None else JobControlDrivers(clock)
        self._client = TrainingClientControl()

    def _driver_for(self, job: str | None) -> Driver | None:
        if job is None:
            return self._fallback
        try:
            control = self._control_of(job)
        except KeyError:
            return self._fallback
        if control is None:
            return self._fallback if self._fallback is not None else self._client
        return self._drivers.get(job, control)

    def run(self, request: ActionRequest) -> Outcome:
        job = request.params.get("job")
        driver = self._driver_for(str(job) if job else None)
        if driver is None:
            raise PermanentError(f"no launcher to {request.action} job {job or '?'}: set the "
                                 "job's spec.control or drivers.job")
        return driver.run(request)

    def idempotent_for(self, request: ActionRequest) -> bool:
        """Whether the driver of ``request``'s job may run it again under its id."""
        job = request.params.get("job")
        try:
            driver = self._driver_for(str(job) if job else None)
        except PermanentError:
            return False
        return driver is not None and getattr(driver, "idempotent", False) is True

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Whatever the job's driver can tell (None when it cannot, or there is none)."""
        job = request.params.get("job")
        try:
            driver = self._driver_for(str(job) if job else None)
        except PermanentError:
            return None
        reconcile = getattr(driver, "reconcile", None)
        if not callable(reconcile):
            return None
        result: bool | None = reconcile(request)
        return result

    def close(self) -> None:
        self._drivers.close()


class NoDriver:
    """Stands in for an action with no driver configured: it fails, saying so."""

    idempotent = True

    def __init__(self, action: str) -> None:
        self.name = f"none-for-{action}"
        self._action = action

    def run(self, request: ActionRequest) -> Outcome:
        raise PermanentError(f"no driver is configured for {self._action} "
                             "(set drivers and routes in the controller config)")


@dataclass
class Drivers:
    """The drivers, by action, and the ones the controller talks to directly."""

    by_action: dict[str, Driver]
    queue: AgentCommandQueue
    alertmanager: AlertmanagerDriver | None = None
    every: list[Driver] = field(default_factory=list)
    #: Actions whose driver the config named explicitly (``routes``).
    routed: frozenset[str] = frozenset()
    #: The per-job drivers that :meth:`route_jobs` built (closed with the others).
    job_drivers: JobControlDrivers | None = None

    def route_jobs(self, control_of: ControlOf, clock: Clock) -> None:
        """Send checkpoint / restore / failover to the launcher of the job they name.

        Actions the config routed by hand keep their driver.
        """
        shared = JobControlDrivers(clock)
        for action in JOB_ACTIONS:
            if action in self.routed:
                continue
            current = self.by_action[action]
            fallback = None if isinstance(current, NoDriver) else current
            self.by_action[action] = JobControlRouter(fallback, control_of, clock, shared)
        self.job_drivers = shared

    def close(self) -> None:
        for driver in self.every:
            close = getattr(driver, "close", None)
            if callable(close):
                close()
        if self.job_drivers is not None:
            self.job_drivers.close()


def build_drivers(settings: DriverSettings, routes: Mapping[str, list[str]],
                  clock: Clock) -> Drivers:
    """Every configured driver, and the driver of each action (routes, then defaults)."""
    named: dict[str, Driver] = {}
    alertmanager = None
    if settings.alertmanager is not None:
        alertmanager = AlertmanagerDriver(settings.alertmanager, clock=clock)
        named["alertmanager"] = alertmanager
    if settings.webhook is not None:
        named["webhook"] = WebhookDriver(settings.webhook, clock=clock)
    if settings.slack is not None:
        named["slack"] = SlackDriver(settings.slack)
    if settings.kubernetes is not None:
        from sn_monitor.controller.actions.drivers.kubernetes import KubernetesDriver

        named["kubernetes"] = KubernetesDriver(settings.kubernetes)
    if settings.slurm is not None:
        named["slurm"] = SlurmDriver(settings.slurm)
    if settings.command is not None:
        named["command"] = CommandDriver(settings.command)
    if settings.job is not None:
        job = settings.job
        named["job"] = JobControlDriver(
            webhook=WebhookDriver(job.webhook, clock=clock) if job.webhook else None,
            command=CommandDriver(job.command) if job.command else None,
        )
    queue = AgentCommandQueue(settings.agent, clock=clock)
    named["agent"] = AgentCommandDriver(queue)

    def pick(action: str, default: Sequence[str]) -> Driver:
        chosen = [n for n in routes.get(action, default) if n in named]
        if action in routes and len(chosen) < len(routes[action]):
            missing = sorted(set(routes[action]) - set(named))
            raise ValueError(f"routes.{action} names drivers that are not configured: "
                             f"{', '.join(missing)}")
        if action == "alert":
            return AlertFanout([named[n] for n in chosen]) if chosen else LogAlert()
        return named[chosen[0]] if chosen else NoDriver(action)

    by_action: dict[str, Driver] = {
        "alert": pick("alert", ["alertmanager", "webhook", "slack"]),
    }
    for action in NODE_ACTIONS:
        by_action[action] = pick(action, ["kubernetes", "slurm", "command"])
    for action in AGENT_ACTIONS:
        by_action[action] = pick(action, ["agent"])
    for action in JOB_ACTIONS:
        by_action[action] = pick(action, ["job"])
    for action, driver in sorted(by_action.items()):
        log.info("action %s -> %s", action, driver.name)
    return Drivers(by_action, queue, alertmanager, list(named.values()),
                   routed=frozenset(routes))
