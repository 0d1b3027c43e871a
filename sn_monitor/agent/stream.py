"""The agent's end of the reports' stream (:mod:`sn_monitor.report_stream`).

A :class:`ReportStream` is one connection to one controller, opened with the upgrade
request and then written frame by frame. The reporter reads answers in two ways: what
has arrived by now, without waiting (:meth:`ReportStream.poll`, before each report), and
up to the answer to the report that asked (:meth:`ReportStream.wait`). A plain socket
(TLS from :mod:`ssl` over ``https://``): one connection for the life of the stream, its
answers a few hundred bytes.
"""

from __future__ import annotations

import socket
import ssl
import time
from urllib.parse import urlsplit

import msgspec

from sn_monitor import __version__
from sn_monitor.report_stream import ACK, UPGRADE, FrameReader, frame, opening
from sn_monitor.transport import error_text, is_standby, parse_retry_after

#: The most an opening's answer (head and body) may take, and an answer frame.
_MAX_HEAD = 64 * 1024
_MAX_ANSWER = 16 * 1024 * 1024


class StreamAnswer(msgspec.Struct, frozen=True):
    """:class:`~sn_monitor.model.StreamReply`, its reply left raw.

    The reporter decodes the reply leniently, a command at a time.
    """

    status: int = 200
    accepted: int = 0
    node: str = ""
    sequence: int = -1
    reply: msgspec.Raw = msgspec.Raw(b"")  # absent: empty
    error: str = ""
    retry_after: float | None = None


class StreamRefused(Exception):
    """The controller answered the opening with an HTTP answer, not 101."""

    def __init__(self, status: int, headers: dict[str, str], text: str) -> None:
        super().__init__(f"{status}: {text}")
        self.status = status
        self.text = text
        self.standby = is_standby(status, headers)
        self.retry_after = parse_retry_after(headers.get("retry-after"))


class StreamClosed(ConnectionError):
    """The controller closed the stream (it stopped, restarted, or found it idle)."""


def tls_context(verify: bool | str, cert: tuple[str, str] | None) -> ssl.SSLContext:
    """The client context for ``https://``, built for each stream (renewed files are read).

    ``verify``: a CA file, True (the system's CAs) or False (no check); ``cert``: the
    agent's certificate and key.
    """
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


class ReportStream:
    """One open stream to the controller at ``url``."""

    def __init__(self, url: str, sock: socket.socket, rest: bytes = b"") -> None:
        self.url = url
        self._sock = sock
        self._reader = FrameReader(_MAX_ANSWER)
        self._answers = self._decode(rest)

    @classmethod
    def open(cls, url: str, token: str | None, timeout: float,
             tls: ssl.SSLContext | None) -> ReportStream:
        """Connect and upgrade; OSError (ssl.SSLError among them), StreamRefused."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        deadline = time.monotonic() + timeout
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
            sock.sendall(opening(parts.path, host, port, f"sn-monitor-agent/{__version__}",
                                 token))
            data = b""
            while b"\r\n\r\n" not in data:
                data += _recv(sock, deadline, len(data))
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            fields = lines[0].split(" ", 2)
            status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
            headers = {name.strip().lower(): value.strip()
                       for name, _, value in (line.partition(":") for line in lines[1:])}
            if status == 101 and headers.get("upgrade", "").lower() == UPGRADE:
                return cls(url, sock, rest)
            length = _whole(headers.get("content-length", "0"))
            while len(rest) < min(length, _MAX_HEAD):
                try:
                    rest += _recv(sock, deadline, len(rest))
                except StreamClosed:
                    break
            sock.close()
            raise StreamRefused(status, headers, error_text(rest[:length]))
        except BaseException:
            sock.close()
            raise

    def send(self, body: bytes, timeout: float, *, ask: bool) -> None:
        """Write one report; OSError when the stream is broken."""
        self._sock.settimeout(timeout)
        self._sock.sendall(frame(body, ACK if ask else 0))

    def poll(self) -> list[StreamAnswer]:
        """The answers that have arrived, without waiting; StreamClosed, OSError."""
        answers, self._answers = self._answers, []
        self._sock.setblocking(False)
        try:
            while True:
                try:
                    data = self._sock.recv(65536)
                except (BlockingIOError, ssl.SSLWantReadError):
                    return answers
                if not data:
                    raise StreamClosed("the controller closed the stream")
                answers += self._decode(data)
        finally:
            self._sock.setblocking(True)

    def wait(self, sequence: int, timeout: float) -> list[StreamAnswer]:
        """The answers up to the one to report ``sequence``; TimeoutError, StreamClosed."""
        deadline = time.monotonic() + timeout
        answers = self.poll()
        while not any(a.sequence == sequence for a in answers):
            answers += self._decode(_recv(self._sock, deadline, 0))
        return answers

    def close(self) -> None:
        self._sock.close()

    def _decode(self, data: bytes) -> list[StreamAnswer]:
        answers = []
        for _, payload in self._reader.feed(data):
            try:
                answers.append(msgspec.json.decode(payload, type=StreamAnswer))
            except msgspec.DecodeError as err:
                raise ConnectionError(f"the controller's answer is not one: {err}") from None
        if self._reader.too_large is not None:
            raise ConnectionError(f"the controller's answer: {self._reader.too_large}")
        return answers


def _recv(sock: socket.socket, deadline: float, have: int) -> bytes:
    """One read before ``deadline``; TimeoutError past it, StreamClosed at the end."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no answer in time")
    if have >= _MAX_HEAD:
        raise ConnectionError("the controller's answer to the opening is too long")
    sock.settimeout(left)
    data = sock.recv(65536)
    if not data:
        raise StreamClosed("the controller closed the connection")
    return data


def _whole(text: str) -> int:
    return int(text) if text.isascii() and text.isdigit() else 0
