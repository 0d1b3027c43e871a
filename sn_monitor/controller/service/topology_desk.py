"""The topology's answers: built once per update, off the event loop, shared by all viewers.

``GET /api/v1/topology`` (the whole document, :mod:`~sn_monitor.controller.fabric.view`)
and ``GET /api/v1/topology/overview`` (a row per node,
:mod:`~sn_monitor.controller.fabric.overview`) are read by every open page every few
seconds; at 8,192 nodes the document takes seconds to build and is ~100 MB. The desk
keeps, per job filter (and, for the document, per scope: a supernode or a rack), the
latest of each, encoded (an :class:`Edition`), and answers
every request from it. What holds:

- **One build for all.** A kind's answer for one filter is built at most once per
  ``period_seconds``, and never sooner than ``1 / busy_share`` times its last build's CPU
  time (``cpu_clock``: the building thread's) after that build began, so that however
  many pages poll, its builds take at most ``busy_share`` of a core. What is shown
  includes live rates that every report moves, so the period, not a change, is the
  trigger; a build that finds the same content keeps its version.
- **No request waits for a slow rebuild.** The first request for an answer builds it
  (in the thread pool: the API calls the desk off the event loop) while the others wait
  for that build. Once there is an answer, a request that finds it due builds it again
  and waits only where its last build took under ``wait_under`` CPU seconds (a small
  fleet: every answer is fresh). A slower one (8,192 nodes: a second or more) is started
  (``refresh``: a thread of its own by default) and the request is answered what there
  is: a page's poll must not wait for it.
- **A part costs its part.** A document of one supernode or rack reads the rates of its
  own nodes only (``scoped``), the others' link rates for the rails' best.
- **The overview judges what changed.** It is built from what the health rules read of
  each node (``health``: no rates, :meth:`~.meter.FabricMeter.health`), and each node's
  row is kept between builds and judged again only when its inputs changed
  (:class:`~sn_monitor.controller.fabric.overview_rows.OverviewRows`, shared by every
  job filter): at 8,192 nodes a build costs what changed, not the fleet.
- **Versions move only with what is shown.** The overview's version is a number that
  grows by one when its rows, counts or rails change; the first is the desk's start time
  in milliseconds, so a version from before a restart is never taken for a later one (a
  page that sends it gets the whole). The whole document's entity tag is a digest of it
  (its time left out). A request whose ``If-None-Match`` names it is answered 304.
- **``since``.** The rows of the last ``history`` versions are kept (per filter): a page
  that holds one of them gets the rows that changed since, and the names of the nodes
  gone (``"full": false``); one that holds an older version gets the whole
  (``"full": true``).
- **Compressed once.** An edition's gzip is made on the first request that accepts it,
  and kept with it.
- **Bounded.** At most ``MAX_FILTERS`` filters (job, scope) are kept per kind, the least
  recently asked dropped first.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.controller.fabric.overview import FleetOverview, changed_rows
from sn_monitor.controller.fabric.overview_rows import OverviewRows
from sn_monitor.controller.fabric.view import FabricScope, FleetFabric, fleet_topology

log = logging.getLogger(__name__)

#: The least time between two builds of one answer, seconds.
DEFAULT_PERIOD_SECONDS = 1.0
#: The most of a core one answer's builds may take (the period grows with the build).
DEFAULT_BUSY_SHARE = 0.08
#: A due rebuild is waited for only where the last build took less CPU than this.
DEFAULT_WAIT_UNDER_SECONDS = 0.05
#: The versions of the overview kept to answer ``since``, per job filter.
DEFAULT_HISTORY = 8
#: The job filters kept per kind of answer.
MAX_FILTERS = 16
#: gzip's level: JSON this repetitive shrinks 20 to 50 times even at a fast level.
GZIP_LEVEL = 4

_encoder = msgspec.json.Encoder()


class Edition:
    """An answer encoded once: its body and entity tag, and its gzip, made on first ask."""

    __slots__ = ("_gzip_lock", "_gzipped", "body", "etag")

    def __init__(self, etag: str, body: bytes) -> None:
        self.etag = etag
        self.body = body
        self._gzipped: bytes | None = None
        self._gzip_lock = threading.Lock()

    def gzipped(self) -> bytes:
        """The body compressed with gzip, made once (a few hundred ms at 100 MB)."""
        with self._gzip_lock:
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=GZIP_LEVEL, mtime=0)
            return self._gzipped


@dataclass(slots=True)
class _Shelf:
    """One kind of answer for one job filter: when it was last built, and how long it took."""

    #: Held while the shelf's fields are read or changed (briefly: never during a build).
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Held by the build under way: one at a time per shelf.
    building: threading.Lock = field(default_factory=threading.Lock)
    built_at: float = -math.inf
    #: The CPU seconds of its last build.
    took: float = 0.0


@dataclass(slots=True)
class _DocumentShelf(_Shelf):
    edition: Edition | None = None


@dataclass(slots=True)
class _OverviewShelf(_Shelf):
    latest: FleetOverview | None = None
    version: int = 0
    #: version -> its rows, oldest first.
    history: OrderedDict[int, Mapping[str, bytes]] = field(default_factory=OrderedDict)
    whole: Edition | None = None
    #: since -> the answer to a page that holds it, at ``version``.
    updates: dict[int, Edition] = field(default_factory=dict)


_S = TypeVar("_S", bound=_Shelf)
_K = TypeVar("_K")
#: A document's filter: the job it highlights, the part of the fleet it shows.
_DocumentKey = tuple[str | None, FabricScope | None]


class TopologyDesk:
    """The topology's answers, cached and shared (module docstring)."""

    def __init__(self, fabric: Callable[[], FleetFabric], clock: Clock, *,
                 health: Callable[[], FleetFabric] | None = None,
                 scoped: Callable[[FabricScope], FleetFabric] | None = None,
                 period_seconds: float = DEFAULT_PERIOD_SECONDS,
                 busy_share: float = DEFAULT_BUSY_SHARE,
                 history: int = DEFAULT_HISTORY,
                 cpu_clock: Callable[[], float] = time.thread_time,
                 refresh: Callable[[Callable[[], None]], None] | None = None,
                 wait_under: float = DEFAULT_WAIT_UNDER_SECONDS) -> None:
        self._fabric = fabric
        self._health = health or fabric
        self._scoped = scoped or (lambda _: fabric())
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._period = period_seconds
        self._busy_share = busy_share
        self._history = history
        self._refresh = refresh or _in_a_thread
        self._wait_under = wait_under
        self._versions = itertools.count(int(clock.time() * 1000))
        self._shelves_lock = threading.Lock()
        self._documents: OrderedDict[_DocumentKey, _DocumentShelf] = OrderedDict()
        self._overviews: OrderedDict[str | None, _OverviewShelf] = OrderedDict()
        #: Each node's overview row, kept between builds (every job filter shares them).
        self.rows = OverviewRows()
        #: How many answers were built (documents and overviews), for tests and benches.
        self.builds = 0

    def document(self, job: str | None = None, scope: FabricScope | None = None) -> Edition:
        """The topology document (``job``: the job the page highlights) of ``scope``'s nodes."""
        shelf = self._shelf(self._documents, (job, scope), _DocumentShelf)
        self._current(shelf, lambda: shelf.edition is not None,
                      lambda: self._build_document(shelf, job, scope))
        with shelf.lock:
            assert shelf.edition is not None
            return shelf.edition

    def overview(self, job: str | None = None, since: int | None = None) -> Edition:
        """The overview (of ``job``'s nodes), whole or what changed ``since`` a version."""
        shelf = self._shelf(self._overviews, job, _OverviewShelf)
        self._current(shelf, lambda: shelf.whole is not None,
                      lambda: self._build_overview(shelf, job))
        with shelf.lock:
            return self._overview_answer(shelf, job, since)

    def settle(self, timeout: float) -> bool:
        """Wait until no build is under way (benches, tests); False after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._shelves_lock:
            shelves: list[_Shelf] = [*self._documents.values(), *self._overviews.values()]
        for shelf in shelves:
            if not shelf.building.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
            shelf.building.release()
        return True

    # ------------------------------------------------------------------ building

    def _shelf(self, shelves: OrderedDict[_K, _S], key: _K, make: Callable[[], _S]) -> _S:
        with self._shelves_lock:
            shelf = shelves.get(key)
            if shelf is None:
                shelf = shelves[key] = make()
                while len(shelves) > MAX_FILTERS:
                    shelves.popitem(last=False)
            shelves.move_to_end(key)
            return shelf

    def _current(self, shelf: _Shelf, answered: Callable[[], bool],
                 build: Callable[[], None]) -> None:
        """Make sure ``shelf`` has an answer; build the next when one is due.

        With no answer yet, or a quick last build, wait for the build (this thread's, or
        the one under way). Else never wait: a due build is handed to ``refresh``,
        unless one is under way already.
        """
        with shelf.lock:
            ready = answered()
            if ready and not self._due(shelf):
                return
            quick = shelf.took < self._wait_under
        if not ready or quick:
            with shelf.building:
                with shelf.lock:
                    if answered() and not self._due(shelf):
                        return  # built meanwhile by the request this one waited for
                self._timed(shelf, build)
            return
        if shelf.building.acquire(blocking=False):
            def run() -> None:
                try:
                    self._timed(shelf, build)
                except Exception:  # the answer there is stays; the next request tries again
                    log.exception("the topology's answer could not be built again")
                finally:
                    shelf.building.release()
            try:
                self._refresh(run)
            except BaseException:
                shelf.building.release()
                raise

    def _due(self, shelf: _Shelf) -> bool:
        wait = max(self._period, shelf.took / self._busy_share)
        return self._clock.monotonic() - shelf.built_at >= wait

    def _timed(self, shelf: _Shelf, build: Callable[[], None]) -> None:
        started, cpu = self._clock.monotonic(), self._cpu_clock()
        build()
        took = self._cpu_clock() - cpu
        with self._shelves_lock:  # two kinds or filters may be built at once
            self.builds += 1
        with shelf.lock:
            shelf.built_at = started
            shelf.took = took

    def _build_document(self, shelf: _DocumentShelf, job: str | None,
                        scope: FabricScope | None) -> None:
        doc = fleet_topology(self._fabric() if scope is None else self._scoped(scope), job, scope)
        digest = hashlib.blake2b(_encoder.encode({k: v for k, v in doc.items() if k != "time"}),
                                 digest_size=12).hexdigest()
        etag = _etag(digest, job)
        with shelf.lock:
            if shelf.edition is not None and shelf.edition.etag == etag:
                return
        edition = Edition(etag, _encoder.encode(doc))
        with shelf.lock:
            shelf.edition = edition

    def _build_overview(self, shelf: _OverviewShelf, job: str | None) -> None:
        overview = self.rows.overview(self._health(), job)
        with shelf.lock:
            self._shelve(shelf, job, overview)

    def _shelve(self, shelf: _OverviewShelf, job: str | None, overview: FleetOverview) -> None:
        """``overview`` as ``shelf``'s latest, under a new version if it shows anything new."""
        if overview.same_as(shelf.latest):
            return
        shelf.latest = overview
        shelf.version = next(self._versions)
        shelf.history[shelf.version] = overview.rows
        while len(shelf.history) > self._history:
            shelf.history.popitem(last=False)
        shelf.whole = Edition(_etag(str(shelf.version), job),
                              _overview_body(shelf.version, job, overview, None, overview.rows))
        shelf.updates = {}

    def _overview_answer(self, shelf: _OverviewShelf, job: str | None,
                         since: int | None) -> Edition:
        assert shelf.whole is not None
        assert shelf.latest is not None
        if since is None or since not in shelf.history:
            return shelf.whole
        update = shelf.updates.get(since)
        if update is None:
            changed, removed = changed_rows(shelf.history[since], shelf.latest.rows)
            update = shelf.updates[since] = Edition(
                shelf.whole.etag, _overview_body(shelf.version, job, shelf.latest, since,
                                                 changed, removed))
        return update


def _in_a_thread(build: Callable[[], None]) -> None:
    """Run ``build`` on a thread of its own (a rebuild no request waits for)."""
    threading.Thread(target=build, name="topology-build", daemon=True).start()


def _etag(version: str, job: str | None) -> str:
    """A strong entity tag: the version, and a digest of the job filter when there is one."""
    if job is None:
        return f'"{version}"'
    return f'"{version}-{hashlib.blake2b(job.encode(), digest_size=6).hexdigest()}"'


def _overview_body(version: int, job: str | None, overview: FleetOverview, since: int | None,
                   rows: Mapping[str, bytes] | Sequence[bytes],
                   removed: Sequence[str] = ()) -> bytes:
    doc: dict[str, Any] = {
        "version": version, "full": since is None, "since": since, "job": job,
        "counts": overview.counts, "rails": overview.rails, "fail_slow": overview.fail_slow,
        "nodes": [msgspec.Raw(row) for row in (rows.values() if isinstance(rows, Mapping)
                                               else rows)],
        "removed": list(removed),
    }
    return _encoder.encode(doc)
