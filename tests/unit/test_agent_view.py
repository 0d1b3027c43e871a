"""The agent's terminal view (``--simulate`` in a terminal): a row per GPU."""

from __future__ import annotations

from rich.console import Console

from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot, XidCount
from sn_monitor.agent.view import render_node


def test_a_gpus_faults_name_the_xids_seen_not_the_ones_counted_from_zero():
    gpu = GpuSample(index=0, uuid="GPU-a", name="H100", pci_bus_id="00000000:18:00.0")
    snapshot = NodeSnapshot(node="n1", timestamp_seconds=0.0, gpus=(gpu,), xid_counts=(
        XidCount(gpu=0, xid=13, count=2, uuid="GPU-a"),
        XidCount(gpu=0, xid=79, count=0, uuid="GPU-a")))
    console = Console(record=True, width=200)
    console.print(render_node(snapshot))
    text = console.export_text()
    assert "xid 13x2" in text
    assert "79x0" not in text
