"""The systemd notify protocol, against a real datagram socket."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.notify import SystemdNotifier


@pytest.fixture
def listener(tmp_path: Path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    yield path, sock
    sock.close()


def test_ready_watchdog_and_stopping_are_sent(listener):
    path, sock = listener
    clock = ManualClock()
    notifier = SystemdNotifier(clock, {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "10000000"})
    notifier.ready("serving")
    assert sock.recv(256) == b"READY=1\nSTATUS=serving"
    notifier.watchdog()
    assert sock.recv(256) == b"WATCHDOG=1"
    notifier.stopping()
    assert sock.recv(256) == b"STOPPING=1"


def test_watchdog_is_sent_at_half_the_watchdog_interval(listener):
    path, sock = listener
    clock = ManualClock()
    notifier = SystemdNotifier(clock, {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "10000000"})
    sent = 0
    sock.settimeout(0.05)
    for _ in range(40):  # 20 s of 0.5 s cycles with a 10 s WatchdogSec: one per 5 s
        notifier.watchdog()
        clock.advance(0.5)
        try:
            sock.recv(256)
            sent += 1
        except TimeoutError:
            pass
    assert sent == 4


def test_abstract_socket_addresses(tmp_path):
    name = f"sn-monitor-test-{tmp_path.name}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        SystemdNotifier(ManualClock(), {"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv(64) == b"READY=1"
    finally:
        sock.close()


def test_without_systemd_nothing_happens():
    notifier = SystemdNotifier(ManualClock(), {})
    assert not notifier.enabled
    notifier.ready()
    notifier.watchdog()


def test_a_vanished_socket_is_logged_once(tmp_path, caplog):
    notifier = SystemdNotifier(ManualClock(), {"NOTIFY_SOCKET": str(tmp_path / "gone")})
    notifier.ready()
    notifier.stopping()
    assert caplog.text.count("cannot notify systemd") == 1
