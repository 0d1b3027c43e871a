"""``sn-monitor slurm-health``: a Slurm ``HealthCheckProgram``, as LBNL NHC is one.

slurmd runs it every ``HealthCheckInterval`` seconds (as root, with ``SLURMD_NODENAME``
set). It judges this node's GPUs, then:

* on a failure, drains the node: ``scontrol update NodeName=N State=DRAIN
  Reason="sn-monitor slurm-health: <why>"``. A node drained by someone else (an
  operator, Slurm, the controller) keeps its reason: it is drained already;
* on success, resumes a drain only when its reason starts with :data:`HEALTH_PREFIX`:
  never an operator's drain, nor the controller's (``sn-monitor: ...``), which the
  controller lifts itself when its recovery is done.

Where the verdict comes from:

1. the local agent (``--agent``, default ``http://127.0.0.1:9847``): when its
   ``/healthz`` says ``ok`` (it samples, and its samples are fresh), its ``/metrics``
   are judged by :func:`judge_metrics` (GPUs lost, row remaps pending or failed,
   uncorrectable ECC errors, NVLinks down, NVML reads failing, fewer GPUs than expected);
2. else (no agent answers, or it is starting or stale) the checks of ``sn-monitor
   verify`` over one NVML sample taken here (the snapshot checks only: no DCGM
   diagnostic, no user command, which take minutes).

Exit status: 0 healthy (a drain of ours resumed if there was one), 1 unhealthy (drained,
or already drained), 2 the check or ``scontrol`` could not run (nothing changed). Slurm
ignores the status of a HealthCheckProgram: it is for people and other tools.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

import requests

from sn_monitor.controller.actions.base import PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.slurm import MAX_REASON, SlurmDriver
from sn_monitor.errors import SnMonitorError
from sn_monitor.model import CheckResult
from sn_monitor.transport import describe_failure

log = logging.getLogger(__name__)

HEALTH_PREFIX = "sn-monitor slurm-health:"
DEFAULT_AGENT = "http://127.0.0.1:9847"

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_ERROR = 2

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class HealthError(SnMonitorError):
    """The health could not be judged (no agent and no NVML, an unreadable answer)."""


@dataclass(frozen=True)
class Sample:
    """One line of the Prometheus text format."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Verdict:
    """The node's health and where it was judged (``agent`` or ``nvml``)."""

    source: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str:
        """The drain reason: ``sn-monitor slurm-health: <problems>``, one line, bounded."""
        text = " ".join(f"{HEALTH_PREFIX} {'; '.join(self.problems)}".split())
        return text[:MAX_REASON]


def parse_samples(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (comments and blank lines skipped)."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        if found is None:
            continue
        try:
            value = float(found.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(found.group(2) or ""))
        samples.append(Sample(found.group(1), labels, value))
    return samples


def judge_metrics(text: str, expected_gpus: int | None = None) -> list[str]:
    """What is wrong with the node by the agent's ``/metrics``; empty when healthy."""
    samples = parse_samples(text)
    problems: list[str] = []

    def gpus(name: str, bad: Callable[[float], bool]) -> list[str]:
        return sorted({s.labels.get("gpu", "?") for s in samples if s.name == name
                       and bad(s.value)}, key=_gpu_order)

    for collector in sorted(s.labels.get("collector", "?") for s in samples
                            if s.name == "sn_agent_collector_success" and s.value == 0
                            and s.labels.get("collector") == "nvml"):
        problems.append(f"the agent cannot read the GPUs ({collector} collector failing)")
    checks: list[tuple[str, Callable[[float], bool], str]] = [
        ("sn_gpu_lost", lambda v: v > 0, "lost (fallen off the bus or NVML errors)"),
        ("sn_gpu_row_remap_failed", lambda v: v > 0, "row remap failed (needs an RMA)"),
        ("sn_gpu_row_remap_pending", lambda v: v > 0, "row remap pending (needs a reset)"),
        ("sn_gpu_ecc_uncorrected_errors_total", lambda v: v > 0,
         "uncorrectable ECC errors since the last reset"),
    ]
    for name, bad, what in checks:
        found = gpus(name, bad)
        if found:
            problems.append(f"GPU {','.join(found)} {what}")
    down = sorted({(s.labels.get("gpu", "?"), s.labels.get("link", "?")) for s in samples
                   if s.name == "sn_gpu_nvlink_up" and s.value == 0},
                  key=lambda gl: (_gpu_order(gl[0]), _gpu_order(gl[1])))
    if down:
        problems.append("NVLink down: " + ", ".join(f"GPU {g} link {link}" for g, link in down))
    if expected_gpus is not None:
        present = {s.labels.get("gpu") for s in samples if s.name == "sn_gpu_lost"}
        if len(present) < expected_gpus:
            problems.append(f"{len(present)} GPUs present, {expected_gpus} expected")
    return problems


def _gpu_order(value: str) -> tuple[int, str]:
    return (int(value), "") if value.isdigit() else (1 << 30, value)


def ask_agent(url: str, timeout: float, expected_gpus: int | None) -> Verdict | None:
    """The agent's verdict, or None when no agent answers or it is not sampling freshly."""
    base = url.rstrip("/")
    try:
        health = requests.get(f"{base}/healthz", timeout=timeout)
    except requests.RequestException as err:
        log.info("no agent at %s (%s): checking the GPUs here", base, describe_failure(err))
        return None
    status = _status(health)
    if health.status_code != 200 or status != "ok":
        log.warning("the agent at %s is not sampling (HTTP %s, %s): checking the GPUs here",
                    base, health.status_code, status)
        return None
    try:
        metrics = requests.get(f"{base}/metrics", timeout=timeout)
    except requests.RequestException as err:
        raise HealthError(f"the agent at {base} answered /healthz but not /metrics: "
                          f"{describe_failure(err)}") from None
    if metrics.status_code != 200:
        raise HealthError(f"the agent at {base}: /metrics answered HTTP {metrics.status_code}")
    return Verdict("agent", tuple(judge_metrics(metrics.text, expected_gpus)))


def _status(reply: requests.Response) -> str:
    try:
        doc = reply.json()
    except ValueError:
        return "unreadable /healthz"
    return str(doc.get("status")) if isinstance(doc, dict) else "unreadable /healthz"


def verdict_of_checks(checks: Iterable[CheckResult]) -> Verdict:
    """The verdict of ``sn-monitor verify``'s checks (run here, through NVML)."""
    return Verdict("nvml", tuple(f"{c.name}: {c.detail}" for c in checks if not c.ok))


def apply(verdict: Verdict, node: str, driver: SlurmDriver, *, dry_run: bool,
          out: TextIO) -> int:
    """Drain on failure, resume our own drain on success; the exit status."""
    current = driver.show(node)
    would = "would " if dry_run else ""
    if not verdict.ok:
        if current.drained and not (current.reason or "").startswith(HEALTH_PREFIX):
            print(f"{node}: unhealthy ({verdict.reason}); already drained by someone else "
                  f"(Reason={current.reason!r}): leaving it", file=out)
            return EXIT_UNHEALTHY
        if current.drained and current.reason == verdict.reason:
            print(f"{node}: unhealthy, drained already: {verdict.reason}", file=out)
            return EXIT_UNHEALTHY
        if not dry_run:
            driver.drain(node, verdict.reason)
        print(f"{node}: unhealthy: {would}drain: {verdict.reason}", file=out)
        return EXIT_UNHEALTHY
    if current.drained and (current.reason or "").startswith(HEALTH_PREFIX):
        if not dry_run:
            driver.resume(node)
        print(f"{node}: healthy ({verdict.source}): {would}resume our drain "
              f"(Reason={current.reason!r})", file=out)
        return EXIT_HEALTHY
    extra = f"; drained by someone else (Reason={current.reason!r}): left alone" \
        if current.drained else ""
    print(f"{node}: healthy ({verdict.source}){extra}", file=out)
    return EXIT_HEALTHY


def node_name(given: str | None, environ: dict[str, str]) -> str:
    """``--node``, else ``$SLURMD_NODENAME`` (slurmd sets it), else the short host name."""
    return given or environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run(*, node: str, agent: str | None, timeout: float, expected_gpus: int | None,
        local_checks: Callable[[], Sequence[CheckResult]], driver: SlurmDriver,
        dry_run: bool, out: TextIO, err: TextIO) -> int:
    """The whole health check; see the module docstring."""
    try:
        verdict = ask_agent(agent, timeout, expected_gpus) if agent else None
        if verdict is None:
            verdict = verdict_of_checks(local_checks())
    except SnMonitorError as error:  # HealthError, VerifyError (no NVML)
        print(f"sn-monitor slurm-health: {error}", file=err)
        return EXIT_ERROR
    try:
        return apply(verdict, node, driver, dry_run=dry_run, out=out)
    except (TemporaryError, PermanentError) as error:
        print(f"sn-monitor slurm-health: {node}: {error}", file=err)
        return EXIT_ERROR
