"""Wire types shared by the agent and the controller.

An :class:`Event` is something that happened (an XID, a GPU falling off the bus), as
opposed to a sampled value. Events are counted by the agent, reported to the controller
and never dropped, only retried.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import msgspec

#: ``collector_stuck``: one of the agent's collectors has not returned by its deadline (a
#: driver call that hangs); the agent itself is alive and goes on without it.
#: ``log``: a failure recognised in a training job's log (source ``joblog``,
#: :mod:`sn_monitor.joblog`); the controller orders them into the job's root cause.
EventKind = Literal[
    "xid", "sxid", "gpu_lost", "gpu_fallen_off_bus", "link_down", "guard", "collector_stuck",
    "log",
]
EventSource = Literal["nvml", "kmsg", "agent", "joblog"]
#: What a rule may ask the controller to do (the rule files' ``actions``).
ActionName = Literal[
    "alert", "throttle", "release", "cordon", "uncordon", "evict",
    "checkpoint", "restore", "failover", "reset_gpu", "reboot", "verify",
]


@dataclass(frozen=True, slots=True)
class JobLogFinding:
    """What a ``log`` event says beyond its line: a failure recognised in a job's log.

    The fields of :class:`sn_monitor.joblog.model.Finding` the controller orders by, and
    the job and rank the agent knows the log by (see :class:`EventRecord`).
    """

    category: str
    severity: Literal["critical", "error", "warning", "info"]
    root_candidate: bool
    file: str
    line: int
    job: str | None = None
    rank: int | None = None
    signature: str = ""
    line_time_seconds: float | None = None
    params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Event:
    """One fault event seen on a node.

    ``gpu`` is the NVML index once the PCI address has been mapped to a GPU, else None.
    ``time_seconds`` is wall time when the agent saw it; ``kernel_time_seconds`` the
    kernel's own timestamp where the source has one (seconds since boot for /dev/kmsg).
    """

    kind: EventKind
    source: EventSource
    time_seconds: float
    message: str
    gpu: int | None = None
    pci_bus_id: str | None = None
    code: int | None = None
    device: str | None = None
    kernel_time_seconds: float | None = None
    #: A ``log`` event's finding (None for every other kind).
    finding: JobLogFinding | None = None


# --------------------------------------------------------------------------- the wire
#
# Agent -> controller: ``POST /api/v1/reports`` with a JSON :class:`Report`; the reply is
# a :class:`ReportReply` carrying commands. The structs are msgspec's, so the controller
# decodes and validates thousands of reports a second, and a bad report is refused with
# a message that names the field (``Expected `float`, got `str` - at `$.gpus[0].power_watts```).
# Limits on sizes are part of the contract: a report can never make the controller
# allocate without bound. The structs hold no reference cycles, so they are kept out of
# the cyclic garbage collector (gc=False): with thousands of nodes' latest reports in
# memory, full collections would otherwise stall ingest for hundreds of milliseconds.

#
# Numbers are bounded too, so that nothing a report holds can break the arithmetic behind
# it: JSON has no NaN or Infinity and a float beyond the double range (``1e999``) is
# refused by the decoder itself; measured values are within +-1e18 (no rate, variance or
# ratio of them overflows); integers fit 64 bits signed (SQLite's INTEGER; a bigger one
# would fail there or in ``float()``). Timestamps may be any finite number: the controller
# maps them onto its own clock (:func:`sn_monitor.controller.ingest.controller_times`, and
# for progress :func:`sn_monitor.controller.jobs.progress.on_controller_clock`). Names are
# whole strings: a pattern that ``$`` ends also takes a final newline (:data:`NodeName`).

INT64_MAX = 2**63 - 1
MEASURE_MAX = 1e18

NODE_NAME_MAX_LENGTH: Final = 253
NODE_NAME_CHARACTERS: Final = "A-Za-z0-9._-"
"""What a node name is made of (a regex character class's body): a hostname's characters."""
NODE_NAME_PATTERN: Final = rf"^[A-Za-z0-9][{NODE_NAME_CHARACTERS}]*$(?!\n)"
"""A node name, the whole string. ``(?!\\n)``: Python's ``$`` (msgspec's ``re.search``)
also matches before a final newline, and ``"gpu-1\\n"`` would be a name that reaches labels
and logs; in JSON Schema's dialect (ECMA-262), where this pattern is published too, ``$``
is the end of the string and the lookahead changes nothing."""
_NODE_NAME: Final = re.compile(NODE_NAME_PATTERN)


def is_node_name(text: str) -> bool:
    """Whether ``text`` is a node name as a report carries it (:data:`NodeName`)."""
    return len(text) <= NODE_NAME_MAX_LENGTH and _NODE_NAME.match(text) is not None


NodeName = Annotated[str, msgspec.Meta(min_length=1, max_length=NODE_NAME_MAX_LENGTH,
                                       pattern=NODE_NAME_PATTERN)]
LabelValue = Annotated[str, msgspec.Meta(max_length=128)]
ShortText = Annotated[str, msgspec.Meta(max_length=4096)]
Counter = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
"""A hardware or kernel counter (at 10^9 a second, 292 years to reach the bound)."""
Int64 = Annotated[int, msgspec.Meta(ge=-INT64_MAX - 1, le=INT64_MAX)]
"""Any other integer (a port state, a link width, an XID code)."""
Id = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
"""A sequence number, an id or a step: 0 or more."""
Measure = Annotated[float, msgspec.Meta(ge=-MEASURE_MAX, le=MEASURE_MAX)]
"""A measured value (a temperature, a power, a clock)."""
Ratio = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]

MAX_GPUS = 64
MAX_PORTS = 64
MAX_EVENTS = 1000
MAX_LABELS = 16
MAX_COUNTERS = 128
"""InfiniBand counters a port may report."""
MAX_COUNTER_NAME = 64
"""Longest InfiniBand counter name."""


MAX_RANKS = 1 << 24
"""Ranks one job may have (a ``log`` event's ``rank`` is below it)."""
JobLogText = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
MAX_PARAMS = 8
"""Parameters one ``log`` event may carry."""


MAX_WORKLOADS = 16
"""Workloads one GPU may report (its own and its MIG instances')."""
WorkloadText = Annotated[str, msgspec.Meta(max_length=128)]


class GpuWorkloadReport(msgspec.Struct, frozen=True, omit_defaults=True,
                        forbid_unknown_fields=True, gc=False):
    """One workload on a GPU, or on one of its MIG instances (the agent's attribution).

    ``mig_instance``: the MIG device's UUID (None: the whole GPU); the rest are the
    workload's, None where no source says: ``pod``/``namespace``/``container``
    (Kubernetes), ``slurm_job``/``partition`` (Slurm), ``user``, ``workload_job`` (a
    Slurm job name, a pod's owning Job). The controller keys workloads by them
    (:mod:`sn_monitor.controller.workloads`).
    """

    mig_instance: WorkloadText | None = None
    pod: WorkloadText | None = None
    namespace: WorkloadText | None = None
    container: WorkloadText | None = None
    slurm_job: WorkloadText | None = None
    user: WorkloadText | None = None
    partition: WorkloadText | None = None
    workload_job: WorkloadText | None = None


class GpuReport(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                gc=False):
    """One GPU's latest values. Rules name them ``gpu_<field>`` (``gpu_temperature_celsius``).

    NVLink counters are summed over the GPU's links (``nvlinks_down`` counts links not
    up); ``throttle_reasons`` lists the active clock-event reasons.
    """

    index: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS)]
    uuid: Annotated[str, msgspec.Meta(max_length=96)] = ""
    lost: bool = False
    utilization_ratio: Ratio | None = None
    memory_bandwidth_utilization_ratio: Ratio | None = None
    memory_used_bytes: Counter | None = None
    memory_total_bytes: Counter | None = None
    temperature_celsius: Measure | None = None
    memory_temperature_celsius: Measure | None = None
    slowdown_temperature_celsius: Measure | None = None
    shutdown_temperature_celsius: Measure | None = None
    memory_max_temperature_celsius: Measure | None = None
    power_watts: Measure | None = None
    power_limit_watts: Measure | None = None
    power_default_limit_watts: Measure | None = None
    sm_clock_hertz: Measure | None = None
    sm_max_clock_hertz: Measure | None = None
    throttle_reasons: Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]],
                                msgspec.Meta(max_length=32)] = []
    ecc_corrected_errors_total: Counter | None = None
    ecc_uncorrected_errors_total: Counter | None = None
    remapped_rows_correctable: Counter | None = None
    remapped_rows_uncorrectable: Counter | None = None
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    pcie_replays_total: Counter | None = None
    pcie_link_generation: Int64 | None = None
    pcie_link_generation_max: Int64 | None = None
    pcie_link_width: Int64 | None = None
    pcie_link_width_max: Int64 | None = None
    nvlink_crc_errors_total: Counter | None = None
    nvlink_replay_errors_total: Counter | None = None
    nvlink_recovery_errors_total: Counter | None = None
    nvlinks_down: Counter | None = None
    #: NVLink data sent and received over all the GPU's links (NVML's
    #: ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``, which count KiB; here in bytes).
    nvlink_transmitted_bytes_total: Counter | None = None
    nvlink_received_bytes_total: Counter | None = None
    guard_throttled: bool = False
    #: NVML's fabric state (1 not started, 2 in progress, 3 completed) and, once
    #: completed, its NVML return code (0 success); absent where the GPU has no fabric.
    fabric_state: Int64 | None = None
    fabric_status: Int64 | None = None
    #: Compute processes using the GPU now (absent where NVML cannot list them).
    processes: Counter | None = None
    #: Energy the GPU used since the driver loaded (NVML's total energy consumption).
    energy_joules_total: Annotated[float, msgspec.Meta(ge=0.0, le=MEASURE_MAX)] | None = None
    #: Whose workloads hold the GPU (empty for a GPU nobody holds: left off the wire).
    #: A controller from before attribution refuses a report that carries some:
    #: controllers are upgraded before agents.
    workloads: Annotated[list[GpuWorkloadReport], msgspec.Meta(max_length=MAX_WORKLOADS)] = []


class HostReport(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                 gc=False):
    """The node's own values, not a GPU's, port's or interface's.

    Rules name them ``host_<field>``.
    """

    processes_stuck: Counter | None = None


class IbPortReport(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                gc=False):
    """One InfiniBand / RoCE port. Rules name values ``infiniband_port_<stem>``."""

    device: Annotated[str, msgspec.Meta(max_length=64)]
    port: Annotated[int, msgspec.Meta(ge=0, le=255)]
    state: Int64 | None = None
    #: The link's current rate (the ``rate`` file: a link may train again slower).
    rate_bytes_per_second: Measure | None = None
    # The names' bound (MAX_COUNTER_NAME) is in the schema, and the controller's decoder
    # refuses a longer name (sn_monitor.controller.ingest.decode_report) with the message
    # msgspec gives for it; it is not in the annotation because msgspec shares decoded
    # dict keys (a cache) only for plain ``str`` keys. A report carries ~240 counters,
    # and decoding and freeing them costs the controller a third less that way.
    counters: Annotated[dict[str, Counter], msgspec.Meta(
        max_length=MAX_COUNTERS,
        extra_json_schema={"propertyNames": {"maxLength": MAX_COUNTER_NAME}})] = {}


class NetReport(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                gc=False):
    """One network interface. Rules name values ``network_<field>``."""

    device: Annotated[str, msgspec.Meta(max_length=64)]
    carrier_up: bool | None = None
    carrier_changes_total: Counter | None = None
    receive_errors_total: Counter | None = None
    transmit_errors_total: Counter | None = None
    receive_drops_total: Counter | None = None
    transmit_drops_total: Counter | None = None


class EventRecord(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                gc=False):
    """An :class:`Event` on the wire, numbered by the agent so delivery can be acknowledged."""

    id: Id
    kind: EventKind
    source: EventSource
    time_seconds: float
    message: ShortText = ""
    gpu: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS)] | None = None
    pci_bus_id: Annotated[str, msgspec.Meta(max_length=32)] | None = None
    code: Int64 | None = None
    device: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    # A ``log`` event's finding (:class:`sn_monitor.joblog.model.Finding`); the line
    # itself is ``message``, ``time_seconds`` when the agent read it. Controllers are
    # upgraded first: an older one refuses a report with these fields (unknown fields),
    # and an agent leaves them out (omit_defaults) for every other kind.
    #: The job the log belongs to (None: the controller takes the job on the node).
    job: JobLogText | None = None
    #: One of :data:`sn_monitor.joblog.model.CATEGORIES` (or a catalogue's own).
    category: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    severity: Literal["critical", "error", "warning", "info"] | None = None
    rank: Annotated[int, msgspec.Meta(ge=0, lt=MAX_RANKS)] | None = None
    #: The line points at the rank that printed it (not the cascade of another's failure).
    root_candidate: bool | None = None
    #: The log file (or stream) and the 1-based line number of the line.
    file: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    line: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)] | None = None
    #: The catalogue entry that matched.
    signature: JobLogText | None = None
    #: The line's own time stamp (agent clock, seconds since the epoch), where it has one.
    line_time_seconds: Measure | None = None
    #: What the signature read from the line (an exit code, a collective's sequence number).
    params: Annotated[dict[Annotated[str, msgspec.Meta(max_length=32)], LabelValue],
                      msgspec.Meta(max_length=MAX_PARAMS)] = {}


CommandKind = Literal["throttle", "release", "checkpoint", "reset_gpu", "reboot", "verify"]


class Command(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                gc=False):
    """An order for an agent, carried in the reply to its report.

    ``throttle`` caps power: ``power_watts``, or ``power_fraction`` of the GPU's default
    limit; ``release`` restores the operator's limit. ``gpu`` None means every GPU.

    The remediation ladder's steps: ``reset_gpu`` resets one GPU (``gpu`` required; refused
    while a process uses it), ``reboot`` reboots the node, ``verify`` runs the node's
    return-to-service checks (:mod:`sn_monitor.agent.verify`) and answers with
    :attr:`CommandResult.checks`. Each is a dry run unless the agent's
    ``remediation.mode`` is ``enforce``; their results come one report or more later
    (they run off the report thread).
    """

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    kind: CommandKind
    gpu: int | None = None
    power_watts: float | None = None
    power_fraction: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    reason: ShortText = ""


MAX_CHECKS = 64
"""Checks one verification may report (:attr:`CommandResult.checks`)."""


class CheckResult(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                  gc=False):
    """One check of a node verification: ``gpus-present``, ``pcie-links``, ``dcgm-diag``...

    ``skipped``: the check could not apply here (no dcgmi, no NVLink); it does not fail
    the verification, and ``detail`` says why.
    """

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    ok: bool
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    skipped: bool = False


class CommandResult(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                gc=False):
    """What the agent did with a command.

    ``checks``: a ``verify`` command's checks, each with why it passed or failed (empty
    for every other kind, and then left off the wire: a controller from before
    verification decodes these results unchanged).
    """

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    ok: bool
    time_seconds: float
    message: ShortText = ""
    dry_run: bool = False
    checks: Annotated[list[CheckResult], msgspec.Meta(max_length=MAX_CHECKS)] = []


MAX_FINDINGS = 512
RulesVersion = Annotated[str, msgspec.Meta(max_length=64)]


class EdgeFinding(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                  gc=False):
    """A node-local rule firing on the agent that evaluated it (see :class:`Report`).

    ``observed_seconds``: the agent's wall time when it first saw the condition.
    """

    rule: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    observed_seconds: float
    subject: Annotated[str, msgspec.Meta(max_length=160)] = ""
    gpu: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS)] | None = None
    value: Measure | None = None
    message: Annotated[str, msgspec.Meta(max_length=1024)] = ""


# --------------------------------------------------------------------------- topology
#
# What a node is made of and how it is wired, sent with a report once and on change
# (:attr:`Report.topology`): every report carries ``topology_digest``, the agent sends
# the whole topology when it changed since it last sent it or when the controller's
# reply asks for it (:attr:`ReportReply.topology_wanted`: the controller has none for
# that digest, after its own restart for one).

MAX_NICS = 32
MAX_NVLINK_PEERS = 64
GpuAffinity = Literal["PIX", "PXB", "PHB", "NODE", "SYS"]
"""How close a GPU and a NIC are on PCIe, as ``nvidia-smi topo -m`` says it: one PCIe
switch between them (PIX), several (PXB), the same host bridge (PHB), the same NUMA node
(NODE), across the CPUs' interconnect (SYS)."""
NvLinkPeerKind = Literal["gpu", "switch", "cpu", "unknown"]
NicRole = Literal["rail", "storage", "other"]


class NvLinkPeer(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                 gc=False):
    """Where some of a GPU's NVLinks go: ``links`` links up to one remote device.

    ``kind`` ``gpu``: ``gpu`` is the peer's index on the node; ``switch``: an NVSwitch
    (``pci_bus_id`` its address), through which the GPU reaches every GPU on the same
    switches.
    """

    kind: NvLinkPeerKind
    links: Annotated[int, msgspec.Meta(ge=0, le=64)]
    pci_bus_id: Annotated[str, msgspec.Meta(max_length=32)] = ""
    gpu: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS)] | None = None


class GpuTopology(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                  gc=False):
    """One GPU's place on the node: NUMA node, NVLink peers, PCIe distance to each NIC."""

    index: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS)]
    uuid: Annotated[str, msgspec.Meta(max_length=96)] = ""
    pci_bus_id: Annotated[str, msgspec.Meta(max_length=32)] = ""
    numa_node: Annotated[int, msgspec.Meta(ge=-1, le=1024)] | None = None
    nvlinks: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0
    peers: Annotated[list[NvLinkPeer], msgspec.Meta(max_length=MAX_NVLINK_PEERS)] = []
    #: NIC device (``mlx5_0``) -> affinity; a NIC whose distance is unknown is left out.
    nics: Annotated[dict[Annotated[str, msgspec.Meta(max_length=64)], GpuAffinity],
                    msgspec.Meta(max_length=MAX_NICS)] = {}


class NicPortTopology(msgspec.Struct, frozen=True, omit_defaults=True,
                      forbid_unknown_fields=True, gc=False):
    """One port of a NIC: its GUID, link layer (``InfiniBand``/``Ethernet``) and rate."""

    port: Annotated[int, msgspec.Meta(ge=0, le=255)]
    guid: Annotated[str, msgspec.Meta(max_length=64)] = ""
    link_layer: Annotated[str, msgspec.Meta(max_length=32)] = ""
    rate_bytes_per_second: Measure | None = None


class NicTopology(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                  gc=False):
    """One RDMA NIC (``/sys/class/infiniband/<device>``).

    ``role`` ``rail``: a compute NIC next to a GPU, serving rail ``rail`` (NIC *i* of every
    node of a rail-optimised fabric is on leaf switch *i*); ``storage``: a NIC no GPU is
    close to (storage, in-band management).
    """

    device: Annotated[str, msgspec.Meta(max_length=64)]
    pci_bus_id: Annotated[str, msgspec.Meta(max_length=32)] = ""
    numa_node: Annotated[int, msgspec.Meta(ge=-1, le=1024)] | None = None
    netdev: Annotated[str, msgspec.Meta(max_length=64)] = ""
    role: NicRole = "other"
    rail: Annotated[int, msgspec.Meta(ge=0, le=255)] | None = None
    ports: Annotated[list[NicPortTopology], msgspec.Meta(max_length=16)] = []


class NodeTopology(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                   gc=False):
    """A node's GPUs, NVSwitches and NICs and how they connect.

    Its rack and supernode are the report's labels.
    """

    gpus: Annotated[list[GpuTopology], msgspec.Meta(max_length=MAX_GPUS)] = []
    nics: Annotated[list[NicTopology], msgspec.Meta(max_length=MAX_NICS)] = []
    nvswitches: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0


TopologyDigest = Annotated[str, msgspec.Meta(max_length=64)]


def topology_digest(topology: NodeTopology) -> str:
    """What :attr:`Report.topology_digest` carries: 16 hex digits of the topology's hash."""
    return hashlib.sha256(msgspec.json.encode(topology, order="sorted")).hexdigest()[:16]


class Report(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True,
                gc=False):
    """What an agent sends after each sample.

    ``instance`` is random per agent start: with ``sequence`` it tells a restarted agent
    (sequence back at 1) from a replayed or reordered report.

    ``rules_version`` set: the agent evaluated the controller's node-local rules of that
    version (:class:`EdgeRules`) on this sample itself; ``findings`` lists every one of
    them firing now, and the values carry only what the controller's own rules read.
    Empty (an agent before edge rules, or one that has not got them yet): the controller
    evaluates every rule on the full report. ``takes_rules``: the agent can evaluate
    rules (the controller offers them in its reply).

    ``events_only``: a report sent the moment a fault event happened (an XID, a GPU
    fallen off the bus), between two samples: it carries events and no sample, so its
    values lists are empty and the controller keeps the node's last ones, judges only its
    event rules on it, and does not count it as a sample (it is no heartbeat). It shares
    ``sequence`` with the sampled reports; its ``sample_time_seconds`` is the time it was
    sent, on the agent's clock.
    """

    node: NodeName
    instance: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    sequence: Id
    sample_time_seconds: float
    agent_version: Annotated[str, msgspec.Meta(max_length=64)] = ""
    interval_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 1.0
    metrics_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None
    labels: Annotated[dict[Annotated[str, msgspec.Meta(max_length=64)], LabelValue],
                      msgspec.Meta(max_length=MAX_LABELS)] = {}
    gpus: Annotated[list[GpuReport], msgspec.Meta(max_length=MAX_GPUS)] = []
    infiniband: Annotated[list[IbPortReport], msgspec.Meta(max_length=MAX_PORTS)] = []
    network: Annotated[list[NetReport], msgspec.Meta(max_length=MAX_PORTS)] = []
    host: HostReport | None = None
    events: Annotated[list[EventRecord], msgspec.Meta(max_length=MAX_EVENTS)] = []
    command_results: Annotated[list[CommandResult], msgspec.Meta(max_length=MAX_EVENTS)] = []
    rules_version: RulesVersion = ""
    findings: Annotated[list[EdgeFinding], msgspec.Meta(max_length=MAX_FINDINGS)] = []
    takes_rules: bool = False
    topology_digest: TopologyDigest = ""
    topology: NodeTopology | None = None
    events_only: bool = False


class EdgeRules(msgspec.Struct, frozen=True, gc=False):
    """The node-local rules an agent is to evaluate, as rule file items, and their version.

    ``keep``: the metrics the controller's own rules read, which trimmed reports carry
    once every ``keep_every`` seconds (0: in every report); a trimmed report without
    values leaves the controller with the ones before.
    """

    version: RulesVersion
    rules: list[dict[str, Any]]
    keep: list[str] = []
    keep_every: float = 0.0


class ReportReply(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """The controller's answer: which events it has stored, and commands to run.

    ``edge_rules``: present when the report's agent takes rules and its
    ``rules_version`` is not the one the controller wants that node to evaluate.
    """

    sequence: int
    events_stored_through: int = -1
    commands: list[Command] = []
    edge_rules: EdgeRules | None = None
    #: The node whose report this answers (a stream carries several nodes' reports).
    node: str = ""
    #: The controller has no topology for the report's ``topology_digest``: send it.
    topology_wanted: bool = False


class StreamReply(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """An answer on the reports' stream (:mod:`sn_monitor.report_stream`).

    ``status``: what ``POST /api/v1/reports`` would have answered the report ``node`` /
    ``sequence`` (both left out when its JSON could not be read); ``reply`` when it was
    accepted, ``error`` (and ``retry_after``, seconds, for a 503) when not. ``accepted``:
    the reports the stream accepted since the answer before, this one included.
    """

    status: int = 200
    accepted: int = 0
    node: str = ""
    sequence: int = -1
    reply: ReportReply | None = None
    error: str = ""
    retry_after: float | None = None


# --------------------------------------------------------------------------- training jobs
#
# What sn_monitor.client sends (it builds the JSON itself: it depends on requests only).


class ProgressUpdate(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One step a rank reached, at the rank's wall time."""

    step: Id
    time: float


class ProgressBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """``POST /api/v1/jobs/{job}/progress`` from one rank."""

    rank: Annotated[int, msgspec.Meta(ge=0, lt=1 << 20)]
    node: NodeName
    world_size: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
    updates: Annotated[list[ProgressUpdate], msgspec.Meta(max_length=256)] = []
    step_time_seconds: Annotated[float, msgspec.Meta(gt=0)] | None = None


class CheckpointBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """``POST /api/v1/jobs/{job}/checkpoints``: a rank (normally 0) saved a checkpoint."""

    rank: Annotated[int, msgspec.Meta(ge=0, lt=1 << 20)]
    node: NodeName
    step: Id
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    #: How long training stood still for this checkpoint (the interval advisor's input).
    save_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] | None = None
