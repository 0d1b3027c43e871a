"""Report ingest: decode, check who sent it, keep each node's latest view.

Decoding is msgspec's: a bad report is refused with a message naming the field. The
sender is checked against the token's identity; sequence numbers from one agent
instance must increase (duplicates and reordered reports are answered, not applied).
Detection uses the controller's receive time, never the agent's clock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.controller.state import NodeState, NodeView
from sn_monitor.model import Report


class ReportRejected(Exception):
    """A report that is refused, with the HTTP status to answer and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_decoder = msgspec.json.Decoder(Report)


def decode_report(body: bytes) -> Report:
    """Decode and validate one report; ReportRejected(400/422) names the field."""
    try:
        return _decoder.decode(body)
    except msgspec.ValidationError as err:
        raise ReportRejected(422, f"invalid report: {err}") from None
    except msgspec.DecodeError as err:
        raise ReportRejected(400, f"malformed JSON: {err}") from None


@dataclass(frozen=True)
class Accepted:
    """What ingest did with a report: ``applied`` False for a duplicate or a stale one."""

    view: NodeView
    applied: bool
    new_node: bool
    labels_changed: bool


class NodeRegistry:
    """Every node's latest report and receive time, in memory (the store keeps the rest)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._views: dict[str, NodeView] = {}
        self._last: dict[str, tuple[str, int, float]] = {}

    def accept(self, report: Report) -> Accepted:
        """Apply ``report`` unless it is older than what this agent instance already sent."""
        now_mono = self._clock.monotonic()
        now_wall = self._clock.time()
        with self._lock:
            view = self._views.get(report.node)
            new_node = view is None
            if view is None:
                view = NodeView(name=report.node, labels=dict(report.labels))
                self._views[report.node] = view
            last = self._last.get(report.node)
            if last is not None and (
                    (last[0] == report.instance and report.sequence <= last[1])
                    # a late report from the instance before an agent restart: one node's
                    # own clock orders its two instances
                    or (last[0] != report.instance and report.sample_time_seconds < last[2])):
                return Accepted(view, applied=False, new_node=False, labels_changed=False)
            self._last[report.node] = (report.instance, report.sequence,
                                       report.sample_time_seconds)
            # compared with the last report's own labels: the controller may add some to
            # the view (the node's job) that the agent does not send
            before = view.report.labels if view.report is not None else None
            labels_changed = not new_node and before is not None and before != report.labels
            if labels_changed or new_node or before is None:
                view.labels = dict(report.labels)
            view.report = report
            view.received_monotonic = now_mono
            view.received_wall = now_wall
            return Accepted(view, applied=True, new_node=new_node, labels_changed=labels_changed)

    def restore(self, name: str, labels: Mapping[str, str], state: NodeState) -> NodeView:
        """A node known from the store before its first report since a restart.

        Its heartbeat clock starts now: a controller restart must not declare every
        node lost before they had a chance to report.
        """
        with self._lock:
            view = self._views.get(name)
            if view is None:
                view = NodeView(name=name, labels=dict(labels),
                                received_monotonic=self._clock.monotonic(),
                                received_wall=self._clock.time())
                self._views[name] = view
            view.state = state
            return view

    def views(self) -> dict[str, NodeView]:
        """A copy of the node map (the views themselves are live)."""
        with self._lock:
            return dict(self._views)

    def names(self) -> frozenset[str]:
        """Every known node's name."""
        with self._lock:
            return frozenset(self._views)

    def get(self, name: str) -> NodeView | None:
        with self._lock:
            return self._views.get(name)

    def __len__(self) -> int:
        return len(self._views)
