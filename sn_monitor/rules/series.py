"""From a report to the numbers a rule looks at: metric names, subjects and accessors.

A metric name says where in a :class:`~sn_monitor.model.Report` a value lives:

- ``gpu_<field>``: a :class:`~sn_monitor.model.GpuReport` field (bools count as 0/1);
- ``gpu_<derived>``: a value computed from two GPU fields, for faults that are a relation
  rather than a level (a PCIe link trained below its maximum, a temperature close to the
  limit NVML reports for *this* GPU model); see :data:`DERIVED_GPU_METRICS`;
- ``infiniband_port_state`` and ``infiniband_port_<stem>``: an
  :class:`~sn_monitor.model.IbPortReport`'s state or ``counters[stem]`` (``_total``, as
  on /metrics, may be added: ``infiniband_port_symbol_errors_total``);
- ``network_<field>``: a :class:`~sn_monitor.model.NetReport` field;
- ``host_<field>``: a :class:`~sn_monitor.model.HostReport` field, the node's own.

Each value belongs to a :class:`Subject`, the thing inside the node it describes (``gpu=3``,
``device=mlx5_0,port=1``, ``device=eth0``; a host value's is the node itself, :data:`NODE`).
Subjects are interned, so reading a report allocates only the result list: this runs for
every rule on every report. The engine's hot path reads through :func:`frame_of` /
:func:`compile_reader` instead: a report's values are read once per metric for all rules,
as columns, without per-value tuples.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final

import msgspec

from sn_monitor.model import MAX_GPUS, GpuReport, HostReport, IbPortReport, NetReport, Report


@dataclass(frozen=True, slots=True)
class Subject:
    """What a value is about, within one node.

    ``text`` (``gpu=3``, ``device=mlx5_0,port=1``) is the hashable key rules keep state
    under and the ``subject`` of a finding; ``labels`` is the same as a mapping, for
    ``labels:`` matches; ``human`` is for messages (``GPU 3``, ``mlx5_0 port 1``).
    """

    text: str
    human: str
    labels: Mapping[str, str]
    gpu: int | None = None


NODE: Final = Subject("", "node", {})
"""The subject of node-level findings (heartbeat, peers)."""

SeriesKey = str
"""The key a series is kept under: its subject's ``text``."""

_GPU_SUBJECTS: Final = tuple(
    Subject(f"gpu={i}", f"GPU {i}", {"gpu": str(i)}, i) for i in range(MAX_GPUS)
)
_CACHE_LIMIT = 4096
_ib_subjects: dict[tuple[str, int], Subject] = {}
_net_subjects: dict[str, Subject] = {}


def ib_subject(device: str, port: int) -> Subject:
    """The interned subject of an InfiniBand port."""
    subject = _ib_subjects.get((device, port))
    if subject is None:
        if len(_ib_subjects) >= _CACHE_LIMIT:  # bounded: names come from the wire
            _ib_subjects.clear()
        subject = Subject(f"device={device},port={port}", f"{device} port {port}",
                          {"device": device, "port": str(port)})
        _ib_subjects[(device, port)] = subject
    return subject


def net_subject(device: str) -> Subject:
    """The interned subject of a network interface."""
    subject = _net_subjects.get(device)
    if subject is None:
        if len(_net_subjects) >= _CACHE_LIMIT:
            _net_subjects.clear()
        subject = Subject(f"device={device}", device, {"device": device})
        _net_subjects[device] = subject
    return subject


def event_subject(gpu: int | None, device: str | None) -> Subject:
    """The subject an event is about: its GPU, else its device, else the node."""
    if gpu is not None and 0 <= gpu < MAX_GPUS:
        return _GPU_SUBJECTS[gpu]
    if device:
        return net_subject(device)
    return NODE


Values = list[tuple[Subject, float]]
Accessor = Callable[[Report], Values]

_NOT_VALUES = {"index", "uuid", "lost", "throttle_reasons", "workloads"}
GPU_FIELDS: Final = frozenset(
    f.name for f in msgspec.structs.fields(GpuReport) if f.name not in _NOT_VALUES
)
NET_FIELDS: Final = frozenset(
    f.name for f in msgspec.structs.fields(NetReport) if f.name != "device"
)
HOST_FIELDS: Final = frozenset(f.name for f in msgspec.structs.fields(HostReport))


def _ratio(num: str, den: str) -> Callable[[GpuReport], float | None]:
    get_num, get_den = attrgetter(num), attrgetter(den)

    def ratio(gpu: GpuReport) -> float | None:
        n, d = get_num(gpu), get_den(gpu)
        return None if n is None or not d else n / d
    return ratio


def _margin(limit: str, value: str) -> Callable[[GpuReport], float | None]:
    get_limit, get_value = attrgetter(limit), attrgetter(value)

    def margin(gpu: GpuReport) -> float | None:
        top, now = get_limit(gpu), get_value(gpu)
        return None if top is None or now is None else float(top - now)
    return margin


DERIVED_GPU_PARTS: Final[Mapping[str, tuple[str, str, str]]] = {
    # 1.0 when the link trained at its maximum; x8 of x16 is 0.5.
    "pcie_link_width_ratio": ("ratio", "pcie_link_width", "pcie_link_width_max"),
    "pcie_link_generation_ratio": ("ratio", "pcie_link_generation", "pcie_link_generation_max"),
    "memory_used_ratio": ("ratio", "memory_used_bytes", "memory_total_bytes"),
    "power_limit_ratio": ("ratio", "power_watts", "power_limit_watts"),
    # Degrees left before this GPU's own NVML thresholds: portable across GPU models.
    "slowdown_margin_celsius": ("margin", "slowdown_temperature_celsius", "temperature_celsius"),
    "shutdown_margin_celsius": ("margin", "shutdown_temperature_celsius", "temperature_celsius"),
    "memory_temperature_margin_celsius": ("margin", "memory_max_temperature_celsius",
                                          "memory_temperature_celsius"),
}
"""The values computed from two GPU fields: (``ratio``, numerator, denominator) or
(``margin``, limit, value); :data:`DERIVED_GPU_METRICS` computes them."""

DERIVED_GPU_METRICS: Final[Mapping[str, Callable[[GpuReport], float | None]]] = {
    name: (_ratio if kind == "ratio" else _margin)(a, b)
    for name, (kind, a, b) in DERIVED_GPU_PARTS.items()
}

_IB_STEM = re.compile(r"[a-z0-9_]+")

#: The label names each metric family's subjects carry, for ``labels:`` matches.
FAMILY_LABELS: Final[Mapping[str, frozenset[str]]] = {
    "gpu": frozenset({"gpu"}),
    "infiniband": frozenset({"device", "port"}),
    "network": frozenset({"device"}),
    "host": frozenset(),
}


def metric_family(metric: str) -> str:
    """``gpu``, ``infiniband``, ``network`` or ``host``; ValueError for an unknown metric."""
    if metric.startswith("gpu_"):
        name = metric[4:]
        if name in GPU_FIELDS or name in DERIVED_GPU_METRICS:
            return "gpu"
        raise ValueError(_unknown(metric, "gpu_", GPU_FIELDS | DERIVED_GPU_METRICS.keys()))
    if metric.startswith("infiniband_port_"):
        if _IB_STEM.fullmatch(metric[16:]):
            return "infiniband"
        raise ValueError(f"unknown metric {metric!r}: infiniband_port_ must be followed by "
                         "state or a counter name ([a-z0-9_]+)")
    if metric.startswith("network_"):
        if metric[8:] in NET_FIELDS:
            return "network"
        raise ValueError(_unknown(metric, "network_", NET_FIELDS))
    if metric.startswith("host_"):
        if metric[5:] in HOST_FIELDS:
            return "host"
        raise ValueError(_unknown(metric, "host_", HOST_FIELDS))
    raise ValueError(f"unknown metric {metric!r}: metric names start with gpu_, "
                     "infiniband_port_, network_ or host_")


def _unknown(metric: str, prefix: str, names: Set[str]) -> str:
    close = difflib.get_close_matches(metric[len(prefix):], names, n=1)
    if close:
        return f"unknown metric {metric!r} (did you mean {prefix}{close[0]}?)"
    return (f"unknown metric {metric!r}: {prefix} is followed by one of "
            f"{', '.join(sorted(names))}")


def check_metric(metric: str) -> None:
    """Validator for rule files: raise ValueError naming what is wrong with ``metric``."""
    metric_family(metric)


def compile_accessor(metric: str, labels: Mapping[str, str] | None = None) -> Accessor:
    """A function reading ``metric`` from a report, precompiled once per rule.

    ``labels`` maps label names to regular expressions (full match) that a subject must
    match. Lost GPUs and missing (None) values contribute nothing.
    """
    family = metric_family(metric)
    accept = _subject_filter(labels or {})
    if family == "gpu":
        name = metric[4:]
        derived = DERIVED_GPU_METRICS.get(name)
        get = derived if derived is not None else attrgetter(name)
        return _gpu_accessor(get, accept)
    if family == "infiniband":
        stem = metric[16:]
        return _ib_accessor(stem, accept)
    if family == "host":
        return _host_accessor(attrgetter(metric[5:]), accept)
    return _net_accessor(attrgetter(metric[8:]), accept)


def series_of(report: Report, metric: str) -> Values:
    """Every (subject, value) of ``metric`` in ``report``; compiles the accessor each call.

    Convenient for tools and tests; the engine keeps compiled accessors instead.
    """
    return compile_accessor(metric)(report)


def _subject_filter(labels: Mapping[str, str]) -> Callable[[Subject], bool] | None:
    if not labels:
        return None
    patterns = [(name, re.compile(expr)) for name, expr in labels.items()]
    verdicts: dict[str, bool] = {}

    def accept(subject: Subject) -> bool:
        verdict = verdicts.get(subject.text)
        if verdict is None:
            verdict = all(
                (value := subject.labels.get(name)) is not None and p.fullmatch(value) is not None
                for name, p in patterns
            )
            if len(verdicts) >= _CACHE_LIMIT:
                verdicts.clear()
            verdicts[subject.text] = verdict
        return verdict
    return accept


def _gpu_accessor(get: Callable[[GpuReport], object],
                  accept: Callable[[Subject], bool] | None) -> Accessor:
    subjects = _GPU_SUBJECTS

    def read(report: Report) -> Values:
        out: Values = []
        for gpu in report.gpus:
            if gpu.lost:
                continue
            value = get(gpu)
            if value is None:
                continue
            subject = subjects[gpu.index]
            if accept is None or accept(subject):
                out.append((subject, float(value)))  # type: ignore[arg-type]
        return out
    return read


def _ib_accessor(stem: str, accept: Callable[[Subject], bool] | None) -> Accessor:
    # The report keys counters by stem (symbol_errors); /metrics adds _total. Both work.
    bare = stem[:-6] if stem.endswith("_total") else stem

    def value_of(port: IbPortReport) -> float | None:
        if stem == "state":
            return None if port.state is None else float(port.state)
        found = port.counters.get(stem)
        if found is None and bare is not stem:
            found = port.counters.get(bare)
        return None if found is None else float(found)

    def read(report: Report) -> Values:
        out: Values = []
        for port in report.infiniband:
            value = value_of(port)
            if value is None:
                continue
            subject = ib_subject(port.device, port.port)
            if accept is None or accept(subject):
                out.append((subject, value))
        return out
    return read


def _net_accessor(get: Callable[[NetReport], object],
                  accept: Callable[[Subject], bool] | None) -> Accessor:
    def read(report: Report) -> Values:
        out: Values = []
        for net in report.network:
            value = get(net)
            if value is None:
                continue
            subject = net_subject(net.device)
            if accept is None or accept(subject):
                out.append((subject, float(value)))  # type: ignore[arg-type]
        return out
    return read


def _host_accessor(get: Callable[[HostReport], object],
                   accept: Callable[[Subject], bool] | None) -> Accessor:
    def read(report: Report) -> Values:
        host = report.host
        value = None if host is None else get(host)
        if value is None or (accept is not None and not accept(NODE)):
            return []
        return [(NODE, float(value))]  # type: ignore[arg-type]
    return read


class Frame:
    """One report's values, read once for all the rules that look at it.

    Each rule asks for its metric's *column*: the raw values (None where missing) of
    every subject of the metric's family, in report order, aligned with that family's
    subjects. A column is computed at the first rule that asks and shared by the others;
    GPU columns are one ``map`` over the non-lost GPUs, in C. See :func:`frame_of`.
    """

    __slots__ = ("_columns", "_gpus", "_subjects", "report")

    def __init__(self, report: Report) -> None:
        self.report = report
        self._gpus: tuple[GpuReport, ...] | None = None
        self._subjects: dict[str, tuple[Subject, ...]] = {}
        self._columns: dict[str, tuple[float | None, ...]] = {}

    def gpus(self) -> tuple[GpuReport, ...]:
        """The GPUs that are not lost, in report order."""
        gpus = self._gpus
        if gpus is None:
            gpus = self._gpus = tuple(g for g in self.report.gpus if not g.lost)
        return gpus

    def subjects(self, family: str) -> tuple[Subject, ...]:
        """The subjects of ``family``'s values, aligned with its columns."""
        found = self._subjects.get(family)
        if found is None:
            if family == "gpu":
                subjects = _GPU_SUBJECTS
                found = tuple([subjects[g.index] for g in self.gpus()])
            elif family == "infiniband":
                found = tuple([ib_subject(p.device, p.port) for p in self.report.infiniband])
            elif family == "host":
                found = () if self.report.host is None else (NODE,)
            else:
                found = tuple([net_subject(n.device) for n in self.report.network])
            self._subjects[family] = found
        return found

    def column(self, metric: str, compute: Callable[[Frame], tuple[float | None, ...]]
               ) -> tuple[float | None, ...]:
        """``metric``'s raw values (``compute`` reads them the first time)."""
        found = self._columns.get(metric)
        if found is None:
            found = self._columns[metric] = compute(self)
        return found

    def gpu_columns(self, fields: Sequence[str], get: Callable[[GpuReport], Any]
                    ) -> list[tuple[Any, ...]]:
        """The columns of several GPU fields at once: ``get`` is ``attrgetter(*fields)``.

        One pass over the GPUs (in C), for as many fields as there are; each column is
        kept as :meth:`column` would keep ``gpu_<field>``'s, so rules that read one of
        them later share it.
        """
        gpus = self.gpus()
        columns: list[tuple[Any, ...]]
        if len(fields) == 1:
            columns = [tuple(map(get, gpus))]
        elif gpus:
            columns = list(zip(*map(get, gpus), strict=True))
        else:
            columns = [()] * len(fields)
        cache = self._columns
        for name, values in zip(fields, columns, strict=True):
            cache["gpu_" + name] = values
        return columns


_last_frame: tuple[Report, Frame] | None = None


def frame_of(report: Report) -> Frame:
    """The :class:`Frame` of ``report``, shared by every rule that reads it in turn.

    One frame is kept (the latest report's): the engine applies all rules to one report
    before the next, so each report is read once, not once per rule.
    """
    global _last_frame
    last = _last_frame
    if last is not None and last[0] is report:
        return last[1]
    frame = Frame(report)
    _last_frame = (report, frame)
    return frame


Column = tuple[tuple[Subject, ...], tuple[float | None, ...]]
"""(subjects, raw values) of one metric in one report; a value may be None (missing)."""
Reader = Callable[[Frame], Column]


def compile_reader(metric: str, labels: Mapping[str, str] | None = None) -> Reader:
    """Like :func:`compile_accessor`, but reading a shared :class:`Frame`, in columns.

    The values come as they are (not converted to float, None where missing), so that a
    rule can judge a whole column at once. Lost GPUs are left out, as are subjects that
    ``labels`` rejects.
    """
    family = metric_family(metric)
    accept = _subject_filter(labels or {})
    compute = compile_column(metric)

    if accept is None:
        def read(frame: Frame) -> Column:
            return frame.subjects(family), frame.column(metric, compute)
        return read

    def read_some(frame: Frame) -> Column:
        subjects = frame.subjects(family)
        values = frame.column(metric, compute)
        keep = [i for i, s in enumerate(subjects) if accept(s)]
        if len(keep) == len(subjects):
            return subjects, values
        return tuple([subjects[i] for i in keep]), tuple([values[i] for i in keep])
    return read_some


def compile_column(metric: str) -> Callable[[Frame], tuple[float | None, ...]]:
    """What computes ``metric``'s column of a :class:`Frame` (see :meth:`Frame.column`).

    Every subject of the metric's family, in report order: raw values, None where missing.
    """
    family = metric_family(metric)
    compute: Callable[[Frame], tuple[float | None, ...]]
    if family == "gpu":
        name = metric[4:]
        get = DERIVED_GPU_METRICS.get(name) or attrgetter(name)

        def compute(frame: Frame) -> tuple[float | None, ...]:
            return tuple(map(get, frame.gpus()))
    elif family == "infiniband":
        stem = metric[16:]
        bare = stem[:-6] if stem.endswith("_total") else stem

        def compute(frame: Frame) -> tuple[float | None, ...]:
            ports = frame.report.infiniband
            if stem == "state":
                return tuple([p.state for p in ports])
            if bare is stem:
                return tuple([p.counters.get(stem) for p in ports])
            return tuple([c if (c := p.counters.get(stem)) is not None
                          else p.counters.get(bare) for p in ports])
    elif family == "host":
        get_host = attrgetter(metric[5:])

        def compute(frame: Frame) -> tuple[float | None, ...]:
            host = frame.report.host
            return () if host is None else (get_host(host),)
    else:
        get_net = attrgetter(metric[8:])

        def compute(frame: Frame) -> tuple[float | None, ...]:
            return tuple(map(get_net, frame.report.network))
    return compute


def describe(metric: str) -> tuple[str, str]:
    """A metric's words and unit for messages: ``gpu_temperature_celsius`` -> (temperature, °C)."""
    for prefix in ("gpu_", "infiniband_port_", "network_", "host_"):
        if metric.startswith(prefix):
            metric = metric[len(prefix):]
            break
    for suffix, unit in _UNITS:
        if metric.endswith(suffix):
            return metric[: -len(suffix)].replace("_", " "), unit
    return metric.replace("_", " "), ""


_UNITS = (("_celsius", "°C"), ("_watts", "W"), ("_bytes", "B"), ("_hertz", "Hz"),
          ("_ratio", ""), ("_total", ""))


#: What a trimmed report's GPUs carry whatever the metrics kept: whose workloads hold
#: each GPU and its energy counter (the controller's workload accounting reads them).
ACCOUNTED_GPU_FIELDS: Final = frozenset({"workloads", "energy_joules_total"})


class Trim:
    """Cut a report down to the values of some metrics (what the controller's rules read).

    An agent that evaluates its node-local rules itself sends the controller only what
    the rules left there need (a peers rule's utilization): a GPU keeps its index, its
    ``lost`` flag, its workloads and energy counter (what the controller's workload
    accounting reads besides metrics, :mod:`sn_monitor.controller.workloads`) and the
    fields those metrics read (both parts of a derived one); a
    port or interface keeps its name and the counters or fields read, and is left out
    when none is; the host part likewise. Everything else in the report (labels, events,
    command results) stays.
    """

    def __init__(self, metrics: Sequence[str]) -> None:
        gpu: set[str] = set()
        ib: set[str] = set()
        net: set[str] = set()
        host: set[str] = set()
        for metric in metrics:
            family = metric_family(metric)
            if family == "gpu":
                parts = DERIVED_GPU_PARTS.get(metric[4:])
                gpu.update(parts[1:] if parts is not None else (metric[4:],))
            elif family == "infiniband":
                stem = metric[16:]
                ib.update((stem, stem[:-6]) if stem.endswith("_total") else (stem,))
            elif family == "host":
                host.add(metric[5:])
            else:
                net.add(metric[8:])
        if "sm_clock_hertz" in gpu:
            gpu.add("throttle_reasons")  # what a clock below its max means
        self.metrics = tuple(sorted(set(metrics)))
        self._gpu = tuple(sorted(gpu | ACCOUNTED_GPU_FIELDS)) if gpu else ()
        self._ib_state = "state" in ib
        self._ib_rate = "rate_bytes_per_second" in ib
        self._ib = frozenset(ib - {"state", "rate_bytes_per_second"})
        self._net = tuple(sorted(net))
        self._host = tuple(sorted(host))

    def __call__(self, report: Report) -> Report:
        return msgspec.structs.replace(report, gpus=self._gpus(report),
                                       infiniband=self._ports(report),
                                       network=self._nets(report), host=self._host_part(report))

    def _gpus(self, report: Report) -> list[GpuReport]:
        """Every GPU, with its index, its ``lost`` flag and the fields read (none: no GPU)."""
        if not self._gpu:
            return []
        return [GpuReport(index=g.index, lost=g.lost,
                          **{name: getattr(g, name) for name in self._gpu})
                for g in report.gpus]

    def _ports(self, report: Report) -> list[IbPortReport]:
        """The ports with a counter, state or rate read, each with those only."""
        ports: list[IbPortReport] = []
        if not (self._ib or self._ib_state or self._ib_rate):
            return ports
        for port in report.infiniband:
            counters = {k: v for k, v in port.counters.items() if k in self._ib}
            state = port.state if self._ib_state else None
            rate = port.rate_bytes_per_second if self._ib_rate else None
            if counters or state is not None or rate is not None:
                ports.append(IbPortReport(device=port.device, port=port.port,
                                          state=state, rate_bytes_per_second=rate,
                                          counters=counters))
        return ports

    def _nets(self, report: Report) -> list[NetReport]:
        """The interfaces with a field read, each with those only."""
        nets: list[NetReport] = []
        for net in report.network if self._net else ():
            values = {name: getattr(net, name) for name in self._net}
            if any(v is not None for v in values.values()):
                nets.append(NetReport(device=net.device, **values))
        return nets

    def _host_part(self, report: Report) -> HostReport | None:
        """The host's fields read, or None where none is (or none is read)."""
        if not self._host or report.host is None:
            return None
        values = {name: getattr(report.host, name) for name in self._host}
        if any(v is not None for v in values.values()):
            return HostReport(**values)
        return None
