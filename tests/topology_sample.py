"""A ``GET /api/v1/topology`` answer built by hand, the shape of /work's contract for issue 18.

:func:`sample_topology` builds a fleet of HGX-like nodes (8 GPUs on 4 NVSwitches, 8 rail
NICs and 2 storage NICs) over supernodes and racks, with a job and, on request, a failed
port and a fail-slow entry: the terminal rendering's unit tests read it.
"""

from __future__ import annotations

from typing import Any

GPUS = 8
RAILS = 8
RATE = 5e10  # 400 Gb/s in bytes per second


def _gpu(index: int) -> dict[str, Any]:
    return {
        "index": index, "uuid": f"GPU-{index:08x}", "pci_bus_id": f"0000:{0x18 + index:02x}:00.0",
        "numa_node": 0 if index < 4 else 1, "health": "ok", "utilization_ratio": 0.93,
        "temperature_celsius": 61.0, "sm_clock_hertz": 1.98e9, "sm_max_clock_hertz": 1.98e9,
        "throttle_reasons": [], "nvlinks": 18, "nvlinks_down": 0, "processes": 1,
        "nvlink_transmit_bytes_per_second": 1.2e11, "nvlink_errors_per_second": 0.0,
        "peers": [{"kind": "switch", "links": links, "pci_bus_id": f"0000:{0x80 + s:02x}:00.0"}
                  for s, links in enumerate((5, 4, 4, 5))],
        "nics": {f"mlx5_{n}": "PIX" if n == index else "NODE" for n in range(RAILS)},
    }


def _port(health: str = "ok", state: int = 4, rate: float = RATE) -> dict[str, Any]:
    return {
        "port": 1, "guid": "0c42:a103:0001:0002", "link_layer": "InfiniBand", "state": state,
        "health": health, "rate_bytes_per_second": rate, "max_rate_bytes_per_second": RATE,
        "transmit_bytes_per_second": 3.9e10, "receive_bytes_per_second": 3.9e10,
        "utilization_ratio": 0.78, "transmit_wait_per_second": 1.2e5,
        "ecn_marked_per_second": 0.0, "cnp_per_second": 0.0, "errors_per_second": 0.0,
    }


def _node(name: str, supernode: str, rack: str, jobs: list[str]) -> dict[str, Any]:
    nics = [{"device": f"mlx5_{i}", "role": "rail", "rail": i,
             "pci_bus_id": f"0000:{0x19 + i:02x}:00.0", "numa_node": 0 if i < 4 else 1,
             "netdev": f"ibp{0x19 + i}s0", "ports": [_port()]} for i in range(RAILS)]
    nics += [{"device": f"mlx5_{i}", "role": "storage", "rail": None,
              "pci_bus_id": f"0000:{0xa0 + i:02x}:00.0", "numa_node": i - RAILS,
              "netdev": f"enp{0xa0 + i}s0",
              "ports": [{**_port(rate=2.5e10), "link_layer": "Ethernet",
                         "max_rate_bytes_per_second": 2.5e10}]}
             for i in (RAILS, RAILS + 1)]
    return {"name": name, "supernode": supernode, "rack": rack, "state": "healthy",
            "health": "ok", "jobs": jobs, "incidents": [], "has_topology": True,
            "nvswitches": 4, "gpus": [_gpu(i) for i in range(GPUS)], "nics": nics}


def sample_topology(nodes: int = 4, racks: int = 2, supernodes: int = 1, *,
                    job: str | None = "llm", job_nodes: int | None = None,
                    port_down: tuple[str, str] | None = None,
                    fail_slow: bool = False) -> dict[str, Any]:
    """``nodes`` nodes ``sim-0``... spread evenly over ``racks`` racks per supernode.

    ``port_down`` (node, device): that port DOWN (failed); ``fail_slow``: a congested-link
    entry on the second node's ``mlx5_3`` for ``job``.
    """
    names = [f"sim-{i}" for i in range(nodes)]
    in_job = names[: job_nodes if job_nodes is not None else nodes] if job else []
    all_racks = [(f"sn{s}", f"r{s * racks + r}") for s in range(supernodes) for r in range(racks)]
    per_rack = -(-nodes // len(all_racks))
    placed = {name: all_racks[i // per_rack] for i, name in enumerate(names)}
    doc_nodes = {name: _node(name, sn, rack, [job] if job and name in in_job else [])
                 for name, (sn, rack) in placed.items()}
    doc: dict[str, Any] = {
        "time": 1733170000.0, "job": None,
        "supernodes": [{"name": sn, "racks": [
            {"name": rack, "nodes": [n for n in names if placed[n] == (sn, rack)]}
            for s2, rack in all_racks if s2 == sn]}
            for sn in dict.fromkeys(s for s, _ in all_racks)],
        "rails": [{"rail": i, "health": "ok",
                   "ports": [{"node": n, "device": f"mlx5_{i}", "port": 1} for n in names]}
                  for i in range(RAILS)],
        "nodes": doc_nodes,
        "jobs": ([{"name": job, "state": "running", "nodes": in_job,
                   "ranks": {n: list(range(k * GPUS, (k + 1) * GPUS))
                             for k, n in enumerate(in_job)},
                   "step_time_seconds": 1.02, "baseline_step_time_seconds": 1.0,
                   "slowdown_ratio": 0.02}] if job else []),
        "fail_slow": [],
    }
    if port_down is not None:
        node, device = port_down
        nic = next(n for n in doc_nodes[node]["nics"] if n["device"] == device)
        nic["ports"][0].update(state=1, health="failed", utilization_ratio=0.0,
                               transmit_bytes_per_second=0.0, receive_bytes_per_second=0.0)
        doc_nodes[node].update(health="degraded", state="degraded")
        doc["rails"][nic["rail"]]["health"] = "degraded"
    if fail_slow and job and len(in_job) > 1:
        node = in_job[1]
        nic = next(n for n in doc_nodes[node]["nics"] if n["device"] == "mlx5_3")
        nic["ports"][0].update(health="degraded", transmit_wait_per_second=4.8e6,
                               utilization_ratio=0.41)
        doc["fail_slow"].append({
            "job": job, "node": node, "link": "mlx5_3", "kind": "congested-link", "rail": 3,
            "gpu": None, "since": 1733169900.0, "slowdown_ratio": 0.18,
            "message": f"job {job}: step time +18 % since 10:45; rail 3 on {node} (mlx5_3): "
                       "xmit_wait 40x the rail median"})
        doc["jobs"][0].update(step_time_seconds=1.18, slowdown_ratio=0.18)
    return doc
