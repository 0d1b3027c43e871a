"""Which report carries the node's topology, and which digest a controller last accepted.

Every report carries the digest of the node's latest topology; the whole topology rides
along on the first report that has one, when its digest changed since the last one a
controller accepted, and after a reply said ``topology_wanted``. Imports nothing of the
package.
"""

from __future__ import annotations

from sn_monitor.model import NodeTopology, topology_digest


class TopologyCarriage:
    """The latest topology (set from the topology loop's thread) and what was sent of it."""

    def __init__(self) -> None:
        #: The node's latest topology and its digest (None: none collected yet); set by
        #: the topology loop's thread, read by the report thread (one reference swap).
        self._topology: tuple[NodeTopology, str] | None = None
        #: The digest of the topology a controller last accepted a report with.
        self.sent: str | None = None
        #: A reply asked for the topology: the next report carries it.
        self._wanted = False
        #: The digest of the topology the report in flight carries (None: it carries none).
        self._carried: str | None = None

    def set(self, topology: NodeTopology) -> None:
        """The node's topology now: its digest goes with every report from the next on."""
        self._topology = (topology, topology_digest(topology))

    def for_report(self) -> tuple[str, NodeTopology | None]:
        """The next report's digest ("": none yet) and the topology it carries (or None)."""
        current = self._topology
        digest = current[1] if current is not None else ""
        carried = (current[0] if current is not None
                   and (self._wanted or digest != self.sent) else None)
        self._carried = digest if carried is not None else None
        return digest, carried

    def answered(self, *, ours: bool, wanted: bool) -> None:
        """A reply came: ``ours`` (to the report in flight) and whether it wants the topology."""
        if ours and self._carried is not None:
            self.sent = self._carried
            self._wanted = False
        if wanted:
            self._wanted = True
