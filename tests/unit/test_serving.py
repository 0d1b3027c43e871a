"""A server that cannot bind its address says which address and why, never a traceback."""

from __future__ import annotations

import socket

import pytest

from sn_monitor.serving import ListenError, QuietHandler, ThreadedServer, listening_socket


def test_a_port_in_use_names_the_address(listening_port: int) -> None:
    with pytest.raises(ListenError, match=rf"^cannot listen on 127\.0\.0\.1:{listening_port}: "
                                          r"address already in use"):
        listening_socket("127.0.0.1", listening_port)
    with pytest.raises(ListenError, match=rf"^cannot listen on 127\.0\.0\.1:{listening_port}: "
                                          r"address already in use"):
        ThreadedServer("127.0.0.1", listening_port, QuietHandler, "test-http")


def test_a_port_past_65535_is_a_listen_error_not_an_overflow() -> None:
    with pytest.raises(ListenError, match=r"^cannot listen on 127\.0\.0\.1:99999: "):
        ThreadedServer("127.0.0.1", 99999, QuietHandler, "test-http")


def test_an_address_of_no_interface_here_is_said_so() -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never a local address.
    with pytest.raises(ListenError, match=r"^cannot listen on 192\.0\.2\.1:9847: no network "
                                          r"interface of this machine has that address"):
        listening_socket("192.0.2.1", 9847)


def test_a_bound_socket_listens_at_once() -> None:
    sock = listening_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # accepted into the backlog before any server runs
    finally:
        sock.close()


def test_an_ipv6_address_is_served() -> None:
    try:
        server = ThreadedServer("::1", 0, QuietHandler, "test-http")
    except ListenError as err:  # a machine without IPv6 loopback: said in words
        pytest.skip(str(err))
    server.start()
    try:
        with socket.create_connection(("::1", server.port), timeout=5):
            pass
    finally:
        server.stop()
