"""The agent's HTTP server over a real socket: keep-alive, gzip negotiation, limits."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
from collections.abc import Iterator

import pytest

from sn_monitor.agent.exporter import SnapshotCollector
from sn_monitor.agent.exposition import ExpositionCache
from sn_monitor.agent.server import MAX_POST_BYTES, AgentHttpServer, accepts_gzip
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.clock import ManualClock
from tests.support.exporter import _snapshot


@pytest.fixture
def served() -> Iterator[tuple[AgentHttpServer, list[NodeSnapshot], list[bytes]]]:
    snapshots = [_snapshot()]
    posted: list[bytes] = []
    latest = lambda: snapshots[-1]  # noqa: E731
    cache = ExpositionCache(SnapshotCollector(latest).families, latest)
    server = AgentHttpServer("127.0.0.1", 0, cache, latest,
                             ManualClock(start=snapshots[0].timestamp_seconds), max_age=5.0)

    def post(body: bytes) -> tuple[int, dict[str, object]]:
        posted.append(body)
        return 202, {"ok": True}
    server.add_post_route("/commands", post)
    server.start()
    try:
        yield server, snapshots, posted
    finally:
        server.stop()


def test_scrapes_share_one_connection(served) -> None:
    server, snapshots, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        first = conn.getresponse()
        body = first.read()
        sock = conn.sock
        assert first.status == 200
        assert first.version == 11
        assert b"sn_gpu_temperature_celsius" in body
        snapshots.append(_snapshot(timestamp_seconds=snapshots[0].timestamp_seconds + 1))
        conn.request("GET", "/metrics")
        second = conn.getresponse()
        newer = second.read()
        assert conn.sock is sock  # the same connection: kept alive
        assert b"1.700000001e+09" in newer
        assert newer != body
        conn.request("GET", "/healthz")
        health = conn.getresponse()
        assert health.status == 200
        assert json.loads(health.read())["status"] == "ok"
        assert conn.sock is sock
    finally:
        conn.close()


@pytest.mark.parametrize(("header", "gzipped"), [
    ("gzip", True), ("deflate, gzip;q=1.0, *;q=0.5", True), ("GZIP", True), ("*", True),
    ("gzip;q=0", False), ("identity", False), ("", False), (None, False),
    ("gzip;q=zero", False), ("*;q=0, gzip", True), ("gzip;q=0, *", False),
    ("br, *;q=0.1", True)])
def test_gzip_when_the_scraper_accepts_it(served, header: str | None, gzipped: bool) -> None:
    assert accepts_gzip(header) is gzipped
    server = served[0]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={} if header is None
                     else {"Accept-Encoding": header})
        reply = conn.getresponse()
        data = reply.read()
    finally:
        conn.close()
    assert (reply.getheader("Content-Encoding") == "gzip") is gzipped
    text = gzip.decompress(data) if gzipped else data
    assert text.startswith(b"# HELP sn_agent_info")
    assert int(reply.getheader("Content-Length") or -1) == len(data)


def test_a_post_over_the_limit_is_refused_unread(served) -> None:
    server, _, posted = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /commands HTTP/1.1\r\nHost: x\r\nContent-Length: "
                     + str(MAX_POST_BYTES + 1).encode() + b"\r\n\r\n")
        reply = sock.makefile("rb").read()  # answered, then closed: the body is never read
    assert reply.startswith(b"HTTP/1.1 413")
    assert b"body too large" in reply
    assert posted == []


def test_a_post_within_the_limit_reaches_its_handler(served) -> None:
    server, _, posted = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", "/commands", body=b'{"a": 1}')
        reply = conn.getresponse()
        assert reply.status == 202
        assert json.loads(reply.read()) == {"ok": True}
        conn.request("GET", "/nothing")
        missing = conn.getresponse()
        assert missing.status == 404
        missing.read()
    finally:
        conn.close()
    assert posted == [b'{"a": 1}']


def test_a_post_without_a_length_is_refused_unread(served) -> None:
    server, _, posted = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /commands HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n{}")
        reply = sock.makefile("rb").read()  # answered, then closed
    assert reply.startswith(b"HTTP/1.1 400")
    assert b"Content-Length: not a length" in reply
    assert posted == []
