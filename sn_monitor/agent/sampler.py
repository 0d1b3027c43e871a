"""One sampling cycle: run every collector, merge their snapshots, keep the latest.

A failing collector never blanks the others: its status says so and the rest of the
snapshot is served. Events from NVML and from the kernel log are joined here: the
kernel log's PCI address is mapped to the GPU index, and one XID seen by both sources
is counted once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sn_monitor.agent.collectors.base import Collector, CollectorError, SourceMissing
from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.snapshot import (
    Collected,
    CollectorStatus,
    GpuSample,
    NodeSnapshot,
    XidCount,
)
from sn_monitor.clock import Clock
from sn_monitor.model import Event

log = logging.getLogger(__name__)


@dataclass
class _Seen:
    at: float
    gpu: int | None
    code: int
    source: str
    matched: bool = False


#: Event kinds that carry an XID code: the kernel log's "fallen off the bus" is Xid 79.
XID_KINDS = frozenset({"xid", "gpu_fallen_off_bus"})


class XidLedger:
    """Counts XIDs per (GPU, code), joining the NVML and kernel-log views of one error.

    The driver reports one XID both through the NVML event set and as an ``NVRM: Xid``
    kernel line. An event from one source is a duplicate when the other source reported
    the same GPU and code within ``window`` seconds and that report is not already paired.
    Repeats from the same source are never merged: a GPU that throws XID 13 five times
    counts five.
    """

    def __init__(self, clock: Clock, window: float = 10.0) -> None:
        self._clock = clock
        self._window = window
        self._recent: deque[_Seen] = deque()
        self._counts: dict[tuple[int | None, int], int] = {}

    def admit(self, events: Iterable[Event]) -> list[Event]:
        """Return the events that are new (duplicates dropped) and count their XIDs."""
        now = self._clock.monotonic()
        while self._recent and now - self._recent[0].at > self._window:
            self._recent.popleft()
        kept: list[Event] = []
        for event in events:
            if event.kind not in XID_KINDS or event.code is None:
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
            kept.append(event)
        return kept

    def counts(self) -> tuple[XidCount, ...]:
        """Every (GPU, XID) seen so far with its count, in a stable order."""
        return tuple(
            XidCount(gpu=gpu, xid=code, count=n)
            for (gpu, code), n in sorted(
                self._counts.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])
            )
        )


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
    """Runs the collectors once per cycle and holds the latest :class:`NodeSnapshot`."""

    def __init__(self, node: str, collectors: Sequence[Collector], clock: Clock) -> None:
        self.node = node
        self._collectors = list(collectors)
        self._clock = clock
        self._ledger = XidLedger(clock)
        self._latest: NodeSnapshot | None = None
        self._lock = threading.Lock()
        self._missing: set[str] = set()
        self._known_gpus: tuple[GpuSample, ...] = ()
        self._event_counts: dict[str, int] = {}

    @property
    def latest(self) -> NodeSnapshot | None:
        """The snapshot of the last finished cycle (None before the first)."""
        return self._latest

    def sample(self) -> NodeSnapshot:
        """Run one cycle. Thread-safe: overlapping calls run one after the other."""
        with self._lock:
            snapshot = self._sample()
            self._latest = snapshot
            return snapshot

    def _sample(self) -> NodeSnapshot:
        statuses: list[CollectorStatus] = []
        parts: list[Collected] = []
        for collector in self._collectors:
            started = self._clock.monotonic()
            ok = self._run(collector, parts)
            statuses.append(
                CollectorStatus(collector.name, ok, max(0.0, self._clock.monotonic() - started))
            )
        gpus = tuple(g for p in parts for g in p.gpus)
        if gpus:
            self._known_gpus = gpus
        events = map_events_to_gpus([e for p in parts for e in p.events], self._known_gpus)
        host = next((p.host for p in parts if p.host is not None), None)
        admitted = tuple(self._ledger.admit(events))
        for event in admitted:
            self._event_counts[event.kind] = self._event_counts.get(event.kind, 0) + 1
        return NodeSnapshot(
            node=self.node,
            timestamp_seconds=self._clock.time(),
            gpus=gpus,
            net=tuple(d for p in parts for d in p.net),
            infiniband=tuple(port for p in parts for port in p.infiniband),
            host=host,
            processes=next((p.processes for p in parts if p.processes is not None), None),
            events=admitted,
            xid_counts=self._ledger.counts(),
            event_counts=tuple(sorted(self._event_counts.items())),
            collectors=tuple(statuses),
        )

    def _run(self, collector: Collector, parts: list[Collected]) -> bool:
        name = collector.name
        try:
            parts.append(collector.collect())
        except SourceMissing as err:
            if name not in self._missing:
                log.debug("no data: %s", err, extra={"collector": name, "node": self.node})
                self._missing.add(name)
            return False
        except CollectorError as err:
            log.error("collector failed: %s", err, extra={"collector": name, "node": self.node})
            return False
        except Exception:
            log.exception("collector crashed", extra={"collector": name, "node": self.node})
            return False
        if name in self._missing:
            self._missing.discard(name)
            log.info("source is back", extra={"collector": name, "node": self.node})
        return True

    def close(self) -> None:
        """Close every collector."""
        for collector in self._collectors:
            try:
                collector.close()
            except OSError as err:
                log.warning("close failed: %s", err, extra={"collector": collector.name})
