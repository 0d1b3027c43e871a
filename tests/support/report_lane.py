"""Raw HTTP requests to the controller's report lane and a reader of its answers, for the
tests that send the lane bytes no client library would (oversized, truncated, pipelined)."""

from __future__ import annotations

import socket

from tests.support.api import AGENT

#: The body limit of the ``app`` fixture (conftest.py): small, so tests cross it cheaply.
MAX_BODY = 64 * 1024


def request(body: bytes, *, token: str | None = AGENT, version: str = "1.1",
            path: str = "/api/v1/reports", extra: str = "", chunked: bool = False) -> bytes:
    head = f"POST {path} HTTP/{version}\r\nHost: controller\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    head += "Content-Type: application/json\r\n" + extra
    if chunked:
        head += "Transfer-Encoding: chunked\r\n\r\n"
        return head.encode() + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    return head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


class Reader:
    """HTTP/1.1 responses read off one socket, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed mid-response: {self.buffer!r}"
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = 0 if status == 100 else int(headers["content-length"])
        while len(self.buffer) < length:
            assert self._fill(), "connection closed mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, body

    def closed(self) -> bool:
        self.sock.settimeout(5)
        return self.buffer == b"" and not self._fill()
