"""``sn-monitor fleet``: the fleet view's HTTP API and its own metrics.

- ``GET /api/v1/nodes``: every node of every supernode, each with ``supernode``;
  ``partial`` and ``supernodes`` say who answered (200 even when some did not).
- ``GET /api/v1/incidents[?status=open]``: the same for incidents.
- ``GET /api/v1/supernodes``: each supernode's controller and whether it answered.
- ``GET /metrics``: ``sn_fleet_supernode_up``, ``sn_fleet_nodes{supernode,state}``,
  ``sn_fleet_request_seconds{supernode}``; ``GET /healthz``.

Asking is read-only; when ``token_file`` is set every API request must carry that
bearer token (the controllers' own tokens never leave this process).
"""

from __future__ import annotations

import hmac
import json
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from sn_monitor.fleet.view import FleetView, node_states
from sn_monitor.serving import QuietHandler, ThreadedServer


class FleetMetrics:
    """The fleet view's metrics, from the latest node answer (asked at scrape time)."""

    def __init__(self, view: FleetView) -> None:
        self._view = view

    def collect(self) -> list[Metric]:
        answer = self._view.nodes()
        up = GaugeMetricFamily("sn_fleet_supernode_up",
                               "1 when a controller of the supernode answered.",
                               labels=["supernode"])
        took = GaugeMetricFamily("sn_fleet_request_seconds",
                                 "How long the supernode took to answer the last question.",
                                 labels=["supernode"])
        nodes = GaugeMetricFamily("sn_fleet_nodes", "Nodes per supernode and state.",
                                  labels=["supernode", "state"])
        for s in answer.supernodes:
            up.add_metric([s.name], 1.0 if s.up else 0.0)
            took.add_metric([s.name], s.seconds)
        for (supernode, state), count in sorted(node_states(answer).items()):
            nodes.add_metric([supernode, state], float(count))
        return [up, took, nodes]


class FleetServer:
    """Serves the view on ``host:port`` from a background thread."""

    def __init__(self, view: FleetView, host: str, port: int, token: str | None) -> None:
        self._view = view
        self._token = token
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(FleetMetrics(view))
        self._server = ThreadedServer(host, port, self._handler_class(), "fleet-http")

    @property
    def port(self) -> int:
        return self._server.port

    def _handler_class(self) -> type[QuietHandler]:
        outer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                if parts.path == "/healthz":
                    self._json(200, {"status": "ok"})
                elif parts.path == "/metrics":
                    self.answer(200, "text/plain; version=0.0.4; charset=utf-8",
                                 generate_latest(outer._registry))
                elif not parts.path.startswith("/api/v1/"):
                    self._json(404, {"error": "Not Found"})
                elif not outer._allowed(self.headers.get("Authorization")):
                    self._json(401, {"error": "a bearer token is required"})
                elif parts.path == "/api/v1/nodes":
                    self._json(200, outer._view.nodes().document("nodes"))
                elif parts.path == "/api/v1/incidents":
                    given = query.get("status")
                    status = given[-1] if given else None
                    if status not in (None, "open", "resolved"):
                        self._json(400, {"error": "status: open or resolved"})
                        return
                    self._json(200, outer._view.incidents(status).document("incidents"))
                elif parts.path == "/api/v1/supernodes":
                    answer = outer._view.nodes()
                    self._json(200, {"supernodes": [s.status() for s in answer.supernodes],
                                     "partial": answer.partial})
                else:
                    self._json(404, {"error": "Not Found"})

            def _json(self, code: int, doc: object) -> None:
                self.answer(code, "application/json", json.dumps(doc).encode())

        return Handler

    def _allowed(self, authorization: str | None) -> bool:
        if self._token is None:
            return True
        scheme, _, given = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), self._token)

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()
