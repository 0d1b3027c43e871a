"""``sn-monitor simulate``'s load client: a few connections carrying the nodes' reports.

:class:`LoadClient` holds ``--connections`` :class:`Connection` objects on one selector,
in one thread. The fleet's loop (:meth:`sn_monitor.sim.fleet.Fleet.run`) decides which
report goes next and hands it to the connection that has waited longest
(:meth:`LoadClient.send`); a connection only moves bytes and says what came back. Each
connection is a small state machine:

- ``closed`` → :meth:`Connection.connect` → ``posting`` (keep-alive HTTP, one request in
  flight: ``node`` is set until its response is read), or ``opening`` when reports go on
  streams (the upgrade sent, :mod:`sn_monitor.report_stream`);
- ``opening`` → ``101`` → ``streaming`` (reports go out as they fall due; answers come
  for those that asked); an answer that the controller has no streams (404 ...) →
  ``closed``, and every connection posts from then on; any other answer → ``closed``,
  counted as refused or failed;
- ``posting`` without a request for :data:`STALE_AFTER_SECONDS` → ``closed`` (the
  server may be closing it) and connected again at once;
- any state → an error, an end of file, a timeout → ``closed``, the nodes it carried
  free to report again; connected again on the loop's next turn (after
  :data:`RETRY_SECONDS` when connecting failed or the stream was refused).

Why a class per connection over ``selectors`` and not asyncio: the fleet sends ~8,000
reports a second from one thread, beside a controller on a 2-core machine, so a report
must cost little: about 20 µs of CPU in all, most of it the ``sendall``, the rest a few
attribute writes. asyncio would add a task or a future, an ``await`` and the event
loop's own bookkeeping to each, and spread the one
schedule (which report next, which connection in turn) across coroutines. The states
above are the whole client; the loop that drives them is :class:`LoadClient`'s five
steps (:meth:`~LoadClient.maintain`, :meth:`~LoadClient.send`, :meth:`~LoadClient.wait`,
:meth:`~LoadClient.finish`, :meth:`~LoadClient.close`).

What the answers carry (events acknowledged, commands, node-local rules) is the
fleet's to act on (:class:`Reporting`); this module counts what the controller
answered (:class:`FleetStats`) and how long it took (:class:`Samples`).
"""

from __future__ import annotations

import random
import selectors
import socket
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol
from urllib.parse import urlsplit

import msgspec

from sn_monitor import __version__
from sn_monitor.agent.stream import StreamAnswer
from sn_monitor.report_stream import (
    ACK,
    ASK_EVERY_SECONDS,
    NO_STREAM_STATUSES,
    FrameReader,
    frame,
    opening,
)
from sn_monitor.sim.fleet_node import FleetNode
from sn_monitor.transport import describe_failure, error_text

REPORTS_PATH = "/api/v1/reports"
#: A request with no full response after this long fails and its connection is closed.
REQUEST_TIMEOUT_SECONDS = 10.0
#: A kept-alive connection unused this long is replaced before its next request: servers
#: close idle ones (uvicorn after 5 s), and a request sent as the server closes is lost.
STALE_AFTER_SECONDS = 4.0
#: Latencies kept for the percentiles (a uniform sample beyond this many).
MAX_SAMPLES = 200_000
#: After a failed connect or a refused stream, the wait before the next try.
RETRY_SECONDS = 0.5
#: At the end, how long the answers still in flight are waited for.
DRAIN_SECONDS = 5.0


# ---------------------------------------------------------------- statistics


class Samples:
    """A bounded uniform sample of measurements (reservoir), for percentiles."""

    def __init__(self, rng: random.Random) -> None:
        self.values: list[float] = []
        self.seen = 0
        self.max = 0.0
        self._rng = rng

    def add(self, value: float) -> None:
        self.seen += 1
        self.max = max(self.max, value)
        if len(self.values) < MAX_SAMPLES:
            self.values.append(value)
        else:
            slot = self._rng.randrange(self.seen)
            if slot < MAX_SAMPLES:
                self.values[slot] = value

    def summary(self) -> dict[str, float | int | None]:
        ordered = sorted(self.values)

        def pick(q: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

        return {"n": self.seen, "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99),
                "max": round(self.max, 3) if ordered else None}


@dataclass
class FleetStats:
    """What the controller answered, and what the fleet did."""

    sent: int = 0
    accepted: int = 0
    refused: Counter[int] = field(default_factory=Counter)
    server_errors: Counter[int] = field(default_factory=Counter)
    connection_errors: int = 0
    timeouts: int = 0
    not_sent: int = 0
    lost_skipped: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    events_sent: int = 0
    events_acknowledged: int = 0
    #: Events-only reports sent at once (fast_events), and those whose node was still
    #: waiting for an answer, so that its events went with its next report.
    events_only_sent: int = 0
    events_only_deferred: int = 0
    messages: Counter[str] = field(default_factory=Counter)
    faults_played: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(self.server_errors.values()) + self.connection_errors + self.timeouts

    def note(self, message: str) -> None:
        """Keep a refusal or error message (the first 20 distinct ones, counted)."""
        if message in self.messages or len(self.messages) < 20:
            self.messages[message] += 1

    def answered(self, status: int) -> None:
        """Count a report the controller did not accept: refused (4xx) or failed (5xx)."""
        counted = self.server_errors if status >= 500 else self.refused
        counted[status] += 1


# ---------------------------------------------------------------- the fleet's side


class Outgoing(NamedTuple):
    """One report as encoded for a node, and what it carries."""

    body: bytes
    events: int
    results: int
    topology: bool


class Reporting(Protocol):
    """The fleet as its connections see it: the reports, and where the replies go."""

    def report(self, node: FleetNode, now: float) -> Outgoing:
        """``node``'s next report (its sequence moved on), at monotonic time ``now``."""
        ...

    def take_reply(self, node: FleetNode, body: bytes, now: float) -> None:
        """Act on a reply to one of ``node``'s reports (events, commands, rules)."""
        ...


@dataclass(frozen=True)
class ControllerAddress:
    """Where the reports go: ``http(s)://host:port/prefix``."""

    host: str
    port: int
    #: The controller URL's own path, before the API's paths.
    prefix: str
    tls: ssl.SSLContext | None

    @classmethod
    def parse(cls, url: str, ca_file: str | None) -> ControllerAddress:
        """ValueError for a URL that is not http(s)://host..., or an unreadable CA file."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s)://host:port controller URL, got {url!r}")
        tls = None
        if parts.scheme == "https":
            try:
                tls = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as err:
                raise ValueError(f"--ca-file {ca_file}: {err}") from None
        return cls(host=parts.hostname, port=parts.port or (443 if tls else 80),
                   prefix=parts.path.rstrip("/"), tls=tls)


# ---------------------------------------------------------------- one connection


State = Literal["closed", "opening", "streaming", "posting"]


class Connection:
    """One connection to the controller; its states are the module's list."""

    __slots__ = ("buffer", "client", "node", "retry_at", "sent_at", "sock", "state",
                 "stream", "used_at", "waiting")

    def __init__(self, client: LoadClient) -> None:
        self.client = client
        self.state: State = "closed"
        self.sock: socket.socket | None = None
        self.buffer = b""
        #: Posting: the node whose report is in flight, and when it was sent.
        self.node: FleetNode | None = None
        self.sent_at = 0.0
        self.used_at = 0.0
        self.retry_at = 0.0
        #: Streaming: the answers' frames.
        self.stream: FrameReader | None = None
        #: A stream's reports that asked for an answer: (node index, sequence) -> when.
        self.waiting: dict[tuple[int, int], float] = {}

    # ------------------------------------------------------------ connect, close

    def connect(self, now: float) -> bool:
        """Open the connection; True when it can take a report at once (posting)."""
        client = self.client
        address = client.address
        try:
            sock = socket.create_connection((address.host, address.port), timeout=5.0)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if address.tls is not None:
                sock = address.tls.wrap_socket(sock, server_hostname=address.host)
        except OSError as err:
            client.stats.connection_errors += 1
            client.stats.note(f"connect to {address.host}:{address.port}: "
                              f"{describe_failure(err)}")
            self.retry_at = now + RETRY_SECONDS
            return False
        self.sock = sock
        self.buffer = b""
        self.used_at = now
        client.selector.register(sock, selectors.EVENT_READ, self)
        if not client.streams:
            self.state = "posting"
            return True
        if not self._send_bytes(client.upgrade, now):
            self.retry_at = now + RETRY_SECONDS
            return False
        self.state = "opening"
        return False  # it takes reports once the controller switched protocols

    def close(self, now: float) -> None:
        """Closed: the nodes it carried may report again; connected again from ``now``."""
        client = self.client
        if self.sock is not None:
            client.selector.unregister(self.sock)
            self.sock.close()
        self.sock = None
        self.retry_at = now
        if self.node is not None:
            self.node.in_flight = False
            self.node = None
        for index, _ in self.waiting:
            client.nodes[index].in_flight = False
            client.nodes[index].results_in_flight = 0
        self.waiting.clear()
        self.state = "closed"
        self.stream = None
        client.busy.discard(self)
        if self in client.idle:
            client.idle.remove(self)

    # ------------------------------------------------------------ send

    def send(self, node: FleetNode, now: float, ask: bool = False) -> None:
        """Send ``node``'s next report: framed on a stream, else posted."""
        client = self.client
        out = client.fleet.report(node, now)
        if self.state == "streaming":
            ask = (ask or out.events > 0 or out.results > 0 or out.topology
                   or now - node.asked_at >= ASK_EVERY_SECONDS)
            data = frame(out.body, ACK if ask else 0)
        else:
            data = client.header + str(len(out.body)).encode() + b"\r\n\r\n" + out.body
        if not self._send_bytes(data, now):
            return
        client.stats.sent += 1
        client.stats.events_sent += out.events
        if out.topology:
            node.topology_due = False  # a controller that missed it asks again
        if self.state == "streaming":
            client.idle.append(self)  # a stream takes the next report at once
            if not ask:
                return
            node.asked_at = now
            self.waiting[(node.index, node.sequence)] = time.perf_counter()
        else:
            self.node = node
            self.sent_at = time.perf_counter()
            client.busy.add(self)
        if out.results or not node.in_flight:  # an events-only report carries none
            node.results_in_flight = out.results
        node.in_flight = True

    def _send_bytes(self, data: bytes, now: float) -> bool:
        assert self.sock is not None
        try:
            self.sock.sendall(data)
        except OSError as err:
            self.client.stats.connection_errors += 1
            self.client.stats.note(f"send: {err}")
            self.close(now)
            return False
        return True

    # ------------------------------------------------------------ read

    def readable(self, now: float) -> None:
        """Read what the controller sent and act on every whole answer in it."""
        data = self._receive()
        if data is None:
            return
        if not data:
            if self.node is not None or self.waiting or self.state == "opening":
                self.client.stats.connection_errors += 1
            self.close(now)
            return
        if self.state == "streaming":
            self._answers(data, now)
            return
        self.buffer += data
        if self.state == "opening":
            self._opened(now)
        else:
            self._responses(now)

    def _receive(self) -> bytes | None:
        """What the socket holds (b"": closed or failed; None: nothing after all)."""
        sock = self.sock
        assert sock is not None
        tls = sock if isinstance(sock, ssl.SSLSocket) else None
        if tls is not None:
            # Readable is not "application data" over TLS: a TLS 1.3 server sends
            # session tickets after the handshake. Read without blocking.
            tls.setblocking(False)
        try:
            data = sock.recv(65536)
            while tls is not None and tls.pending():
                data += tls.recv(65536)
        except (BlockingIOError, ssl.SSLWantReadError):
            return None
        except OSError as err:
            data = b""
            self.client.stats.note(f"receive: {err}")
        finally:
            if tls is not None:
                tls.settimeout(5.0)  # sendall blocks, within a bound
        return data

    def _opened(self, now: float) -> None:
        """The answer to a stream's opening, once its head is in the buffer."""
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        status = _status(self.buffer)
        client = self.client
        if status == 101:
            rest = self.buffer[head_end + 4:]
            self.state, self.buffer = "streaming", b""
            self.stream = FrameReader(1 << 26)
            self.used_at = now
            client.idle.append(self)
            if rest:
                self._answers(rest, now)
            return
        length = _content_length(self.buffer[:head_end].lower())
        if len(self.buffer) < head_end + 4 + length:
            return
        body = self.buffer[head_end + 4:head_end + 4 + length]
        self.close(now)
        if status in NO_STREAM_STATUSES:
            client.streams = False
            client.stats.note(f"the controller has no reports' stream ({status}): "
                              "posting the reports")
            return
        self.retry_at = now + RETRY_SECONDS
        client.stats.answered(status)
        client.stats.note(f"{status}: {error_text(body, 200)} (opening a stream)")

    def _responses(self, now: float) -> None:
        """Every whole HTTP response in the buffer (posting)."""
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].lower()
            length = _content_length(head)
            if len(self.buffer) < head_end + 4 + length:
                return
            status = _status(self.buffer)
            body = self.buffer[head_end + 4:head_end + 4 + length]
            self.buffer = self.buffer[head_end + 4 + length:]
            self._response(status, body, now)
            if b"connection: close" in head:
                self.close(now)
                return

    def _response(self, status: int, body: bytes, now: float) -> None:
        """The answer to a posted report: the connection free again, the node too."""
        client = self.client
        node = self.node
        self.node = None
        self.used_at = now
        client.busy.discard(self)
        client.idle.append(self)
        if node is None:
            return
        node.in_flight = False
        client.latency.add((time.perf_counter() - self.sent_at) * 1e3)
        if 200 <= status < 300:
            client.stats.accepted += 1
            if node.results_in_flight:
                del node.results[:node.results_in_flight]
                node.results_in_flight = 0
            if node.events or b"commands" in body or b"edge_rules" in body:
                client.fleet.take_reply(node, body, now)
            return
        node.results_in_flight = 0
        client.stats.answered(status)
        client.stats.note(f"{status}: {error_text(body, 200)}")

    def _answers(self, data: bytes, now: float) -> None:
        """A stream's answers: counts, the nodes that waited, what the replies carry."""
        assert self.stream is not None
        client = self.client
        stats = client.stats
        for _, payload in self.stream.feed(data):
            try:
                answer = msgspec.json.decode(payload, type=StreamAnswer)
            except msgspec.DecodeError as err:
                stats.note(f"undecodable stream answer: {err}")
                continue
            stats.accepted += answer.accepted
            index = client.index_of.get(answer.node)
            node = client.nodes[index] if index is not None else None
            sent_at = (self.waiting.pop((index, answer.sequence), None)
                       if index is not None else None)
            if node is not None and sent_at is not None:
                node.in_flight = False
                client.latency.add((time.perf_counter() - sent_at) * 1e3)
            if answer.status != 200:
                if node is not None:
                    node.results_in_flight = 0
                stats.answered(answer.status)
                stats.note(f"{answer.status}: {answer.error[:200]}")
                continue
            if node is None or not len(answer.reply):
                continue
            if sent_at is not None and node.results_in_flight:
                del node.results[:node.results_in_flight]
                node.results_in_flight = 0
            client.fleet.take_reply(node, bytes(answer.reply), now)
        if self.stream.too_large is not None:
            stats.note(f"stream answer: {self.stream.too_large}")
            self.close(now)

    # ------------------------------------------------------------ timeouts

    def expire(self, now: float, sent_before: float) -> None:
        """Close a stream not opened in time, or one with answers late since ``sent_before``."""
        stats = self.client.stats
        if self.state == "opening" and now - self.used_at > REQUEST_TIMEOUT_SECONDS:
            stats.timeouts += 1
            stats.note(f"stream not opened within {REQUEST_TIMEOUT_SECONDS:g} s")
            self.close(now)
        late = sum(1 for at in self.waiting.values() if at < sent_before)
        if late:
            stats.timeouts += late
            stats.note(f"no answer within {REQUEST_TIMEOUT_SECONDS:g} s")
            self.close(now)


# ---------------------------------------------------------------- the connections


class LoadClient:
    """The fleet's connections: which are free to send, their reading and their timeouts.

    ``idle``: the connections that can take a report now, longest-waiting first (a
    posting one without a request in flight, an open stream); ``busy``: the posting ones
    with a request in flight. ``streams``: reports go on streams (False: posted, by
    choice or because the controller has none).
    """

    def __init__(self, fleet: Reporting, address: ControllerAddress, *, connections: int,
                 streams: bool, token: str | None, nodes: list[FleetNode],
                 stats: FleetStats, latency: Samples, now: float) -> None:
        self.fleet = fleet
        self.address = address
        self.streams = streams
        self.nodes = nodes
        self.index_of = {node.name: node.index for node in nodes}
        self.stats = stats
        self.latency = latency
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.header = (f"POST {address.prefix}{REPORTS_PATH} HTTP/1.1\r\n"
                       f"Host: {address.host}:{address.port}\r\n"
                       f"Content-Type: application/json\r\nUser-Agent: sn-monitor-simulate/"
                       f"{__version__}\r\n{auth}Content-Length: ").encode()
        self.upgrade = opening(address.prefix, address.host, address.port,
                               f"sn-monitor-simulate/{__version__}", token)
        self.selector = selectors.DefaultSelector()
        self.connections = [Connection(self) for _ in range(max(1, connections))]
        self.idle: list[Connection] = []
        self.busy: set[Connection] = set()
        self._next_expiry = now + 1.0

    @property
    def free(self) -> bool:
        """Whether a connection can take a report now."""
        return bool(self.idle)

    def maintain(self, now: float) -> None:
        """Replace stale kept-alive connections, reconnect closed ones, close late ones."""
        for conn in [c for c in self.idle if c.stream is None
                     and now - c.used_at > STALE_AFTER_SECONDS]:
            conn.close(now)  # reconnected just below
        for conn in self.connections:
            if conn.sock is None and conn.retry_at <= now and conn.connect(now):
                self.idle.append(conn)
        for conn in list(self.busy):
            if time.perf_counter() - conn.sent_at > REQUEST_TIMEOUT_SECONDS:
                self.stats.timeouts += 1
                self.stats.note(f"no response within {REQUEST_TIMEOUT_SECONDS:g} s")
                conn.close(now)
        if now >= self._next_expiry:
            self._next_expiry = now + 1.0
            sent_before = time.perf_counter() - REQUEST_TIMEOUT_SECONDS
            for conn in self.connections:
                conn.expire(now, sent_before)

    def send(self, node: FleetNode, now: float) -> None:
        """``node``'s report on the connection that has been free longest (in turn)."""
        self.idle.pop(0).send(node, now)

    def wait(self, timeout: float) -> None:
        """Read what arrives within ``timeout`` seconds (sleep when nothing is open)."""
        if self.selector.get_map():
            self._read(timeout)
        else:
            time.sleep(timeout)

    def finish(self) -> None:
        """One last report that asks on each stream, then the answers still in flight.

        Its answer counts what the stream carried; what is still unanswered after
        :data:`DRAIN_SECONDS` is a timeout.
        """
        for k, conn in enumerate(c for c in self.connections if c.stream is not None):
            node = self.nodes[k % len(self.nodes)]
            if not node.in_flight and not node.lost:
                conn.send(node, time.monotonic(), ask=True)
        drain_until = time.monotonic() + DRAIN_SECONDS
        while ((self.busy or any(c.waiting for c in self.connections))
               and time.monotonic() < drain_until):
            self._read(0.1)
        for conn in self.connections:
            if conn in self.busy or conn.waiting:
                self.stats.timeouts += len(conn.waiting) or 1
                conn.close(time.monotonic())

    def close(self) -> None:
        """Close every socket and the selector."""
        for conn in self.connections:
            if conn.sock is not None:
                conn.sock.close()
        self.selector.close()

    def _read(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            conn: Connection = key.data
            conn.readable(time.monotonic())


def _status(response: bytes) -> int:
    """The status code of ``HTTP/1.1 200 OK...`` (0 when it is not one)."""
    try:
        return int(response[9:12])
    except ValueError:
        return 0


def _content_length(head: bytes) -> int:
    """The Content-Length of a response head (lower-cased); 0 when there is none."""
    at = head.find(b"content-length:")
    if at < 0:
        return 0
    line_end = head.find(b"\r\n", at)
    try:
        return int(head[at + 15:line_end if line_end >= 0 else None])
    except ValueError:
        return 0
