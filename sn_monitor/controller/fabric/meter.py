"""Live rates of every node's links, from the counters its reports carry.

An agent reports cumulative counters (bytes sent on a port, ``port_xmit_wait`` ticks,
NVLink errors); what the topology view colours and the bottleneck finder compares are
rates. :class:`FabricMeter` keeps, per node, the last counters of each port and GPU
and a smoothed rate of each: an exponentially weighted mean with time constant
``tau`` seconds, so that one noisy interval neither paints a link red nor names it.

Ingest only keeps a reference: every ``every`` seconds per node (5 s: the finder judges
every 5 s, and an agent that evaluates its node-local rules sends these values that
often anyway) the report's ports and GPUs are kept as the node's newest snapshot, and
the rates are worked out from it when someone reads the node (:meth:`FabricMeter.node`:
the finder, for a job's nodes; the topology view). A fleet of thousands whose nodes
nobody reads costs the report path a dictionary lookup. A port's state and link rate
are those of the latest report (a port that goes down shows at once).

Two locks, so that a report never waits for a reader (the ingest runs on the event
loop that reads every agent's report; working in the rates of thousands of nodes takes
a second). The inbox lock guards what ingest writes (each node's newest snapshots,
``at``, the table of nodes) and is held for a few dictionary operations at a time. The
readings lock (:meth:`FabricMeter.reading`) guards the rates, which only readers
change: a reader holds it while it works in and reads, and takes the inbox lock only to
move a node's snapshots out. A reader that takes its time (the topology view) reads
:meth:`FabricMeter.values`: a node's readings as frozen values, kept until its rates
change, which it may keep and read after every lock is let go.

What the health rules read of a node (a port's state, link rate and errors rate, a GPU's
``lost`` and throttle reasons) is worked in on its own too (:meth:`FabricMeter.health`:
the overview reads every node every few seconds and needs no other rate); each snapshot
marks that its share of it is in, so that the rates read later do not take it twice. The
values are the same whichever reader came first.

A report that leaves a port or GPU out (a trimmed report: the agent evaluates its
node-local rules and sends values every few seconds) changes nothing: the rates stand
until the next report that carries them. A counter that went backwards (the agent
restarted, a device was reset) starts its rate again.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgspec

from sn_monitor.model import GpuReport, IbPortReport, Report

#: Port counters summed into ``errors_per_second``: link and packet errors, not congestion.
ERROR_MARKERS: tuple[str, ...] = ("err", "downed", "discard", "integrity", "overrun")
#: RoCE congestion: packets the switch marked (ECN) and the notifications (CNP) they cause.
ECN_COUNTERS: tuple[str, ...] = ("np_ecn_marked_roce_packets",)
CNP_COUNTERS: tuple[str, ...] = ("np_cnp_sent", "rp_cnp_handled")
#: Clock-event reasons that slow a GPU (the others are idle, application or display
#: clocks, or sync boost: not a fault).
SLOWING_REASONS = frozenset({
    "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
})
#: What the meter reads, as rule metrics: agents that evaluate their node-local rules
#: send the controller only what it reads (:class:`~sn_monitor.rules.series.Trim`).
FABRIC_METRICS: tuple[str, ...] = (
    "gpu_utilization_ratio", "gpu_temperature_celsius", "gpu_sm_clock_hertz",
    "gpu_sm_max_clock_hertz", "gpu_processes", "gpu_nvlinks_down",
    "gpu_nvlink_transmitted_bytes_total", "gpu_nvlink_crc_errors_total",
    "gpu_nvlink_replay_errors_total", "gpu_nvlink_recovery_errors_total",
    "infiniband_port_state", "infiniband_port_rate_bytes_per_second",
    "infiniband_port_transmitted_bytes", "infiniband_port_received_bytes",
    "infiniband_port_transmit_wait", "infiniband_port_np_ecn_marked_roce_packets",
    "infiniband_port_np_cnp_sent", "infiniband_port_rp_cnp_handled",
    "infiniband_port_symbol_errors", "infiniband_port_link_downed",
    "infiniband_port_receive_errors", "infiniband_port_transmit_discards",
    "infiniband_port_link_error_recovery",
)
#: The smoothing time constant of the rates, seconds.
DEFAULT_TAU_SECONDS = 15.0
#: The least time between two readings of a node's rates, seconds.
DEFAULT_EVERY_SECONDS = 4.5


#: A smoothed rate under this (per second: one event in some thirty years) is 0. Its
#: exponential decay never reaches 0 alone (it stops at the smallest float), and a port
#: that counted one error would read as counting errors for ever.
NEGLIGIBLE_RATE = 1e-9


class Rate:
    """One cumulative counter's smoothed rate per second."""

    __slots__ = ("_at", "_last", "latest", "value")

    def __init__(self) -> None:
        self._last: int | None = None
        self._at = 0.0
        #: The smoothed rate; None until two readings.
        self.value: float | None = None
        #: The rate over the last interval alone: whether the counter still moves now.
        self.latest: float | None = None

    def feed(self, total: int | None, now: float, tau: float) -> None:
        if total is None:
            return
        if total == self._last and self.value == 0.0 and self.latest == 0.0:
            self._at = now  # a counter at rest, and at rest before: only the time moves
            return
        last, at = self._last, self._at
        self._last, self._at = total, now
        if last is None or total < last:
            return  # first reading, or the counter started again
        dt = now - at
        if dt <= 0:
            return
        rate = (total - last) / dt
        self.latest = rate
        if self.value is None:
            self.value = rate
        else:
            weight = 1.0 - math.exp(-dt / tau)
            self.value += weight * (rate - self.value)
        if self.value < NEGLIGIBLE_RATE:
            self.value = 0.0


@dataclass(slots=True)
class PortReading:
    """One port's latest state and rate, and its counters' smoothed rates."""

    device: str
    port: int
    state: int | None = None
    rate_bytes_per_second: float | None = None
    transmit: Rate = field(default_factory=Rate)
    receive: Rate = field(default_factory=Rate)
    transmit_wait: Rate = field(default_factory=Rate)
    ecn: Rate = field(default_factory=Rate)
    cnp: Rate = field(default_factory=Rate)
    errors: Rate = field(default_factory=Rate)
    #: Whether the port reports ECN / CNP counters at all (RoCE).
    has_ecn: bool = False
    #: The names of its error counters, and how many counters the port had then.
    error_names: tuple[str, ...] = ()
    counted: int = -1
    #: Reads every error counter at once (two or more of them; None: fewer).
    error_get: Callable[[Mapping[str, int]], tuple[int, ...]] | None = None

    def name_errors(self, counters: Mapping[str, int]) -> None:
        """Which of ``counters`` count errors (again only when their number changes)."""
        self.counted = len(counters)
        self.error_names = tuple(n for n in counters if _is_error(n))
        self.error_get = (operator.itemgetter(*self.error_names)
                          if len(self.error_names) > 1 else None)

    def error_total(self, counters: Mapping[str, int]) -> int:
        """The sum of the port's error counters (one missing counts 0)."""
        if self.error_get is not None:
            try:
                return sum(self.error_get(counters))
            except KeyError:
                pass
        return sum(counters.get(n, 0) for n in self.error_names)

    def utilization(self) -> float | None:
        """Transmit throughput over the link's rate, 0..1; None when either is unknown."""
        tx, rate = self.transmit.value, self.rate_bytes_per_second
        if tx is None or not rate:
            return None
        return min(1.0, max(0.0, tx / rate))


@dataclass(slots=True)
class GpuReading:
    """One GPU's latest clocks, throttle reasons, processes and NVLink rates."""

    index: int
    utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    sm_max_clock_hertz: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    processes: int | None = None
    nvlinks_down: int | None = None
    lost: bool = False
    nvlink_transmit: Rate = field(default_factory=Rate)
    nvlink_errors: Rate = field(default_factory=Rate)


class Snapshot:
    """A report's ports and GPUs at controller time ``now``, not yet worked into the rates.

    ``health_in``: whether what the health rules read of it (the error counters, a GPU's
    ``lost`` and throttle reasons) is worked in already (:meth:`FabricMeter.health`); the
    readings lock guards it.
    """

    __slots__ = ("gpus", "health_in", "now", "ports")

    def __init__(self, now: float, ports: Sequence[IbPortReport],
                 gpus: Sequence[GpuReport]) -> None:
        self.now = now
        self.ports = ports
        self.gpus = gpus
        self.health_in = False


@dataclass(slots=True)
class NodeReadings:
    """What the meter knows of one node; ``at``: the time of its last rates.

    ``ports``, ``gpus``, ``frozen`` and ``health`` are the readers' (the readings lock);
    ``at``, ``pending`` and ``latest_ports`` the ingest's (the inbox lock).
    """

    ports: dict[tuple[str, int], PortReading] = field(default_factory=dict)
    gpus: dict[int, GpuReading] = field(default_factory=dict)
    at: float = -math.inf
    #: The newest snapshots not yet worked into the rates, oldest first, at most two
    #: (a node read for the first time has a rate at once).
    pending: list[Snapshot] = field(default_factory=list)
    #: The ports of the latest report that carried any, for their states and link rates.
    latest_ports: Sequence[IbPortReport] = ()
    #: The readings as frozen values (:meth:`FabricMeter.values`); None once they change.
    frozen: NodeValues | None = None
    #: What the health rules read of them, frozen (:meth:`FabricMeter.health`); None once
    #: that changes.
    health: NodeValues | None = None


class PortValues(msgspec.Struct, frozen=True, gc=False):
    """One port's state, link rate and smoothed rates at one moment (see PortReading)."""

    device: str
    port: int
    state: int | None
    rate_bytes_per_second: float | None
    transmit_bytes_per_second: float | None
    receive_bytes_per_second: float | None
    utilization_ratio: float | None
    transmit_wait_per_second: float | None
    ecn_marked_per_second: float | None
    cnp_per_second: float | None
    errors_per_second: float | None


class GpuValues(msgspec.Struct, frozen=True, gc=False):
    """One GPU's latest values and smoothed NVLink rates at one moment (see GpuReading)."""

    index: int
    utilization_ratio: float | None
    temperature_celsius: float | None
    sm_clock_hertz: float | None
    sm_max_clock_hertz: float | None
    throttle_reasons: tuple[str, ...]
    processes: int | None
    nvlinks_down: int | None
    lost: bool
    nvlink_transmit_bytes_per_second: float | None
    nvlink_errors_per_second: float | None


class NodeValues(msgspec.Struct, frozen=True, gc=False):
    """What the meter knew of one node at one moment: it never changes after.

    Frozen values hold no cycle: the cyclic garbage collector never tracks them (a
    full collection walks every tracked object, and pauses every thread meanwhile).
    """

    ports: Mapping[tuple[str, int], PortValues]
    gpus: Mapping[int, GpuValues]


def _frozen(readings: NodeReadings) -> NodeValues:
    ports = {key: PortValues(
        p.device, p.port, p.state, p.rate_bytes_per_second, p.transmit.value,
        p.receive.value, p.utilization(), p.transmit_wait.value, p.ecn.value, p.cnp.value,
        p.errors.value) for key, p in readings.ports.items()}
    gpus = {index: GpuValues(
        g.index, g.utilization_ratio, g.temperature_celsius, g.sm_clock_hertz,
        g.sm_max_clock_hertz, g.throttle_reasons, g.processes, g.nvlinks_down, g.lost,
        g.nvlink_transmit.value, g.nvlink_errors.value) for index, g in readings.gpus.items()}
    return NodeValues(ports, gpus)


def _health_frozen(readings: NodeReadings) -> NodeValues:
    """What the health rules read of the readings; every other value None."""
    ports = {key: PortValues(p.device, p.port, p.state, p.rate_bytes_per_second, None, None,
                             None, None, None, None, p.errors.value)
             for key, p in readings.ports.items()}
    gpus = {index: GpuValues(g.index, None, None, None, None, g.throttle_reasons, None, None,
                             g.lost, None, None) for index, g in readings.gpus.items()}
    return NodeValues(ports, gpus)


def _sum(counters: Mapping[str, int], names: Iterable[str]) -> int | None:
    values = [counters[n] for n in names if n in counters]
    return sum(values) if values else None


_ERROR_NAMES: dict[str, bool] = {}


def _is_error(name: str) -> bool:
    """Whether a counter counts errors (memoised: a port's names repeat every report)."""
    known = _ERROR_NAMES.get(name)
    if known is None:
        if len(_ERROR_NAMES) >= 4096:  # names come from the wire: bounded
            _ERROR_NAMES.clear()
        known = _ERROR_NAMES[name] = any(m in name for m in ERROR_MARKERS)
    return known


def _nvlink_errors(gpu: GpuReport) -> int | None:
    values = [v for v in (gpu.nvlink_crc_errors_total, gpu.nvlink_replay_errors_total,
                          gpu.nvlink_recovery_errors_total) if v is not None]
    return sum(values) if values else None


class FabricMeter:
    """Every node's link rates, fed with each report (see the module docstring).

    :meth:`observe` and :meth:`values` may be called from any thread; what
    :meth:`node` returns is read while holding :meth:`reading`, where another thread may
    read the meter too.
    """

    def __init__(self, tau_seconds: float = DEFAULT_TAU_SECONDS,
                 every_seconds: float = DEFAULT_EVERY_SECONDS) -> None:
        if tau_seconds <= 0 or every_seconds < 0:
            raise ValueError("tau_seconds must be > 0 and every_seconds >= 0")
        self.tau = tau_seconds
        self.every = every_seconds
        self._nodes: dict[str, NodeReadings] = {}
        self._inbox = threading.Lock()
        self._readings = threading.RLock()

    def observe(self, report: Report, now: float) -> None:
        """Take the values ``report`` carries, at controller time ``now``."""
        if not report.infiniband and not report.gpus:
            return
        with self._inbox:
            readings = self._nodes.get(report.node)
            if readings is None:
                readings = self._nodes[report.node] = NodeReadings()
            if now - readings.at >= self.every:
                readings.at = now
                pending = readings.pending
                if len(pending) >= 2:
                    del pending[0]
                pending.append(Snapshot(now, report.infiniband, report.gpus))
            if report.infiniband:  # the ports' states and link rates: the latest report's
                readings.latest_ports = report.infiniband

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Hold the readings lock: no other reader changes the rates meanwhile.

        Taken before any lock of the caller's that the ingest also takes, never after:
        a reader waiting for it while holding such a lock would hold every report.
        """
        with self._readings:
            yield

    def _work_in(self, readings: NodeReadings, rates: bool = True) -> None:
        """The pending snapshots into the node's readings, oldest first; the latest states.

        Without ``rates``, only what the health rules read (:meth:`health`): the snapshots
        stay pending for the rates, marked so that it is not worked in twice.
        Called with the readings lock held; takes the inbox lock to move them out.
        """
        with self._inbox:
            pending, latest = readings.pending, readings.latest_ports
            if rates:
                readings.pending = []
            elif pending:
                pending = list(pending)  # ingest may drop the oldest meanwhile
            readings.latest_ports = ()
        for snapshot in pending:
            if not snapshot.health_in:
                snapshot.health_in = True
                if self._health_in(readings, snapshot):
                    readings.frozen = readings.health = None
            if rates:
                readings.frozen = None
                for port in snapshot.ports:
                    self._port(readings, port, snapshot.now)
                for gpu in snapshot.gpus:
                    self._gpu(readings, gpu, snapshot.now)
        for port in latest:
            self._latest(readings, port)

    @staticmethod
    def _latest(readings: NodeReadings, port: IbPortReport) -> None:
        """A port's state and link rate, the latest report's.

        The frozen values are made again only when one changes: every report carries
        them, and most change nothing.
        """
        reading = readings.ports.get((port.device, port.port))
        if reading is None:
            reading = readings.ports[(port.device, port.port)] = PortReading(
                port.device, port.port)
            readings.frozen = readings.health = None
        if port.state is not None and port.state != reading.state:
            reading.state = port.state
            readings.frozen = readings.health = None
        if (port.rate_bytes_per_second is not None
                and port.rate_bytes_per_second != reading.rate_bytes_per_second):
            reading.rate_bytes_per_second = port.rate_bytes_per_second
            readings.frozen = readings.health = None

    @staticmethod
    def _port_reading(readings: NodeReadings, port: IbPortReport) -> PortReading:
        key = (port.device, port.port)
        reading = readings.ports.get(key)
        if reading is None:
            reading = readings.ports[key] = PortReading(port.device, port.port)
        return reading

    def _health_in(self, readings: NodeReadings, snapshot: Snapshot) -> bool:
        """What the health rules read of a snapshot, into the readings.

        Each port's errors rate (its error counters summed), each GPU's ``lost`` and
        throttle reasons. Whether any of it moved (or a port or GPU is new). One loop, with
        no call per port or GPU: at 8,192 nodes the overview works in some two thousand
        snapshots a second.
        """
        moved = False
        ports, now, tau = readings.ports, snapshot.now, self.tau
        for port in snapshot.ports:
            key = (port.device, port.port)
            reading = ports.get(key)
            if reading is None:
                reading = ports[key] = PortReading(port.device, port.port)
                moved = True
            counters = port.counters
            if not counters:
                continue
            if len(counters) != reading.counted:
                reading.name_errors(counters)
            if not reading.error_names:
                continue
            errors = reading.errors
            before = errors.value
            errors.feed(reading.error_total(counters), now, tau)
            moved = moved or errors.value != before
        gpus = readings.gpus
        for gpu in snapshot.gpus:
            held = gpus.get(gpu.index)
            if held is None:
                held = gpus[gpu.index] = GpuReading(gpu.index)
                moved = True
            if gpu.lost != held.lost:
                held.lost = gpu.lost
                moved = True
            if gpu.sm_clock_hertz is not None:  # a report with clocks says which reasons hold
                reasons = tuple(gpu.throttle_reasons)
                if reasons != held.throttle_reasons:
                    held.throttle_reasons = reasons
                    moved = True
        return moved

    def _port(self, readings: NodeReadings, port: IbPortReport, now: float) -> None:
        """A port's other counters (its errors went in with :meth:`_health_in`)."""
        reading = self._port_reading(readings, port)
        counters, tau = port.counters, self.tau
        if not counters:
            return
        reading.transmit.feed(counters.get("transmitted_bytes"), now, tau)
        reading.receive.feed(counters.get("received_bytes"), now, tau)
        reading.transmit_wait.feed(counters.get("transmit_wait"), now, tau)
        ecn = _sum(counters, ECN_COUNTERS)
        if ecn is not None:
            reading.has_ecn = True
            reading.ecn.feed(ecn, now, tau)
        reading.cnp.feed(_sum(counters, CNP_COUNTERS), now, tau)

    @staticmethod
    def _gpu_reading(readings: NodeReadings, gpu: GpuReport) -> GpuReading:
        reading = readings.gpus.get(gpu.index)
        if reading is None:
            reading = readings.gpus[gpu.index] = GpuReading(gpu.index)
        return reading

    def _gpu(self, readings: NodeReadings, gpu: GpuReport, now: float) -> None:
        """A GPU's other values and rates (its health went in with :meth:`_health_in`)."""
        reading = self._gpu_reading(readings, gpu)
        for name in ("utilization_ratio", "temperature_celsius", "sm_clock_hertz",
                     "sm_max_clock_hertz", "processes", "nvlinks_down"):
            value = getattr(gpu, name)
            if value is not None:
                setattr(reading, name, value)
        reading.nvlink_transmit.feed(gpu.nvlink_transmitted_bytes_total, now, self.tau)
        reading.nvlink_errors.feed(_nvlink_errors(gpu), now, self.tau)

    def node(self, name: str) -> NodeReadings | None:
        """The node's readings, its newest values worked in (read them under :meth:`reading`).

        None before a report with values.
        """
        with self._inbox:
            readings = self._nodes.get(name)
        if readings is not None:
            with self._readings:
                self._work_in(readings)
        return readings

    def values(self, name: str) -> NodeValues | None:
        """The node's readings as frozen values, to read with no lock held.

        None before a report with values. Made again only after its rates changed.
        """
        with self._readings:
            readings = self.node(name)
            if readings is None:
                return None
            if readings.frozen is None:
                readings.frozen = _frozen(readings)
            return readings.frozen

    def health(self, name: str) -> NodeValues | None:
        """What the health rules read of the node's readings, frozen; every rate None.

        A port's state, link rate and errors, a GPU's ``lost`` and throttle reasons: the
        values :meth:`values` has for them, worked in without the other rates (a tenth of
        the work: the overview of 8,192 nodes reads every node every few seconds). Made
        again only after one of them may have changed. None before a report with values.
        """
        with self._readings:
            with self._inbox:
                readings = self._nodes.get(name)
            if readings is None:
                return None
            self._work_in(readings, rates=False)
            if readings.health is None:
                readings.health = _health_frozen(readings)
            return readings.health

    def nodes(self) -> list[str]:
        with self._inbox:
            return list(self._nodes)
