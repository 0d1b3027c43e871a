"""A fake controller for the job client and the example job: a loopback HTTP server
that answers the job routes with the replies a test sets and records every request, so
a test can say what the client sent without a real controller."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JOB = "llm-7b"


PREFIX = f"/api/v1/jobs/{JOB}"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeController:
    """The controller's job API, recording every request. Also used by the integration test.

    ``progress_reply`` is a reply dict or a function of the request body; ``restore`` is
    (status, body) for GET restore-point (a ``bytes`` body is sent as is); ``fail_status``
    answers every request with that status; ``token`` makes a bearer token mandatory.
    """

    progress_reply: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] = field(
        default_factory=lambda: {"checkpoint_requested": False, "checkpoint_id": None,
                                 "restore": None})
    restore: tuple[int, Any] = (404, {"error": "no restore point"})
    checkpoint_status: int = 200
    fail_status: int | None = None
    token: str | None = None
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        #: Every connection a client opened: a kept-alive one holds its handler's
        #: thread until one side closes it, so :meth:`stop` closes them.
        self._connections: list[socket.socket] = []
        controller = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with controller._lock:
                    controller._connections.append(self.connection)

            def do_GET(self) -> None:
                controller._handle(self, "GET")

            def do_POST(self) -> None:
                controller._handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            with contextlib.suppress(OSError):  # the handler closed it already
                connection.shutdown(socket.SHUT_RDWR)

    def recorded(self, suffix: str, method: str = "POST") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    def progress_bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.recorded("/progress")]

    def checkpoint_bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.recorded("/checkpoints")]

    def latest_step(self) -> int | None:
        """The last step of the last progress POST."""
        bodies = self.progress_bodies()
        return bodies[-1]["updates"][-1]["step"] if bodies else None

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        if len(raw) < length:
            return  # the client died mid-body (a crash the test makes): no request at all
        body = json.loads(raw) if raw else None
        with self._lock:
            self.requests.append(Recorded(method, h.path, dict(h.headers.items()), body))
        if self.fail_status is not None:
            return self._reply(h, self.fail_status, {"error": "down"})
        if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
            return self._reply(h, 401, {"error": "bad token"})
        if method == "POST" and h.path == PREFIX + "/progress":
            reply = self.progress_reply
            return self._reply(h, 200, reply(body) if callable(reply) else reply)
        if method == "POST" and h.path == PREFIX + "/checkpoints":
            return self._reply(h, self.checkpoint_status, {"stored": True})
        if method == "GET" and h.path == PREFIX + "/restore-point":
            return self._reply(h, *self.restore)
        return self._reply(h, 404, {"error": "not found"})

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
