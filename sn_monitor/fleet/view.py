"""The fleet view: every supernode's controller asked at once, the answers merged.

A controller is the unit of scale (one per supernode, thousands of nodes each); across
supernodes nothing is shared but this view, which holds no state of its own: like
Thanos Query over several Prometheus servers, it asks each controller's API, tags what
comes back with the supernode, and says which supernodes did not answer (a partial
view is served, never a failed one: one supernode down must not blind the others).
An HA pair is one supernode: its controllers are tried in order, a standby (503 with
``X-SN-Controller-Role: standby``) or an unreachable one passes to the next.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from sn_monitor.clock import Clock
from sn_monitor.fleet.settings import FleetSettings, SupernodeSettings
from sn_monitor.transport import describe_failure, is_standby, read_token, redact_url

log = logging.getLogger(__name__)


class SupernodeUnreachable(Exception):
    """No controller of a supernode answered (each one's reason, joined)."""


@dataclass(frozen=True)
class SupernodeAnswer:
    """What one supernode said for one question, or why it said nothing."""

    name: str
    items: tuple[dict[str, Any], ...] = ()
    controller: str | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def up(self) -> bool:
        return self.error is None

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "up": self.up, "controller": self.controller,
                "error": self.error, "items": len(self.items),
                "seconds": round(self.seconds, 4)}


@dataclass(frozen=True)
class FleetAnswer:
    """The merged items (each with its ``supernode``) and every supernode's status."""

    items: tuple[dict[str, Any], ...]
    supernodes: tuple[SupernodeAnswer, ...]
    at: float

    @property
    def partial(self) -> bool:
        return any(not s.up for s in self.supernodes)

    def document(self, key: str) -> dict[str, Any]:
        return {key: list(self.items), "partial": self.partial,
                "supernodes": [s.status() for s in self.supernodes]}


Fetch = Callable[[SupernodeSettings, str, Mapping[str, str]], tuple[str, Any]]


class Controllers:
    """How the view asks one supernode: HTTP GET to its controllers in order."""

    def __init__(self, timeout: float, tokens: Mapping[str, str | None]) -> None:
        self._timeout = timeout
        self._tokens = dict(tokens)
        self._local = threading.local()  # a keep-alive session per asking thread
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            with self._lock:
                self._sessions.append(session)
        return session

    def get(self, supernode: SupernodeSettings, path: str,
            params: Mapping[str, str]) -> tuple[str, Any]:
        """(the controller that answered, its JSON); SupernodeUnreachable when none did."""
        headers = {"Accept": "application/json"}
        token = self._tokens.get(supernode.name)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        reasons: list[str] = []
        for url in supernode.controllers:
            shown = redact_url(url)
            try:
                reply = self._session().get(
                    url.rstrip("/") + path, params=dict(params), headers=headers,
                    timeout=self._timeout, verify=supernode.ca_file or True,
                    allow_redirects=False)
            except requests.RequestException as err:
                reasons.append(f"{shown}: unreachable ({describe_failure(err)})")
                continue
            if is_standby(reply.status_code, reply.headers):
                reasons.append(f"{shown}: standby")
                continue
            if reply.status_code != 200:
                reasons.append(f"{shown}: answered {reply.status_code}")
                continue
            try:
                return shown, reply.json()
            except ValueError:
                reasons.append(f"{shown}: the answer is not JSON")
        raise SupernodeUnreachable("; ".join(reasons))

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()


class FleetView:
    """Nodes and incidents of every supernode, asked in parallel, cached ``cache`` s."""

    def __init__(self, settings: FleetSettings, clock: Clock,
                 fetch: Fetch | None = None) -> None:
        self.settings = settings
        self._clock = clock
        # read now: a token file that cannot be read stops the start (TokenError)
        self._controllers = Controllers(float(settings.timeout), {
            s.name: read_token(s.token_file) if s.token_file else None
            for s in settings.supernodes})
        self._fetch: Fetch = fetch or self._controllers.get
        self._pool = ThreadPoolExecutor(max_workers=min(32, len(settings.supernodes)),
                                        thread_name_prefix="fleet")
        self._lock = threading.Lock()
        self._cached: dict[tuple[str, tuple[tuple[str, str], ...]], FleetAnswer] = {}

    def nodes(self) -> FleetAnswer:
        return self._ask("/api/v1/nodes", "nodes", {})

    def incidents(self, status: str | None) -> FleetAnswer:
        return self._ask("/api/v1/incidents", "incidents",
                         {"status": status} if status else {})

    def _ask(self, path: str, key: str, params: Mapping[str, str]) -> FleetAnswer:
        cache_key = (path, tuple(sorted(params.items())))
        with self._lock:
            cached = self._cached.get(cache_key)
            if cached is not None and \
                    self._clock.monotonic() - cached.at < float(self.settings.cache):
                return cached
        answers = tuple(self._pool.map(
            lambda s: self._one(s, path, key, params), self.settings.supernodes))
        merged = tuple(item for answer in answers for item in answer.items)
        result = FleetAnswer(merged, answers, self._clock.monotonic())
        with self._lock:
            self._cached[cache_key] = result
        return result

    def _one(self, supernode: SupernodeSettings, path: str, key: str,
             params: Mapping[str, str]) -> SupernodeAnswer:
        started = self._clock.monotonic()
        try:
            controller, doc = self._fetch(supernode, path, params)
        except SupernodeUnreachable as err:
            log.warning("supernode %s: %s", supernode.name, err)
            return SupernodeAnswer(supernode.name, error=str(err),
                                   seconds=self._clock.monotonic() - started)
        items = doc.get(key) if isinstance(doc, dict) else None
        if not isinstance(items, list):
            return SupernodeAnswer(supernode.name, controller=controller,
                                   error=f"{controller}: no {key!r} list in the answer",
                                   seconds=self._clock.monotonic() - started)
        tagged = tuple({**item, "supernode": supernode.name} for item in items
                       if isinstance(item, dict))
        return SupernodeAnswer(supernode.name, tagged, controller,
                               seconds=self._clock.monotonic() - started)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._controllers.close()


def node_states(answer: FleetAnswer) -> dict[tuple[str, str], int]:
    """(supernode, state) -> nodes, for ``sn_fleet_nodes``."""
    counts: dict[tuple[str, str], int] = {}
    for node in answer.items:
        key = (str(node["supernode"]), str(node.get("state", "unknown")))
        counts[key] = counts.get(key, 0) + 1
    return counts


__all__: Sequence[str] = ("Controllers", "FleetAnswer", "FleetView", "SupernodeAnswer",
                          "SupernodeUnreachable", "node_states")
