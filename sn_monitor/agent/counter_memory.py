"""The counters the node-local rate and increase rules last saw, kept across agent restarts.

The controller leaves node-local rules to the agent (:mod:`sn_monitor.rules.edge`) and the
agent's reports then carry none of the values those rules read. An agent that restarts
starts its rules afresh, so a counter that rose meanwhile (an uncorrectable ECC error
during the restart) would be only the first sample of a new series: its increase seen by
neither side. The agent is the one place that knew the value before the restart, so it
keeps it: the values its rate and increase rules read are written to its state directory
whenever they change (rarely: they are error counters), and the rules of its next start
begin from them (:class:`~sn_monitor.agent.rules.NodeRules`), judging the first sample
after the restart against the last one before it. A counter below the kept value was reset
(the driver or the node restarted) and starts over, as the rules treat any reset.

The file holds a :class:`~sn_monitor.model.Report` cut down to those values, with the
time they were sampled. One that cannot be read is logged and ignored: the rules then
start afresh, as before this memory existed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from sn_monitor.durable import write_atomically
from sn_monitor.model import Report

log = logging.getLogger(__name__)

_decoder = msgspec.json.Decoder(Report)
_encoder = msgspec.json.Encoder()


class CounterMemory:
    """The last counter values of the node-local rules, in one file (see the module)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: The values last written (or read): an unchanged report writes nothing.
        self._kept: tuple[object, ...] | None = None

    def recall(self) -> Report | None:
        """The values kept by the last run (None: none, or not readable)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("cannot read %s: %s; the node-local rules start afresh", self.path, err)
            return None
        try:
            kept = _decoder.decode(data)
        except msgspec.DecodeError as err:
            log.warning("%s is not a kept report (%s); the node-local rules start afresh",
                        self.path, err)
            return None
        self._kept = _values(kept)
        return kept

    def keep(self, counters: Report) -> None:
        """Write ``counters`` (a report cut down to the counters) if their values changed."""
        values = _values(counters)
        if values == self._kept:
            return
        bare = msgspec.structs.replace(counters, labels={}, events=[], command_results=[],
                                       findings=[], topology=None, topology_digest="")
        self._kept = values  # tried once per change: a failing disk is logged once for it
        try:
            write_atomically(self.path, _encoder.encode(bare))
        except OSError as err:
            log.error("cannot keep the node-local rules' counters in %s: %s (a restart "
                      "starts them afresh)", self.path, err)


def _values(report: Report) -> tuple[object, ...]:
    return (report.gpus, report.infiniband, report.network, report.host)
