"""Heartbeat rules: a node that has stopped reporting.

Age is measured on the controller's monotonic clock from when the last report was
received, never from the node's own timestamps. A node known to the controller that has
not reported since the engine first saw it (say, after a controller restart) is timed
from that first sight, so a node that died during the restart is still caught.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from sn_monitor.rules.base import Evaluator, Finding, Now, format_duration
from sn_monitor.rules.series import NODE
from sn_monitor.rules.spec import HeartbeatRule
from sn_monitor.rules.view import NodeView

UNREPORTED_GRACE_SECONDS: Final = 12.0
"""Extra time for a node not heard from since the controller started: while the
controller was away its agent backed off, up to 10 s + 20 % jitter
(``MAX_BACKOFF_SECONDS`` in agent/reporter/), and must not be taken for lost for it."""


class HeartbeatEvaluator(Evaluator[HeartbeatRule]):
    """Evaluates one :class:`HeartbeatRule` on sweeps; a new report resolves it."""

    observes = True
    sweeps = True

    def __init__(self, rule: HeartbeatRule) -> None:
        super().__init__(rule)
        self._timeout = float(rule.heartbeat_timeout)
        self._first_seen: dict[str, tuple[float, float]] = {}  # node -> (monotonic, wall)
        #: Silence is timed from no earlier than this (after the controller's own stall).
        self._grace_from = -math.inf

    def forgive(self, now_monotonic: float) -> None:
        """The controller stood still until now: silence is timed from after the grace.

        The grace is for nodes not yet found lost: a node lost before the stall stays
        lost until it reports again (:meth:`observe`), however long the stall.
        """
        self._grace_from = now_monotonic + UNREPORTED_GRACE_SECONDS

    def observe(self, view: NodeView, now: Now, out: list[Finding]) -> None:
        if self.is_firing(view.name, ""):
            self.resolve(view.name, "", 0.0, "reporting again", now, out,
                         view.report.sample_time_seconds if view.report else now.wall)

    def sweep(self, views: Mapping[str, NodeView], now: Now, out: list[Finding]) -> None:
        # A node is late when it last reported at or before ``cutoff``. Most nodes are
        # not, and nothing fires: that path is one comparison per node (8,192 of them
        # twice a second).
        cutoff = now.monotonic - self._timeout
        # A node never heard from is timed from the engine's first sight of it, with grace.
        unreported_after = self._timeout + UNREPORTED_GRACE_SECONDS
        scoped = bool(self._scope)
        firing = self._firing
        first_seen = self._first_seen
        for name, view in views.items():
            if scoped and not self.applies(view):
                continue
            if view.report is None:
                first = first_seen.get(name)
                if first is None:
                    first = first_seen[name] = (now.monotonic, now.wall)
                if now.monotonic - first[0] >= unreported_after:
                    self._judge_silence(name, "no report since the controller started watching",
                                        first[0], first[1], now, out)
                continue
            last_mono = view.received_monotonic
            if last_mono > cutoff:
                if firing and self.is_firing(name, ""):
                    self.resolve(name, "", now.monotonic - last_mono, "reporting again",
                                 now, out)
                continue
            self._judge_late(name, view, last_mono, cutoff, now, out)
        if len(first_seen) > len(views):
            for name in [n for n in first_seen if n not in views]:
                del first_seen[name]

    def _judge_late(self, name: str, view: NodeView, last_mono: float, cutoff: float,
                    now: Now, out: list[Finding]) -> None:
        """A node silent since ``last_mono``, at or before ``cutoff``: lost unless in grace."""
        if last_mono < self._grace_from and not self.is_firing(name, ""):
            # silent since before the controller's own stall: timed from after it
            last_mono = self._grace_from
            if last_mono > cutoff:
                return
        self._judge_silence(name, "no report", last_mono, view.received_wall, now, out)

    def _judge_silence(self, name: str, what: str, last_mono: float, last_wall: float,
                       now: Now, out: list[Finding]) -> None:
        """Fire when the silence since ``last_mono`` reaches the timeout, else resolve."""
        age = now.monotonic - last_mono
        timeout = self._timeout
        if age >= timeout:
            if not self.is_firing(name, ""):
                self.fire(name, NODE, age,
                          f"{what} for {format_duration(age)} "
                          f"(timeout {format_duration(timeout)})",
                          last_wall + timeout, now, out)
        elif self.is_firing(name, ""):
            self.resolve(name, "", age, "reporting again", now, out)

    def forget_node(self, node: str) -> None:
        super().forget_node(node)
        self._first_seen.pop(node, None)
