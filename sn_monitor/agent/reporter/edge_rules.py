"""The node-local rules a controller hands this agent: taken, refused, asked for again.

A reply may carry rules the controller wants this node to evaluate
(:mod:`sn_monitor.rules.edge`); from the next report on the agent runs them on each sample
(:class:`~sn_monitor.agent.rules.NodeRules`). Rules this agent cannot take (a newer
controller's) are logged once and the reports stay full for :data:`RULES_RETRY_SECONDS`:
the controller then evaluates them itself. Imports nothing of the package.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from sn_monitor.agent.counter_memory import CounterMemory
from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError
from sn_monitor.model import EdgeRules

if TYPE_CHECKING:
    from sn_monitor.agent.rules import NodeRules

log = logging.getLogger(__package__)  # the reporter's one logger (see .replies)

#: Seconds an agent that could not take the controller's node-local rules sends full
#: reports before it asks for them again (a report that asks is not judged on them).
RULES_RETRY_SECONDS = 600.0


class EdgeRulesIntake:
    """The rules this node evaluates (``current``) and when to ask for them.

    ``counter_memory`` is where those rules keep their counters across restarts (None:
    they do not); ``node`` names the node to the rules and in log lines.
    """

    def __init__(self, node: str, clock: Clock, counter_memory: CounterMemory | None) -> None:
        self._node = node
        self._clock = clock
        self._counter_memory = counter_memory
        #: The node-local rules this agent evaluates (None: the controller evaluates all).
        self.current: NodeRules | None = None  # imported with the first rules (2.5 MB)
        self._refused: str | None = None
        #: After rules it could not take, the agent sends full reports for the controller
        #: to evaluate until this monotonic time, then asks again.
        self._full_until = -math.inf

    def asking(self) -> bool:
        """Whether to ask for node-local rules (and leave them to this agent) now."""
        return self.current is not None or self._clock.monotonic() >= self._full_until

    def take(self, raw: msgspec.Raw, labels: Mapping[str, str]) -> None:
        """Evaluate the node-local rules of ``raw`` from the next sample on, if this can."""
        from sn_monitor.agent.rules import NodeRules  # the rule engine: only once needed

        try:
            edge = msgspec.json.decode(raw, type=EdgeRules)
        except msgspec.DecodeError as err:
            self._refuse(None, str(err))
            return
        if edge.version == self._refused:
            self._full_until = self._clock.monotonic() + RULES_RETRY_SECONDS
            return
        try:
            self.current = NodeRules(edge, self._node, labels, self._clock,
                                     self._counter_memory)
        except ConfigError as err:
            self._refuse(edge.version, str(err))
            return
        log.info("evaluating %d node-local rules of the controller (version %s)",
                 len(edge.rules), edge.version, extra={"node": self._node})

    def _refuse(self, version: str | None, why: str) -> None:
        """Leave every rule to the controller (full reports) for a while; log it once."""
        self._refused = version
        self.current = None
        self._full_until = self._clock.monotonic() + RULES_RETRY_SECONDS
        log.error("cannot evaluate the controller's node-local rules (%s); sending full "
                  "reports for the controller to evaluate, asking again in %.0f s", why,
                  RULES_RETRY_SECONDS, extra={"node": self._node})
