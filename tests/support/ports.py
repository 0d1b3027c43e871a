"""Free loopback ports for the servers and processes tests start. One function for every
test and benchmark, because the kernel may hand the same free port to two servers started
together: the one that binds it second fails while the first answers its health checks.
So a port is never given twice in one process."""

from __future__ import annotations

import socket

#: The ports free_port() gave in this process.
_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, and none given before in this process."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN_PORTS:
            break
    _GIVEN_PORTS.add(port)
    return port
