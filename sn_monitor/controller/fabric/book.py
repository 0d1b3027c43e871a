"""Each node's topology as its agent last sent it (:class:`~sn_monitor.model.NodeTopology`).

Agents send a topology once and on change, and a digest with every report; the book
answers whether a report's digest is one it holds (else the reply asks for the whole
topology: after a controller restart, for every node once).
"""

from __future__ import annotations

from dataclasses import dataclass

from sn_monitor.model import NicTopology, NodeTopology, Report, topology_digest


@dataclass(frozen=True, slots=True)
class NodeWiring:
    """One node's topology, and its NICs by device name; never changed once made."""

    digest: str
    topology: NodeTopology
    nics: dict[str, NicTopology]

    def rail(self, device: str) -> int | None:
        """The rail the NIC ``device`` serves; None when it serves none or is not known."""
        nic = self.nics.get(device)
        return nic.rail if nic is not None and nic.role == "rail" else None


class TopologyBook:
    """Node name -> its latest topology. Not thread-safe: used under the ingest lock."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeWiring] = {}

    def take(self, report: Report) -> bool:
        """Keep ``report``'s topology if it carries one; whether to ask for it.

        True when the report names a digest the book does not hold (and carries no
        topology): the reply sets ``topology_wanted``.
        """
        if report.topology is not None:
            self.put(report.node, report.topology, report.topology_digest)
            return False
        if not report.topology_digest:
            return False  # an agent that sends no topology
        held = self._nodes.get(report.node)
        return held is None or held.digest != report.topology_digest

    def put(self, node: str, topology: NodeTopology, digest: str = "") -> None:
        """Keep ``node``'s topology (``digest``: as its agent sent it; else computed)."""
        digest = digest or topology_digest(topology)
        held = self._nodes.get(node)
        if held is None or held.digest != digest:
            self._nodes[node] = NodeWiring(digest, topology, {n.device: n for n in topology.nics})

    def get(self, node: str) -> NodeWiring | None:
        return self._nodes.get(node)

    def wirings(self) -> dict[str, NodeWiring]:
        """Every node's wiring, as held now: a copy, safe to read without the lock."""
        return dict(self._nodes)

    def rail(self, node: str, device: str) -> int | None:
        """The rail a node's NIC serves; None when it serves none or is not known."""
        wiring = self._nodes.get(node)
        return wiring.rail(device) if wiring is not None else None

    def role(self, node: str, device: str) -> str | None:
        """``rail``, ``storage``, ``other``; None when the node's topology is not known."""
        wiring = self._nodes.get(node)
        if wiring is None:
            return None
        nic = wiring.nics.get(device)
        return nic.role if nic is not None else "other"
