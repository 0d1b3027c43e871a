"""A small HTTP/1.1 server on its own thread, for the agent's and the fleet view's endpoints.

Keep-alive (Prometheus and dashboards keep their connections open), a thread per
connection, idle connections closed after :data:`IDLE_TIMEOUT_SECONDS`, Nagle's algorithm
off (a reply is two writes, headers then body: with Nagle the body's last segment waits
for the client's delayed ACK, 40 ms on a kept-alive connection), request lines logged at
debug level only. Each server subclasses :class:`QuietHandler` with its routes.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

log = logging.getLogger(__name__)

IDLE_TIMEOUT_SECONDS: Final = 300.0


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; :meth:`answer` writes one whole reply."""

    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_SECONDS
    disable_nagle_algorithm = True

    def answer(self, code: int, media: str, data: bytes,
               headers: list[tuple[str, str]] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers or ():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class ThreadedServer:
    """``handler`` served on ``host:port`` from a daemon thread named ``name``."""

    def __init__(self, host: str, port: int, handler: type[QuietHandler], name: str) -> None:
        self._server = _Server((host, port), handler)
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name=self._name,
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
