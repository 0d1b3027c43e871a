"""The demo's supernode: its port probe agrees with the servers it starts."""

from __future__ import annotations

import socket

from sn_monitor.sim.fleet import node_name
from sn_monitor.sim.supernode import node_labels, port_free


def _leave_time_wait() -> int:
    """A port that served one connection, closed server side first: TIME_WAIT, no listener."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = int(server.getsockname()[1])
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    accepted, _ = server.accept()
    accepted.close()  # the side that closes first keeps the TIME_WAIT
    server.close()
    client.close()
    return port


def test_a_port_in_time_wait_is_free_to_the_next_run() -> None:
    port = _leave_time_wait()
    plain = socket.socket()
    try:
        plain.bind(("127.0.0.1", port))
        time_wait = False
    except OSError:
        time_wait = True  # what the old probe (no SO_REUSEADDR) saw: "taken"
    finally:
        plain.close()
    assert time_wait, "no TIME_WAIT was left: the test did not set up what it checks"
    assert port_free("127.0.0.1", port)


def test_a_port_someone_listens_on_is_taken() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        assert not port_free("127.0.0.1", int(server.getsockname()[1]))
    finally:
        server.close()


def test_the_demos_nodes_sit_in_racks_of_four_of_supernode_sn0() -> None:
    racks: dict[str, list[str]] = {}
    for index in range(16):
        labels = node_labels(index)
        assert labels["supernode"] == "sn0"
        racks.setdefault(labels["rack"], []).append(node_name(index, 16))
    assert racks == {"r00": ["sim-0000", "sim-0001", "sim-0002", "sim-0003"],
                     "r01": ["sim-0004", "sim-0005", "sim-0006", "sim-0007"],
                     "r02": ["sim-0008", "sim-0009", "sim-0010", "sim-0011"],
                     "r03": ["sim-0012", "sim-0013", "sim-0014", "sim-0015"]}
