"""The reports' stream: one connection on which an agent's reports flow without answers.

``POST /api/v1/reports`` answers every report: at 8,192 nodes a second that is 8,192
writes a second from the controller, each of them a system call that also runs the TCP
receive path of the agent's side, plus an HTTP head built for it; most of those answers
say only "stored". On the stream the controller answers a report only when it has
something to say.

**Opening.** ``GET /api/v1/reports/stream`` with ``Connection: Upgrade`` and ``Upgrade:``
:data:`UPGRADE` (and the agent's ``Authorization``, or its client certificate, as for
``POST /api/v1/reports``). ``101 Switching Protocols`` opens the stream; anything else
is an ordinary HTTP answer: a standby's 503, a 401, or 404 from a controller of an
earlier version (the agent then posts its reports, and asks again later).

**Frames**, both ways: a 4-byte big-endian payload length, a flags byte, the payload.

- agent -> controller: the payload is a report's JSON, exactly the body
  ``POST /api/v1/reports`` takes; flag :data:`ACK`: answer it even with nothing to say.
- controller -> agent: the payload is a :class:`~sn_monitor.model.StreamReply`'s JSON.

**When the controller answers a report**: when it asks for an :data:`ACK`, when it was
refused (the status and message a POST would have had), and when the answer carries
commands or node-local rules. Each answer counts the reports the stream accepted since
the one before (``accepted``), so a sender that multiplexes nodes (``simulate``) can
count them. The reports are taken in order; an answer names the report (node and
sequence) it answers.

A frame over the controller's body limit is answered 413 and the stream closed. The
controller closes a stream idle for :data:`IDLE_SECONDS`, and every stream when it stops;
the agent opens a new one for its next report.
"""

from __future__ import annotations

from typing import Final

import msgspec

STREAM_PATH: Final = "/api/v1/reports/stream"
#: The protocol name in the ``Upgrade`` header (its version after the slash).
UPGRADE: Final = "sn-reports/1"
#: The controller's answer that opens a stream.
SWITCHING: Final = (b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: "
                    + UPGRADE.encode() + b"\r\n\r\n")
#: Answers to the opening that mean "no streams here" (a controller of an earlier version,
#: a server that knows no such route or method): the sender posts its reports.
NO_STREAM_STATUSES: Final = frozenset({400, 404, 405, 426, 501})
#: Flag: answer this report even if there is nothing to say (events and command results
#: wait for it; the agent also asks now and then, to know the controller is there).
ACK: Final = 0x01
#: A sender asks for an answer at least this often: a controller that stopped answering
#: (hung, or cut off) is noticed within this plus the sender's timeout.
ASK_EVERY_SECONDS: Final = 5.0
HEADER_BYTES: Final = 5
#: A stream with no frame for this long is closed by the controller.
IDLE_SECONDS: Final = 600.0


def opening(path: str, host: str, port: int, user_agent: str, token: str | None) -> bytes:
    """The request that opens a stream; ``path`` is the controller URL's own path prefix."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    netloc = f"[{host}]" if ":" in host else host
    return (f"GET {path.rstrip('/')}{STREAM_PATH} HTTP/1.1\r\nHost: {netloc}:{port}\r\n"
            f"Connection: Upgrade\r\nUpgrade: {UPGRADE}\r\nUser-Agent: {user_agent}\r\n"
            f"{auth}\r\n").encode()


class ReportHead(msgspec.Struct):
    """Who a report is from and its sequence, read leniently from its JSON."""

    node: str = ""
    sequence: int = -1


_read_head = msgspec.json.Decoder(ReportHead).decode


def report_head(payload: bytes) -> ReportHead:
    """The report's node (at most 256 characters) and sequence; empty when unreadable."""
    try:
        head = _read_head(payload)
    except msgspec.DecodeError:
        return ReportHead()
    return ReportHead(node=head.node[:256], sequence=head.sequence)


class FrameTooLarge(ValueError):
    """A frame header announces more than the reader's limit."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame of {length} bytes, larger than {limit}")
        self.length = length
        self.limit = limit


def frame(payload: bytes, flags: int = 0) -> bytes:
    """One frame: length, flags, payload."""
    return len(payload).to_bytes(4, "big") + bytes((flags,)) + payload


class FrameReader:
    """Frames out of a byte stream that arrives in arbitrary pieces.

    A header announcing more than ``limit`` ends the reading: the frames before it are
    returned, :attr:`too_large` says why, and nothing more is read.
    """

    __slots__ = ("_buffer", "limit", "too_large")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = b""
        self.too_large: FrameTooLarge | None = None

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet whole."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole frames ``data`` completes, as (flags, payload)."""
        if self.too_large is not None:
            return []
        buffer = self._buffer + data if self._buffer else data
        frames: list[tuple[int, bytes]] = []
        at, size = 0, len(buffer)
        while size - at >= HEADER_BYTES:
            length = int.from_bytes(buffer[at:at + 4], "big")
            if length > self.limit:
                self.too_large = FrameTooLarge(length, self.limit)
                self._buffer = b""
                return frames
            end = at + HEADER_BYTES + length
            if end > size:
                break
            frames.append((buffer[at + 4], buffer[at + HEADER_BYTES:end]))
            at = end
        self._buffer = buffer[at:] if at < size else b""
        return frames
