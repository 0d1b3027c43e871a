"""The agent's HTTP endpoint: /metrics for Prometheus, /healthz for supervisors."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sn_monitor.agent.exposition import CONTENT_TYPE, ExpositionCache
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.clock import Clock

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
Environ = dict[str, Any]
PostHandler = Callable[[bytes], tuple[int, dict[str, Any]]]
MAX_POST_BYTES = 64 * 1024


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    """Scrapes every few seconds are not worth a log line each."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


def health(snapshot: NodeSnapshot | None, now: float, max_age: float) -> tuple[int, dict[str, Any]]:
    """Healthy while the sampling loop keeps producing fresh snapshots."""
    if snapshot is None:
        return 503, {"status": "starting"}
    age = now - snapshot.timestamp_seconds
    failing = sorted(c.name for c in snapshot.collectors if not c.success)
    body = {
        "status": "ok" if age <= max_age else "stale",
        "node": snapshot.node,
        "last_sample_age_seconds": round(age, 3),
        "collectors_failing": failing,
    }
    return (200 if age <= max_age else 503), body


class AgentHttpServer:
    """Serves /metrics from the exposition cache and /healthz from the latest snapshot."""

    def __init__(
        self,
        host: str,
        port: int,
        exposition: ExpositionCache,
        latest: Callable[[], NodeSnapshot | None],
        clock: Clock,
        max_age: float,
    ) -> None:
        self._exposition = exposition
        self._latest = latest
        self._clock = clock
        self._max_age = max_age
        self._server = make_server(host, port, self._app, _ThreadingServer,
                                   handler_class=_QuietHandler)
        self._thread: threading.Thread | None = None
        self._posts: dict[str, PostHandler] = {}

    def add_post_route(self, path: str, handler: PostHandler) -> None:
        """Serve ``POST path`` with ``handler(body) -> (status, json document)``."""
        self._posts[path] = handler

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        return int(self._server.server_address[1])

    def _app(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            gzipped = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
            data = self._exposition.body(want_gzip=gzipped)
            headers = [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(data)))]
            if gzipped:
                headers.append(("Content-Encoding", "gzip"))
            start_response("200 OK", headers)
            return [data]
        if path == "/healthz":
            code, body = health(self._latest(), self._clock.time(), self._max_age)
            data = json.dumps(body).encode()
            status = "200 OK" if code == 200 else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json"),
                                    ("Content-Length", str(len(data)))])
            return [data]
        if path in self._posts and environ.get("REQUEST_METHOD") == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            if length > MAX_POST_BYTES:
                code, doc = 413, {"error": "body too large"}
            else:
                code, doc = self._posts[path](environ["wsgi.input"].read(length))
            data = json.dumps(doc).encode()
            start_response(f"{code} {'OK' if code < 400 else 'Error'}",
                           [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data)))])
            return [data]
        if path == "/":
            data = b"sn-monitor agent: /metrics /healthz\n"
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [data]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="agent-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
