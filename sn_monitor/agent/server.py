"""The agent's HTTP endpoint: /metrics for Prometheus, /healthz for supervisors.

HTTP/1.1 with keep-alive (Prometheus keeps its scrape connections open: a connection a
scrape is a handshake and a thread each time; see :mod:`sn_monitor.serving`), and the
/metrics body gzipped when the scraper accepts it (from :class:`ExpositionCache`, once
per snapshot).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sn_monitor.agent.exposition import CONTENT_TYPE, ExpositionCache
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.clock import Clock
from sn_monitor.serving import QuietHandler, ThreadedServer

PostHandler = Callable[[bytes], tuple[int, dict[str, Any]]]
MAX_POST_BYTES = 64 * 1024


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value accepts gzip (RFC 9110, 12.5.3).

    An explicit ``gzip`` entry decides over ``*``; a quality of 0 (or one that is not a
    number) refuses.
    """
    qualities: dict[str, float] = {}
    for part in (header or "").split(","):
        coding, _, params = part.strip().partition(";")
        quality = 1.0
        params = params.strip().lower()
        if params.startswith("q="):
            try:
                quality = float(params[2:])
            except ValueError:
                quality = 0.0
        qualities.setdefault(coding.strip().lower(), quality)
    return qualities.get("gzip", qualities.get("*", 0.0)) > 0


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
        self._posts: dict[str, PostHandler] = {}
        self._server = ThreadedServer(host, port, self._handler_class(), "agent-http")

    def add_post_route(self, path: str, handler: PostHandler) -> None:
        """Serve ``POST path`` with ``handler(body) -> (status, json document)``."""
        self._posts[path] = handler

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        return self._server.port

    def _handler_class(self) -> type[QuietHandler]:
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    gzipped = accepts_gzip(self.headers.get("Accept-Encoding"))
                    data = server._exposition.body(want_gzip=gzipped)
                    extra = [("Content-Encoding", "gzip")] if gzipped else []
                    self.answer(200, CONTENT_TYPE, data, [*extra, ("Vary", "Accept-Encoding")])
                elif path == "/healthz":
                    code, body = health(server._latest(), server._clock.time(), server._max_age)
                    self.answer(code, "application/json", json.dumps(body).encode())
                elif path == "/":
                    self.answer(200, "text/plain", b"sn-monitor agent: /metrics /healthz\n")
                else:
                    self.answer(404, "text/plain", b"not found\n")

            def do_POST(self) -> None:
                handler = server._posts.get(self.path.split("?", 1)[0])
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if handler is None:
                    self.close_connection = True
                    self.answer(404, "text/plain", b"not found\n")
                    return
                if length < 0 or length > MAX_POST_BYTES:
                    self.close_connection = True  # the body is left unread
                    code, doc = (413, {"error": "body too large"}) if length > 0 else (
                        400, {"error": "Content-Length: not a length"})
                else:
                    code, doc = handler(self.rfile.read(length))
                self.answer(code, "application/json", json.dumps(doc).encode())

        return Handler

    def start(self) -> None:
        """Serve in a background thread."""
        self._server.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._server.stop()
