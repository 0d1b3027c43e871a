"""A fake controller (a loopback HTTP server recording what it is posted) and an agent's
Reporter pointed at it, with node snapshots and XID events to report; for the tests of
the reporter, the node labels and the topology it sends."""

from __future__ import annotations

import json
import random
import socket
import threading
from collections import deque
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from sn_monitor.agent.reporter import Reporter
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot
from sn_monitor.agent.spool import EventSpool
from sn_monitor.clock import ManualClock
from sn_monitor.model import Event, Report

TOKEN = "s3cret-token-value"


class _Server(ThreadingHTTPServer):
    """Closing it ends every handler's thread: it cuts the keep-alive connections a client
    left open (a connection requests dropped is closed only by the garbage collector), then
    joins the threads."""

    daemon_threads = False  # server_close() joins them

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        with self._lock:
            for sock in self._open:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        super().server_close()


class Controller:
    """A tiny controller on 127.0.0.1: records each request, answers from a script.

    With an empty script it acknowledges every event it received and sends
    ``self.commands``.
    """

    def __init__(self, port: int = 0) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.script: deque[tuple[int, Any, dict[str, str]]] = deque()
        self.commands: list[dict[str, Any]] = []
        controller = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall per reply

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                controller.requests.append((self.path, dict(self.headers), body))
                status, payload, headers = controller.reply(body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reply(self, body: bytes) -> tuple[int, Any, dict[str, str]]:
        if self.script:
            return self.script.popleft()
        report = msgspec.json.decode(body, type=Report)
        through = max((e.id for e in report.events), default=-1)
        commands, self.commands = self.commands, []
        return 200, {"sequence": report.sequence, "events_stored_through": through,
                     "commands": commands}, {}

    def reports(self) -> list[Report]:
        return [msgspec.json.decode(body, type=Report) for _, _, body in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def snapshot(clock: ManualClock, *events: Event) -> NodeSnapshot:
    gpu = GpuSample(index=0, uuid="GPU-0", name="H100", pci_bus_id="0000:18:00.0",
                    temperature_celsius=70.0, power_limit_watts=700.0)
    return NodeSnapshot("gpu-node-017", clock.time(), gpus=(gpu,), events=events)


def xid(n: int) -> Event:
    return Event("xid", "nvml", 1_700_000_000.0 + n, f"Xid 13 #{n}", gpu=0, code=13)


def make_reporter(url: str | list[str], tmp_path, clock: ManualClock, **kwargs) -> Reporter:
    spool = EventSpool(tmp_path / "spool", clock=clock)
    return Reporter(url, TOKEN, "gpu-node-017", {"supernode": "sn0"}, clock, spool,
                    timeout=2.0, rng=random.Random(0), **kwargs)
