"""The report stream's opening handshake and a client of its frames over a raw socket,
for the stream lane's tests and the event-delivery tests built on them."""

from __future__ import annotations

import socket

import msgspec

from sn_monitor.model import StreamReply
from sn_monitor.report_stream import STREAM_PATH, UPGRADE, FrameReader, frame
from tests.support.api import AGENT
from tests.support.report_lane import Reader


def opening(token: str | None = AGENT, upgrade: str = UPGRADE) -> bytes:
    head = (f"GET {STREAM_PATH} HTTP/1.1\r\nHost: controller\r\nConnection: Upgrade\r\n"
            f"Upgrade: {upgrade}\r\n")
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    return (head + "\r\n").encode()


class Stream:
    """An opened stream: frames out, answers in."""

    def __init__(self, sock: socket.socket, rest: bytes = b"") -> None:
        self.sock = sock
        self.reader = FrameReader(limit=1 << 20)
        self.answers: list[StreamReply] = []
        self._take(rest)

    def _take(self, data: bytes) -> None:
        for _, payload in self.reader.feed(data):
            self.answers.append(msgspec.json.decode(payload, type=StreamReply))

    def send(self, body: bytes, flags: int = 0) -> None:
        self.sock.sendall(frame(body, flags))

    def answer(self) -> StreamReply:
        """The next answer (waits for it, 5 s at most)."""
        self.sock.settimeout(5)
        while not self.answers:
            data = self.sock.recv(65536)
            assert data, "stream closed"
            self._take(data)
        return self.answers.pop(0)

    def closed(self) -> bool:
        self.sock.settimeout(5)
        while True:
            data = self.sock.recv(65536)
            if not data:
                return True
            self._take(data)


def open_stream(sock: socket.socket, token: str | None = AGENT) -> Stream:
    sock.sendall(opening(token))
    reader = Reader(sock)
    while b"\r\n\r\n" not in reader.buffer:
        assert reader._fill()
    head, _, rest = reader.buffer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    assert f"upgrade: {UPGRADE}".encode() in head.lower()
    return Stream(sock, rest)
