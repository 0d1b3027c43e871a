"""A :class:`NodeSnapshot` becomes the :class:`Report` the agent sends to the controller.

Pure functions, no I/O. The wire structs carry limits (ratios in 0..1, counters >= 0,
string lengths, list lengths) that the controller enforces when it decodes a report:
a report it refuses is a report lost, and with it the events riding on it. So values
are made to fit here (ratios clamped, negative counters left out, text truncated)
rather than trusted to be in range.

:func:`build_events_report` makes the other kind, the event-only report the fast path
sends the moment a fault happened: the events and who sends them, no sample.

The report is sent every second by every node, so it carries what the rules need and
no more: per-GPU values, the error-ish InfiniBand counters (see
:data:`IB_COUNTER_MARKERS`) and per-interface error counters. Byte and packet counters
stay on /metrics, where Prometheus scrapes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sn_monitor import __version__
from sn_monitor.agent.snapshot import (
    GpuSample,
    GpuWorkload,
    IbPortSample,
    NetDeviceSample,
    NodeSnapshot,
    ProcessesSample,
)
from sn_monitor.model import (
    INT64_MAX,
    MAX_EVENTS,
    MAX_GPUS,
    MAX_LABELS,
    MAX_PARAMS,
    MAX_PORTS,
    MAX_RANKS,
    MAX_WORKLOADS,
    MEASURE_MAX,
    CommandResult,
    Event,
    EventRecord,
    GpuReport,
    GpuWorkloadReport,
    HostReport,
    IbPortReport,
    JobLogFinding,
    NetReport,
    NodeTopology,
    Report,
)

#: An InfiniBand counter stem is reported when it contains one of these. They cover the
#: IB port counters (``symbol_errors``, ``link_downed``, ``link_error_recovery``,
#: ``transmit_discards``, ``local_link_integrity_errors``,
#: ``excessive_buffer_overrun_errors``, ``transmit_wait``) and the mlx5 ``hw_counters``
#: (``out_of_buffer``, ``out_of_sequence``, ``packet_seq_err``, ``local_ack_timeout_err``,
#: ``rnr_nak_retry_err``, ``np_cnp_sent``, ``rp_cnp_handled``, ``roce_adp_retrans``,
#: ``duplicate_request``, ``implied_nak_seq_err`` ...). Data and packet counters are
#: left out: they are most of a port's ~50 counters and no rule reads them from reports.
IB_COUNTER_MARKERS: tuple[str, ...] = (
    "err",
    "downed",
    "discard",
    "recovery",
    "drop",
    "out_of_",
    "retry",
    "retrans",
    "timeout",
    "cnp",
    "nak",
    "integrity",
    "overrun",
    "duplicate",
    "wait",
    "ecn",
)
#: Data counters reported too: the bottleneck finder reads each port's throughput.
IB_DATA_COUNTERS: frozenset[str] = frozenset({"transmitted_bytes", "received_bytes"})

_MAX_IB_COUNTERS = 128
#: A ``log`` event's bounds (:class:`~sn_monitor.model.EventRecord`): the category, the
#: job and signature, the file (its end is kept: the name says the rank), a parameter.
_MAX_LOG_NAME = 64
_MAX_LOG_TEXT = 128
_MAX_LOG_FILE = 1024
_MAX_PARAM_NAME = 32
_MAX_PARAM_VALUE = 128
_MAX_KEY = 64
_MAX_LABEL_VALUE = 128
_MAX_TEXT = 4096
_MAX_UUID = 96
_MAX_REASON = 64
_MAX_REASONS = 32
_MAX_BUS_ID = 32
_MAX_DEVICE = 64
_MAX_WORKLOAD_TEXT = 128


def is_reported_ib_counter(stem: str) -> bool:
    """Whether an InfiniBand counter stem goes into reports (see :data:`IB_COUNTER_MARKERS`)."""
    return stem in IB_DATA_COUNTERS or any(marker in stem for marker in IB_COUNTER_MARKERS)


def _ratio(value: float | None) -> float | None:
    return None if value is None else min(1.0, max(0.0, value))


def _count(value: int | None) -> int | None:
    """A counter as the wire takes it: an int from 0 to INT64_MAX, else left out.

    Out of range is a driver's sentinel (0xFFFF...), not a count: sent as it is, the
    controller would refuse the whole report (422) and the node would look lost.
    """
    return None if value is None or not 0 <= value <= INT64_MAX else int(value)


def _measure(value: float | None) -> float | None:
    """A measured value as the wire takes it: finite and within MEASURE_MAX, else left out."""
    if value is None or not math.isfinite(value) or abs(value) > MEASURE_MAX:
        return None
    return value


def _sum(values: Iterable[int | None]) -> int | None:
    """Sum of the known values; None when no link reported the counter."""
    known = [v for v in values if v is not None and 0 <= v <= INT64_MAX]
    return _count(sum(known)) if known else None


def gpu_report(sample: GpuSample, *, guard_throttled: bool = False) -> GpuReport:
    """One GPU's values for the controller; NVLink counters summed over the links."""
    links = sample.nvlinks
    reasons = [name[:_MAX_REASON] for name, active in (sample.throttle_reasons or ()) if active]
    return GpuReport(
        index=sample.index,
        uuid=sample.uuid[:_MAX_UUID],
        lost=sample.lost,
        utilization_ratio=_ratio(sample.utilization_ratio),
        memory_bandwidth_utilization_ratio=_ratio(sample.memory_bandwidth_utilization_ratio),
        memory_used_bytes=_count(sample.memory_used_bytes),
        memory_total_bytes=_count(sample.memory_total_bytes),
        temperature_celsius=_measure(sample.temperature_celsius),
        memory_temperature_celsius=_measure(sample.memory_temperature_celsius),
        slowdown_temperature_celsius=_measure(sample.slowdown_temperature_celsius),
        shutdown_temperature_celsius=_measure(sample.shutdown_temperature_celsius),
        memory_max_temperature_celsius=_measure(sample.memory_max_temperature_celsius),
        power_watts=_measure(sample.power_watts),
        power_limit_watts=_measure(sample.power_limit_watts),
        power_default_limit_watts=_measure(sample.power_default_limit_watts),
        sm_clock_hertz=_measure(sample.sm_clock_hertz),
        sm_max_clock_hertz=_measure(sample.sm_max_clock_hertz),
        throttle_reasons=reasons[:_MAX_REASONS],
        ecc_corrected_errors_total=_count(sample.ecc_corrected_errors_total),
        ecc_uncorrected_errors_total=_count(sample.ecc_uncorrected_errors_total),
        remapped_rows_correctable=_count(sample.remapped_rows_correctable),
        remapped_rows_uncorrectable=_count(sample.remapped_rows_uncorrectable),
        row_remap_pending=sample.row_remap_pending,
        row_remap_failed=sample.row_remap_failed,
        pcie_replays_total=_count(sample.pcie_replays_total),
        pcie_link_generation=sample.pcie_link_generation,
        pcie_link_generation_max=sample.pcie_link_generation_max,
        pcie_link_width=sample.pcie_link_width,
        pcie_link_width_max=sample.pcie_link_width_max,
        nvlink_crc_errors_total=_sum(link.crc_errors_total for link in links),
        nvlink_replay_errors_total=_sum(link.replay_errors_total for link in links),
        nvlink_recovery_errors_total=_sum(link.recovery_errors_total for link in links),
        nvlinks_down=sum(1 for link in links if link.up is False) if links else None,
        nvlink_transmitted_bytes_total=_count(sample.nvlink_transmitted_bytes_total),
        nvlink_received_bytes_total=_count(sample.nvlink_received_bytes_total),
        guard_throttled=guard_throttled,
        fabric_state=sample.fabric_state,
        fabric_status=sample.fabric_status,
        processes=None if sample.processes is None else len(sample.processes),
        energy_joules_total=_energy(sample.energy_joules_total),
        workloads=[workload_report(w) for w in sample.workloads[:MAX_WORKLOADS]],
    )


def _energy(value: float | None) -> float | None:
    """An energy counter as the wire takes it: finite, 0 to MEASURE_MAX, else left out."""
    return None if value is None or not 0.0 <= value <= MEASURE_MAX else value


def _text(value: str | None) -> str | None:
    return None if value is None else value[:_MAX_WORKLOAD_TEXT]


def workload_report(workload: GpuWorkload) -> GpuWorkloadReport:
    """One workload on a GPU, its names cut to the wire's bound."""
    return GpuWorkloadReport(
        mig_instance=_text(workload.mig_instance), pod=_text(workload.pod),
        namespace=_text(workload.namespace), container=_text(workload.container),
        slurm_job=_text(workload.slurm_job), user=_text(workload.user),
        partition=_text(workload.partition), workload_job=_text(workload.workload_job))


def host_report(processes: ProcessesSample | None) -> HostReport | None:
    """The node's own values; None when no collector gave any."""
    if processes is None:
        return None
    return HostReport(processes_stuck=_count(processes.stuck_count))


def ib_port_report(sample: IbPortSample) -> IbPortReport:
    """One port: its state and its error-ish counters only."""
    counters: dict[str, int] = {}
    for stem, value in sample.counters:
        if len(counters) >= _MAX_IB_COUNTERS:
            break
        if len(stem) <= _MAX_KEY and 0 <= value <= INT64_MAX and is_reported_ib_counter(stem):
            counters[stem] = int(value)
    return IbPortReport(
        device=sample.device[:_MAX_DEVICE],
        port=min(255, max(0, sample.port)),
        state=sample.state,
        rate_bytes_per_second=_measure(sample.rate_bytes_per_second),
        counters=counters,
    )


def net_report(sample: NetDeviceSample) -> NetReport:
    """One interface: carrier and error/drop counters (bytes stay on /metrics)."""
    return NetReport(
        device=sample.device[:_MAX_DEVICE],
        carrier_up=sample.carrier_up,
        carrier_changes_total=_count(sample.carrier_changes_total),
        receive_errors_total=_count(sample.receive_errors_total),
        transmit_errors_total=_count(sample.transmit_errors_total),
        receive_drops_total=_count(sample.receive_drops_total),
        transmit_drops_total=_count(sample.transmit_drops_total),
    )


def event_record(event: Event, event_id: int) -> EventRecord:
    """An :class:`Event` numbered for acknowledgement; fields cut to the wire's limits.

    The kernel's own timestamp is not carried: the wire has no field for it and the
    wall time the agent saw the event is what the controller orders by.
    """
    gpu = event.gpu if event.gpu is not None and 0 <= event.gpu < MAX_GPUS else None
    return EventRecord(
        id=event_id,
        kind=event.kind,
        source=event.source,
        time_seconds=event.time_seconds,
        message=event.message[:_MAX_TEXT],
        gpu=gpu,
        pci_bus_id=None if event.pci_bus_id is None else event.pci_bus_id[:_MAX_BUS_ID],
        code=event.code,
        device=None if event.device is None else event.device[:_MAX_DEVICE],
        **({} if event.finding is None else _finding_fields(event.finding)),
    )


def _finding_fields(finding: JobLogFinding) -> dict[str, Any]:
    """A ``log`` event's finding as :class:`EventRecord` fields, cut to the wire's limits.

    A field that cannot be cut to fit (an empty category or job) is left out rather than
    making the whole report invalid.
    """
    fields: dict[str, Any] = {
        "category": finding.category[:_MAX_LOG_NAME] or None,
        "severity": finding.severity,
        "root_candidate": finding.root_candidate,
        "file": finding.file[-_MAX_LOG_FILE:] or None,
        "line": max(1, min(finding.line, INT64_MAX)),
        "job": (finding.job or "")[:_MAX_LOG_TEXT] or None,
        "rank": finding.rank if finding.rank is not None and 0 <= finding.rank < MAX_RANKS
        else None,
        "signature": finding.signature[:_MAX_LOG_TEXT] or None,
        "line_time_seconds": _measure(finding.line_time_seconds),
        "params": {name[:_MAX_PARAM_NAME]: value[:_MAX_PARAM_VALUE]
                   for name, value in finding.params[:MAX_PARAMS] if name},
    }
    return {name: value for name, value in fields.items() if value is not None}


class EventNumberer:
    """Numbers events in memory, for a reporter run without a spool (tests, ``simulate``).

    The agent proper numbers events in :class:`~sn_monitor.agent.spool.EventSpool`, which
    persists the counter so ids keep increasing across restarts.
    """

    def __init__(self, first_id: int = 0) -> None:
        self._next = first_id

    def __call__(self, event: Event) -> EventRecord:
        record = event_record(event, self._next)
        self._next += 1
        return record


def _labels(labels: Mapping[str, str]) -> dict[str, str]:
    items = sorted(labels.items())[:MAX_LABELS]
    return {key[:_MAX_KEY]: value[:_MAX_LABEL_VALUE] for key, value in items}


def build_report(
    snapshot: NodeSnapshot,
    *,
    instance: str,
    sequence: int,
    labels: Mapping[str, str],
    interval: float,
    events: Sequence[EventRecord],
    command_results: Sequence[CommandResult],
    guard_throttled: set[int] | frozenset[int],
    agent_version: str = __version__,
    metrics_port: int | None = None,
    takes_rules: bool = False,
    topology_digest: str = "",
    topology: NodeTopology | None = None,
) -> Report:
    """The report for one cycle. ``events`` are already numbered (the spool's records).

    ``topology_digest`` is the digest of the node's latest topology, which rides along
    (``topology``) when the reporter decides so. Lists are cut to the wire's limits; the
    caller sends at most :data:`MAX_EVENTS` events and command results and keeps the rest
    for the next report.
    """
    return Report(
        node=snapshot.node,
        instance=instance,
        sequence=sequence,
        sample_time_seconds=snapshot.timestamp_seconds,
        agent_version=agent_version[:_MAX_KEY],
        interval_seconds=min(3600.0, interval),
        metrics_port=metrics_port,
        takes_rules=takes_rules,
        labels=_labels(labels),
        gpus=[
            gpu_report(g, guard_throttled=g.index in guard_throttled)
            for g in snapshot.gpus
            if 0 <= g.index < MAX_GPUS
        ],
        infiniband=[ib_port_report(p) for p in snapshot.infiniband[:MAX_PORTS]],
        network=[net_report(d) for d in snapshot.net[:MAX_PORTS]],
        host=host_report(snapshot.processes),
        events=list(events[:MAX_EVENTS]),
        command_results=list(command_results[:MAX_EVENTS]),
        topology_digest=topology_digest,
        topology=topology,
    )


def build_events_report(
    node: str,
    *,
    instance: str,
    sequence: int,
    time_seconds: float,
    labels: Mapping[str, str],
    interval: float,
    events: Sequence[EventRecord],
    agent_version: str = __version__,
    metrics_port: int | None = None,
) -> Report:
    """An event-only report (``events_only``): ``events`` (at least one) and no sample.

    ``time_seconds`` is when it is sent, on the agent's clock; ``sequence`` is shared
    with the sampled reports. No values, findings, topology or command results: the
    controller keeps the node's last values and judges only its event rules on it.
    """
    if not events:
        raise ValueError("an event-only report carries at least one event")
    return Report(
        node=node,
        instance=instance,
        sequence=sequence,
        sample_time_seconds=time_seconds,
        agent_version=agent_version[:_MAX_KEY],
        interval_seconds=min(3600.0, interval),
        metrics_port=metrics_port,
        labels=_labels(labels),
        events=list(events[:MAX_EVENTS]),
        events_only=True,
    )
