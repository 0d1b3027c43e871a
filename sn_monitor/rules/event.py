"""Event rules: XIDs, lost GPUs, link-down, guard and stuck-collector events.

An event has no natural end, so an event incident resolves after ``clear_after`` without
another matching event. While it fires, further matching events extend that timer and
are counted in the finding, but emit nothing new: a GPU spewing XID 79 is one incident.
With ``count: N`` and ``window``, N matching events on one subject within the window
(measured on the events' own timestamps, which come from one agent clock) are needed.

An XID incident's message says what NVIDIA's Xid catalogue makes of its code (the
resolution and why), so the person paged knows whether the GPU or the job is at fault.

Agents retry events until the controller acknowledges them, so one event can arrive in
two reports; events are told apart by their per-agent-instance ids and counted once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Final

from sn_monitor.model import EventRecord
from sn_monitor.rules.base import Evaluator, Finding, Now, format_duration
from sn_monitor.rules.series import Subject, event_subject
from sn_monitor.rules.spec import EventRule
from sn_monitor.rules.view import NodeView
from sn_monitor.rules.xid_catalog import XidCatalog, load_catalog

_KIND_WORDS: Final = {
    "xid": "XID", "sxid": "SXid", "gpu_lost": "GPU lost",
    "gpu_fallen_off_bus": "GPU fallen off the bus", "link_down": "link down",
    "guard": "guard action", "collector_stuck": "collector stuck",
}


class _Incident:
    __slots__ = ("count", "firing", "last", "subject", "times")

    def __init__(self, subject: Subject) -> None:
        self.subject = subject
        self.times: deque[float] = deque()
        self.firing = False
        self.count = 0
        self.last = 0.0


class EventEvaluator(Evaluator[EventRule]):
    """Evaluates one :class:`EventRule` on every report, and its clear timers on sweeps."""

    observes = True
    sweeps = True
    events_only = True

    def __init__(self, rule: EventRule, catalog: XidCatalog | None = None) -> None:
        super().__init__(rule)
        self._kind = rule.event
        self._catalog = catalog if catalog is not None else load_catalog()
        self._codes = frozenset(rule.codes) | self._catalog.codes(rule.resolutions)
        self._any_code = not rule.codes and not rule.resolutions
        self._count = rule.count
        self._window = float(rule.window) if rule.window is not None else None
        self._clear_after = float(rule.clear_after)
        self._incidents: dict[str, dict[str, _Incident]] = {}
        self._active: dict[tuple[str, str], _Incident] = {}
        self._seen: dict[str, tuple[str, int]] = {}  # node -> (agent instance, highest id)

    def observe(self, view: NodeView, now: Now, out: list[Finding]) -> None:
        report = view.report
        if report is None or not report.events:
            return
        node = view.name
        seen = self._seen.get(node)
        highest = seen[1] if seen is not None and seen[0] == report.instance else -1
        newest = highest
        for event in report.events:
            if event.id <= highest:
                continue  # a retried event this rule has already counted
            newest = max(newest, event.id)
            if event.kind != self._kind or (not self._any_code
                                            and event.code not in self._codes):
                continue
            self._match(node, event, now, out)
        self._seen[node] = (report.instance, newest)

    def _match(self, node: str, event: EventRecord, now: Now, out: list[Finding]) -> None:
        subject = event_subject(event.gpu, event.device)
        incidents = self._incidents.setdefault(node, {})
        incident = incidents.get(subject.text)
        if incident is None:
            incident = incidents[subject.text] = _Incident(subject)
        incident.last = now.monotonic
        if incident.firing:
            incident.count += 1
            self.update_count(node, subject.text, incident.count)
            return
        times = incident.times
        times.append(event.time_seconds)
        if self._window is not None:
            while times and times[0] < event.time_seconds - self._window:
                times.popleft()
        if len(times) < self._count:
            return
        incident.firing = True
        incident.count = len(times)
        first = times[0]
        times.clear()
        self._active[(node, subject.text)] = incident
        self.fire(node, subject, float(event.code) if event.code is not None else None,
                  self._message(subject, event, incident.count), first, now, out,
                  count=incident.count)

    def _message(self, subject: Subject, event: EventRecord, count: int) -> str:
        what = _KIND_WORDS.get(event.kind, event.kind)
        if event.code is not None:
            what = f"{what} {event.code}"
        where = "" if not subject.text else f" on {subject.human}"
        # NVML's own events say no more than "XID 13 on GPU 1": no need to say it twice.
        said = event.message if event.message != f"{what}{where}" else ""
        detail = f": {said}" if said else ""
        if event.kind == "xid" and event.code is not None:
            detail += f". {self._catalog.describe(event.code)}"
        if count > 1 and self._window is not None:
            return (f"{count} {what} events{where} within {format_duration(self._window)}"
                    f" (latest{detail or ' without a message'})")
        return f"{what}{where}{detail}"

    def sweep(self, views: Mapping[str, NodeView], now: Now, out: list[Finding]) -> None:
        if not self._active:
            return
        for (node, key), incident in list(self._active.items()):
            quiet = now.monotonic - incident.last
            if quiet >= self._clear_after:
                incident.firing = False
                del self._active[(node, key)]
                where = f" on {incident.subject.human}" if key else ""
                self.resolve(node, key, None,
                             f"no {_KIND_WORDS.get(self._kind, self._kind)} event{where} "
                             f"for {format_duration(quiet)} "
                             f"({incident.count} in this incident)", now, out)

    def cancel(self, node: str, gpu: int | None, message: str, now: Now,
               out: list[Finding]) -> None:
        """A GPU reset or a reboot that passed its check closes what the events opened."""
        for (where, key), incident in list(self._active.items()):
            if where != node or (gpu is not None and incident.subject.gpu != gpu):
                continue
            incident.firing = False
            del self._active[(where, key)]
            self.resolve(node, key, None, f"{message} ({incident.count} in this incident)",
                         now, out)

    def forget_node(self, node: str) -> None:
        super().forget_node(node)
        self._incidents.pop(node, None)
        self._seen.pop(node, None)
        for key in [k for k in self._active if k[0] == node]:
            del self._active[key]
