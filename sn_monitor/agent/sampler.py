"""One sampling cycle: run every collector, merge their snapshots, keep the latest.

A failing collector never blanks the others: its status says so and the rest of the
snapshot is served. Events from NVML and from the kernel log are joined here: the
kernel log's PCI address is mapped to the GPU index, and one XID seen by both sources
is counted once. The agent's fast path (:mod:`sn_monitor.agent.fastpath`) hands the
events it takes between cycles to the same join (:meth:`Sampler.admit`): they count in
the next snapshot's XID counters, but its ``events`` holds only those the cycle admitted
itself, so that each event is spooled once, by whichever path took it.

The collectors' calls are made on a runner thread, one after another, each with a
deadline (:mod:`sn_monitor.agent.watchdog`). One that has not returned by then is
*stuck*: the cycle goes on without it, as without a failed collector (none of its values
are served, not even its last good ones), the collectors after it are called as usual,
and its status says ``stuck``. The cycle in which it becomes stuck carries one
``collector_stuck`` event. It gets no new call while the stuck one hangs; when that call
returns, its values are dropped as stale (its events, facts with their own times, are
kept) and the next cycle calls it again as usual.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from sn_monitor.agent.collectors.base import Collector, CollectorError, SourceMissing
from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.settings import DEFAULT_DEADLINE_SECONDS
from sn_monitor.agent.snapshot import (
    Collected,
    CollectorStatus,
    GpuSample,
    NodeSnapshot,
    XidCount,
)
from sn_monitor.agent.watchdog import CallOutcome, CollectorWatchdog, CycleCalls
from sn_monitor.clock import Clock
from sn_monitor.model import Event
from sn_monitor.rules.xid_catalog import gpu_fatal_codes

log = logging.getLogger(__name__)


@dataclass
class _Seen:
    at: float
    gpu: int | None
    code: int
    source: str
    matched: bool = False




class XidLedger:
    """Counts XIDs per (GPU, code), joining the NVML and kernel-log views of one error.

    The driver reports one XID both through the NVML event set and as an ``NVRM: Xid``
    kernel line. An event from one source is a duplicate when the other source reported
    the same GPU and code within ``window`` seconds and that report is not already paired.
    Repeats from the same source are never merged: a GPU that throws XID 13 five times
    counts five.

    The ``watched`` codes (default: those after which NVIDIA says to reset the GPU or
    reboot, :func:`~sn_monitor.rules.xid_catalog.gpu_fatal_codes`) are counted from 0 on
    every GPU the agent knows, before their first error: Prometheus' ``increase()``
    sees a series' first error only if the series was there before it.

    Thread-safe: the sampling cycle and the fast path's threads share one ledger.
    """

    def __init__(self, clock: Clock, window: float = 10.0,
                 watched: Iterable[int] | None = None) -> None:
        self._clock = clock
        self._window = window
        self._watched = frozenset(gpu_fatal_codes() if watched is None else watched)
        self._recent: deque[_Seen] = deque()
        self._counts: dict[tuple[int | None, int], int] = {}
        self._last: dict[int, int] = {}
        self._lock = threading.Lock()

    def admit(self, events: Iterable[Event]) -> list[Event]:
        """Return the events that are new (duplicates dropped) and count their XIDs."""
        with self._lock:
            return self._admit(events)

    def _admit(self, events: Iterable[Event]) -> list[Event]:
        now = self._clock.monotonic()
        while self._recent and now - self._recent[0].at > self._window:
            self._recent.popleft()
        kept: list[Event] = []
        for event in events:
            # an XID (NVML's event and the kernel log's Xid line alike) carries its code
            if event.kind != "xid" or event.code is None:
                kept.append(event)
                continue
            twin = next(
                (
                    seen
                    for seen in self._recent
                    if not seen.matched
                    and seen.source != event.source
                    and seen.gpu == event.gpu
                    and seen.code == event.code
                ),
                None,
            )
            if twin is not None:
                twin.matched = True
                log.debug("xid %s seen by %s and %s: counted once", event.code,
                          twin.source, event.source, extra={"gpu": event.gpu})
                continue
            self._recent.append(_Seen(now, event.gpu, event.code, event.source))
            key = (event.gpu, event.code)
            self._counts[key] = self._counts.get(key, 0) + 1
            if event.gpu is not None:
                self._last[event.gpu] = event.code
            kept.append(event)
        return kept

    def counts(self, gpus: Sequence[GpuSample] = ()) -> tuple[XidCount, ...]:
        """Every (GPU, XID) seen so far, and each watched code of each of ``gpus``.

        The watched codes count 0 until seen; the order is stable; each count carries
        its GPU's UUID from ``gpus``.
        """
        uuids = {g.index: g.uuid for g in gpus}
        with self._lock:
            counts = dict(self._counts)
        keys = set(counts) | {(g.index, code) for g in gpus for code in self._watched}
        return tuple(
            XidCount(gpu=gpu, xid=code, count=counts.get((gpu, code), 0),
                     uuid="" if gpu is None else uuids.get(gpu, ""))
            for gpu, code in sorted(keys, key=lambda key: (key[0] is None, key[0] or 0, key[1]))
        )

    def last(self) -> tuple[tuple[int, int], ...]:
        """(GPU index, code of its latest counted XID), by GPU index."""
        with self._lock:
            return tuple(sorted(self._last.items()))


def map_events_to_gpus(events: Sequence[Event], gpus: Sequence[GpuSample]) -> list[Event]:
    """Fill ``Event.gpu`` from the PCI address for events that name one (kernel log)."""
    by_bus = {bus: g.index for g in gpus if (bus := canonical_bus_id(g.pci_bus_id))}
    out = []
    for event in events:
        if event.gpu is None and event.pci_bus_id is not None:
            bus = canonical_bus_id(event.pci_bus_id)
            if bus is not None and bus in by_bus:
                event = replace(event, gpu=by_bus[bus])
        out.append(event)
    return out


class Sampler:
    """Runs the collectors once per cycle and holds the latest :class:`NodeSnapshot`.

    ``deadlines`` maps collector names to seconds on ``clock``
    (:data:`~sn_monitor.agent.settings.DEFAULT_DEADLINE_SECONDS` for the others); the
    waits are real, ``deadline / time_scale`` seconds (a simulation run faster than the
    wall scales its clock the same way). :meth:`close` stops the runner thread and closes
    the collectors.
    """

    def __init__(
        self,
        node: str,
        collectors: Sequence[Collector],
        clock: Clock,
        deadlines: Mapping[str, float] | None = None,
        time_scale: float = 1.0,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.node = node
        self._collectors = list(collectors)
        given = dict(deadlines or {})
        self._deadlines = {c.name: float(given.get(c.name, DEFAULT_DEADLINE_SECONDS))
                           for c in self._collectors}
        for name, seconds in self._deadlines.items():
            if seconds <= 0:
                raise ValueError(f"collector {name}: the deadline must be positive")
        self._watchdog = CollectorWatchdog(
            self._collectors, clock,
            {name: seconds / time_scale for name, seconds in self._deadlines.items()})
        self._clock = clock
        self._ledger = XidLedger(clock)
        self._latest: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self._missing: set[str] = set()
        self._stuck: set[str] = set()
        self._known_gpus: tuple[GpuSample, ...] = ()
        self._event_counts: dict[str, int] = {}
        self._counts_lock = threading.Lock()

    @property
    def latest(self) -> NodeSnapshot | None:
        """The snapshot of the last finished cycle (None before the first)."""
        return self._latest

    def stuck(self) -> frozenset[str]:
        """The collectors stuck at the end of the last cycle."""
        return frozenset(self._stuck)

    def admit(self, events: Sequence[Event]) -> list[Event]:
        """Join events taken between cycles (the fast path); return those that are new.

        Their PCI addresses are mapped with the GPUs of the last sample; they count in
        the next snapshot's XID and event counters but are not among its ``events``:
        the caller spools them. Thread-safe, and never waits for a cycle.
        """
        return self._admit(map_events_to_gpus(events, self._known_gpus))

    def _admit(self, events: Sequence[Event]) -> list[Event]:
        """The new events among ``events`` (already mapped to GPUs), counted by kind."""
        admitted = self._ledger.admit(events)
        with self._counts_lock:
            for event in admitted:
                self._event_counts[event.kind] = self._event_counts.get(event.kind, 0) + 1
        return admitted

    def sample(self) -> NodeSnapshot:
        """Run one cycle. Thread-safe: overlapping calls run one after the other.

        It takes at most the deadlines of the collectors that get stuck in it (real
        seconds, over the time scale), whatever they do: a collector stuck since an
        earlier cycle is not waited for again.
        """
        with self._lock:
            snapshot = self._sample()
            self._latest = snapshot
            return snapshot

    def _sample(self) -> NodeSnapshot:
        extra_events: list[Event] = []
        calls = self._watchdog.cycle()
        for name, late in calls.late:  # stuck calls that have returned since the last cycle
            extra_events += self._returned_late(name, late)
        statuses, parts = self._gather(calls, extra_events)
        return self._compose(parts, statuses, extra_events)

    def _gather(self, calls: CycleCalls, extra_events: list[Event]
                ) -> tuple[list[CollectorStatus], list[Collected]]:
        """Each collector's status and the values of those that succeeded this cycle.

        A collector newly stuck adds its ``collector_stuck`` event to ``extra_events``.
        """
        statuses: list[CollectorStatus] = []
        parts: list[Collected] = []
        for collector in self._collectors:
            name = collector.name
            if name in calls.stuck:
                statuses.append(self._stuck_status(name, calls.stuck[name], extra_events))
                continue
            outcome = calls.returned[name]
            ok = self._account(name, outcome, parts)
            statuses.append(CollectorStatus(name, ok, outcome.duration_seconds))
        return statuses, parts

    def _compose(self, parts: list[Collected], statuses: list[CollectorStatus],
                 extra_events: list[Event]) -> NodeSnapshot:
        """The cycle's snapshot: the parts joined, events mapped to GPUs and admitted."""
        gpus = tuple(g for p in parts for g in p.gpus)
        if gpus:
            self._known_gpus = gpus
        events = map_events_to_gpus([*extra_events, *(e for p in parts for e in p.events)],
                                    self._known_gpus)
        host = next((p.host for p in parts if p.host is not None), None)
        admitted = tuple(self._admit(events))
        with self._counts_lock:
            event_counts = tuple(sorted(self._event_counts.items()))
        return NodeSnapshot(
            node=self.node,
            timestamp_seconds=self._clock.time(),
            gpus=gpus,
            net=tuple(d for p in parts for d in p.net),
            infiniband=tuple(port for p in parts for port in p.infiniband),
            host=host,
            processes=next((p.processes for p in parts if p.processes is not None), None),
            events=admitted,
            xid_counts=self._ledger.counts(self._known_gpus),
            last_xids=self._ledger.last(),
            event_counts=event_counts,
            collectors=tuple(statuses),
            sources=tuple(source for p in parts for source in p.sources),
            job_logs=next((p.job_logs for p in parts if p.job_logs is not None), None),
        )

    def _stuck_status(self, name: str, started: float | None,
                      events: list[Event]) -> CollectorStatus:
        """The status of a collector whose call is still running past its deadline."""
        hung = 0.0 if started is None else max(0.0, self._clock.monotonic() - started)
        if name not in self._stuck:
            self._stuck.add(name)
            deadline = self._deadlines[name]
            message = (f"collector {name} has not returned for {max(hung, deadline):.3g} s "
                       f"(deadline {deadline:g} s): the agent goes on without it, and "
                       "without its values, until the call returns")
            log.error("%s", message, extra={"collector": name, "node": self.node})
            events.append(Event(kind="collector_stuck", source="agent",
                                time_seconds=self._clock.time(), message=message))
        return CollectorStatus(name, False, hung, stuck=True)

    def _returned_late(self, name: str, late: CallOutcome) -> list[Event]:
        """A stuck call returned: the collector is un-stuck; keep only its events."""
        self._stuck.discard(name)
        kept = list(late.collected.events) if late.collected is not None else []
        how = "failed" if late.error is not None else "returned"
        log.warning("collector %s %s after %.1f s, past its deadline: its values are "
                    "dropped as stale (%d events kept); it is called again from now on",
                    name, how, late.duration_seconds, len(kept),
                    extra={"collector": name, "node": self.node})
        return kept

    def _account(self, name: str, outcome: CallOutcome, parts: list[Collected]) -> bool:
        """Log a call's failure as the kind it is; keep its values when it succeeded."""
        err = outcome.error
        if isinstance(err, SourceMissing):
            if name not in self._missing:
                log.debug("no data: %s", err, extra={"collector": name, "node": self.node})
                self._missing.add(name)
            return False
        if isinstance(err, CollectorError):
            log.error("collector failed: %s", err, extra={"collector": name, "node": self.node})
            return False
        if err is not None:
            log.error("collector crashed", exc_info=err,
                      extra={"collector": name, "node": self.node})
            return False
        assert outcome.collected is not None
        parts.append(outcome.collected)
        if name in self._missing:
            self._missing.discard(name)
            log.info("source is back", extra={"collector": name, "node": self.node})
        return True

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` real seconds for the calls still running to return.

        True when none is left running: the next cycle then finds the stuck ones un-stuck.
        """
        return self._watchdog.settle(timeout)

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the runner thread and close every collector (``timeout`` for all).

        It waits for a cycle in progress (up to ``timeout``). A stuck collector cannot be
        closed under its hung call: its runner thread is left to close it if the call ever
        returns, and that is logged.
        """
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            log.error("a cycle is still running at close: the collectors are left open",
                      extra={"node": self.node})
            return
        try:
            left = self._watchdog.close(timeout)
        finally:
            self._lock.release()
        for name in left:
            log.error("collector %s is still running at close: its runner thread is left "
                      "to close it if the call ever returns", name,
                      extra={"collector": name, "node": self.node})
