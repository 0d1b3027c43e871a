"""Drain and resume Slurm nodes with ``scontrol``.

* **cordon** and **evict** both drain: ``scontrol update NodeName=N State=DRAIN
  Reason="sn-monitor: <reason>"``. A drained node takes no new jobs and lets its running
  jobs finish; the job's own recovery (checkpoint / restore, the job driver) moves the
  work. A hard stop would be ``State=DOWN``, which kills running jobs on the node; it is
  deliberately not used.
* **uncordon** resumes (``State=RESUME``) only a drain of our own: the node's ``Reason``
  must start with ``sn-monitor``. A node drained by an operator or by Slurm itself stays
  drained (PermanentError "drained by someone else"); a node that is not drained is
  already done.

``scontrol`` runs with an argument list (never a shell: the reason is user text) and a
timeout. A timeout or an unexpected failure is temporary (slurmctld restarting, busy,
"Unable to contact slurm controller"); an unknown node (``Invalid node name``, ``Node N
not found``) and permission errors are permanent. tests/integration/test_slurm_real.py
checks these against a real slurmctld (Slurm 22.05).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from sn_monitor.config import Duration, positive, setting
from sn_monitor.controller.actions.base import Outcome, PermanentError, TemporaryError
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.program import ProgramTimeout as Timeout
from sn_monitor.program import run_program

log = logging.getLogger(__name__)

REASON_PREFIX = "sn-monitor"
#: stderr phrases that retrying cannot fix (anything else may pass: slurmctld busy, ...).
#: ``update`` of an unknown node says "Invalid node name specified" (stderr), ``show node``
#: says "Node n9 not found" (stdout); both exit 1, as does an unreachable slurmctld
#: ("Unable to contact slurm controller (connect failure)", temporary).
_PERMANENT = re.compile(
    r"Invalid node name|Node \S+ not found|Access/permission denied|Invalid user")


def run_slurm_tool(argv: list[str], what: str, timeout: float, permanent: re.Pattern[str],
                   on_failure: Callable[[str], None] | None = None) -> str:
    """Run a Slurm command (no shell); its stdout, or the error its failure means.

    A timeout and an unrecognised failure are temporary; a message matching
    ``permanent``, or a tool that cannot be run, is permanent. ``on_failure`` sees the
    error text first and may raise something more specific.
    """
    try:
        result = run_program(argv, timeout=timeout)
    except Timeout:
        raise TemporaryError(f"{what} timed out after {timeout}s") from None
    except OSError as err:
        raise PermanentError(f"cannot run {argv[0]}: {err.strerror}") from None
    if result.returncode != 0:
        # scontrol writes some refusals to stdout ("Node n9 not found" from show node).
        stderr = (" ".join(result.stderr.split())[-500:]
                  or " ".join(result.stdout.split())[-500:] or f"exit {result.returncode}")
        if permanent.search(stderr):
            raise PermanentError(f"{what}: {stderr}")
        if on_failure is not None:
            on_failure(stderr)
        raise TemporaryError(f"{what}: {stderr}")
    return result.stdout
_REASON = re.compile(r"^\s*Reason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$", re.MULTILINE)
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
#: Slurm keeps reasons short in its displays; keep ours readable.
MAX_REASON = 200


@dataclass(frozen=True)
class SlurmSettings:
    """Which ``scontrol`` to run (a name on PATH or a path) and how long to wait for it."""

    scontrol: str = "scontrol"
    timeout: Duration = setting(default=Duration(10.0), check=positive)


@dataclass(frozen=True)
class NodeState:
    """The parts of ``scontrol show node`` we use."""

    state: str
    reason: str | None

    @property
    def drained(self) -> bool:
        """DRAIN flag set (``IDLE+DRAIN``, ``MIXED+DRAIN``, ``DRAINED``, ``DRAINING``)."""
        return "DRAIN" in self.state.upper()

    @property
    def ours(self) -> bool:
        """Drained by sn-monitor (the reason we set starts with ``sn-monitor``)."""
        return self.reason is not None and self.reason.startswith(REASON_PREFIX)


def parse_show_node(text: str) -> NodeState:
    """Parse ``scontrol show node`` output (multi-line format).

    ``Reason=`` runs to the end of its line and Slurm appends ``[user@time]``, which is
    dropped. Raises ValueError when there is no ``State=``.
    """
    state = _STATE.search(text)
    if state is None:
        raise ValueError("no State= in scontrol output")
    reason = _REASON.search(text)
    return NodeState(state.group(1), reason.group(1).strip() if reason else None)


def drain_reason(reason: str) -> str:
    """``sn-monitor: <reason>`` on one line, bounded."""
    text = " ".join(f"{REASON_PREFIX}: {reason}".split())
    return text[:MAX_REASON]


class SlurmDriver:
    """cordon / evict (drain) and uncordon (resume our own drain) through ``scontrol``."""

    name = "slurm"
    #: Draining a drained node, or resuming a resumed one, changes nothing.
    idempotent = True
    actions = frozenset({"cordon", "uncordon", "evict"})

    def __init__(self, settings: SlurmSettings | None = None) -> None:
        self.settings = settings or SlurmSettings()

    def run(self, request: ActionRequest) -> Outcome:
        """Drain for cordon/evict, resume for uncordon."""
        node = _node(request)
        if request.action in ("cordon", "evict"):
            reason = drain_reason(request.reason)
            self.drain(node, reason)
            return Outcome(f"drained Slurm node {node}", {"reason": reason})
        if request.action == "uncordon":
            current = self.show(node)
            if not current.drained:
                return Outcome(f"Slurm node {node} is not drained ({current.state})",
                               {"changed": False})
            if not current.ours:
                raise PermanentError(
                    f"Slurm node {node} was drained by someone else "
                    f"(Reason={current.reason!r}): not resuming it")
            self.resume(node)
            return Outcome(f"resumed Slurm node {node}", {"changed": True})
        raise PermanentError(f"the slurm driver cannot {request.action}")

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Done when the node is drained by us (cordon/evict) or not drained (uncordon)."""
        node = _node(request)
        try:
            current = self.show(node)
        except TemporaryError as err:
            log.warning("slurm: cannot reconcile %s on %s: %s", request.action, node, err)
            return None
        if request.action in ("cordon", "evict"):
            return current.drained and current.ours
        if request.action == "uncordon":
            return not current.drained
        return None

    def drain(self, node: str, reason: str) -> None:
        """``scontrol update NodeName=<node> State=DRAIN Reason=<reason>`` (reason as given)."""
        self._scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        """``scontrol update NodeName=<node> State=RESUME``, whoever drained it."""
        self._scontrol("update", f"NodeName={node}", "State=RESUME")

    def show(self, node: str) -> NodeState:
        """``scontrol show node <node>``, parsed."""
        output = self._scontrol("show", "node", node)
        try:
            return parse_show_node(output)
        except ValueError as err:
            raise PermanentError(f"cannot read scontrol show node {node}: {err}") from None

    def _scontrol(self, *args: str) -> str:
        return run_slurm_tool([self.settings.scontrol, *args], f"scontrol {args[0]}",
                              self.settings.timeout, _PERMANENT)


def _node(request: ActionRequest) -> str:
    if not request.node:
        raise PermanentError(f"{request.action} needs a node")
    return request.node
