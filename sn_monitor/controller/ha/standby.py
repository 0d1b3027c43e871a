"""What a standby controller serves while the other one is active.

It answers every API call 503 with ``Retry-After`` and ``X-SN-Controller-Role:
standby`` (an agent given both controllers moves to the other at once; a load balancer
probing ``/readyz`` sends it nothing, and on Kubernetes the Service selects the active's
pod label: ha/k8s_role.py), ``/livez`` 200 (the process is fine: do not restart it), and
``/metrics`` with ``sn_controller_leader 0``.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import msgspec
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from sn_monitor import __version__
from sn_monitor.transport import ROLE_HEADER

RETRY_AFTER_SECONDS: Final = 1

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class StandbyStatus:
    """What a standby knows: itself, and who was active at its last look (thread-safe)."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self._active: str | None = None
        self._lock = threading.Lock()

    def saw(self, active: str | None) -> None:
        """The lease's holder at the last attempt to take it."""
        with self._lock:
            self._active = active

    def doc(self) -> dict[str, Any]:
        with self._lock:
            active = self._active
        return {"status": "standby", "role": "standby", "identity": self.identity,
                "active": active}


class StandbyApp:
    """A bare ASGI app: no routing table, nothing that could act."""

    def __init__(self, status: StandbyStatus) -> None:
        self.status = status
        self._registry = CollectorRegistry(auto_describe=False)
        Gauge("sn_controller_leader", "1 on the active controller, 0 on a standby.",
              registry=self._registry).set(0)
        info = Gauge("sn_controller_info", "The controller's version.", ["version"],
                     registry=self._registry)
        info.labels(__version__).set(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        if path == "/metrics":
            await _answer(send, 200, generate_latest(self._registry),
                          "text/plain; version=0.0.4; charset=utf-8")
            return
        doc = self.status.doc()
        if path == "/livez":
            await _answer(send, 200, msgspec.json.encode(doc))
            return
        if path not in ("/healthz", "/readyz"):
            doc = {"error": "standby: this controller is not the active one",
                   "active": doc["active"]}
        await _answer(send, 503, msgspec.json.encode(doc), extra=[
            (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
            (ROLE_HEADER.lower().encode(), b"standby")])


async def _answer(send: Send, status: int, body: bytes,
                  content_type: str = "application/json",
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type.encode()),
               (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
