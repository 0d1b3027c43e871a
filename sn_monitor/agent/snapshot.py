"""Typed snapshots: what one sampling cycle saw.

Collectors return these; the exporter only formats them; the reporter serializes them.
Units are in the field names; ``None`` means the value is not available on this node
(not supported, file absent) and the series is left out, never exported as NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sn_monitor.model import Event


@dataclass(frozen=True, slots=True)
class NvLinkSample:
    """One NVLink of one GPU."""

    link: int
    up: bool | None = None
    crc_errors_total: int | None = None
    replay_errors_total: int | None = None
    recovery_errors_total: int | None = None


@dataclass(frozen=True, slots=True)
class NvLinkRemote:
    """Where one NVLink of a GPU goes (``nvmlDeviceGetNvLinkRemote*``).

    ``remote_kind`` is ``gpu``, ``switch``, ``cpu`` or ``unknown``; it and
    ``remote_pci_bus_id`` (canonical, ``0000:05:00.0``) are None for a link that is not up
    or where the driver does not tell. ``up`` is None where the link state is unknown.
    """

    link: int
    up: bool | None = None
    remote_kind: str | None = None
    remote_pci_bus_id: str | None = None


@dataclass(frozen=True, slots=True)
class GpuLinks:
    """One GPU's identity and NVLinks, as the topology collector needs them."""

    index: int
    uuid: str
    pci_bus_id: str
    links: tuple[NvLinkRemote, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One compute process using a GPU (``nvmlDeviceGetComputeRunningProcesses``).

    ``pid`` is in the host's PID namespace (NVML's); ``used_memory_bytes`` is None where
    the driver cannot tell (MIG without privileges). ``container_id`` and ``pod_uid``
    come from ``/proc/<pid>/cgroup`` (docker, containerd, CRI-O, podman, kubepods paths)
    and are None for a process outside a container, or one gone before it was read.
    ``command`` (argv[0]'s base name, else ``comm``) and ``user`` (the real uid's name,
    else the uid) come from ``/proc/<pid>/``; ``sm_utilization_ratio`` is the SM time the
    process used in NVML's latest sample for it (``nvmlDeviceGetProcessUtilization``),
    None where the driver has none (not supported, or no kernel since the last cycle).
    """

    pid: int
    used_memory_bytes: int | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    command: str | None = None
    user: str | None = None
    sm_utilization_ratio: float | None = None
    #: The scheduler's job the process runs in (Slurm), None outside one.
    slurm_job: str | None = None
    partition: str | None = None
    workload_job: str | None = None


@dataclass(frozen=True, slots=True)
class GpuWorkload:
    """One workload on a GPU, or on one of its MIG instances: whose job is there.

    From the allocation sources (the kubelet, Slurm) or, on a GPU no source claims,
    from the user of its processes. ``mig_instance`` names the MIG instance (None: the
    whole GPU); the other fields are the workload's, None where nobody says:
    ``pod``/``namespace``/``container`` (Kubernetes), ``slurm_job``/``partition``
    (Slurm), ``user``, ``workload_job`` (the job's name: a Slurm job name, a pod's
    owning Job or JobSet).
    """

    mig_instance: str | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    slurm_job: str | None = None
    user: str | None = None
    partition: str | None = None
    workload_job: str | None = None


@dataclass(frozen=True, slots=True)
class MigInstanceSample:
    """One MIG device (a compute instance in a GPU instance) of a MIG-enabled GPU.

    ``uuid`` is the MIG device's (``MIG-...``), the one the kubelet and
    ``CUDA_VISIBLE_DEVICES`` name; ``gpu_instance_id`` and ``compute_instance_id`` are
    NVML's ids, unique on the parent GPU. ``profile`` is the placement profile
    (``1g.10gb``, ``3g.40gb``...) read from the MIG device's NVML name, None where the
    name does not say. ``processes`` are the compute processes on this instance (None
    where NVML cannot list them). The activity ratios come from GPM per GPU instance
    (Hopper and later): the fraction of the instance's SMs busy and of its DRAM bandwidth
    used over the last sample interval; None where the GPU has no GPM, or on the first
    cycle that sees the instance.
    """

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    processes: tuple[GpuProcess, ...] | None = None
    sm_utilization_ratio: float | None = None
    memory_bandwidth_utilization_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU as NVML saw it in one cycle. A lost GPU keeps its identity, ``lost=True``."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str | None = None
    vbios_version: str | None = None
    driver_version: str | None = None
    #: The NVML minor number: ``/dev/nvidia<minor>``, what Slurm's gres and device
    #: cgroups name (the index is NVML's order, which need not be the same).
    minor_number: int | None = None
    lost: bool = False
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    memory_bandwidth_utilization_ratio: float | None = None
    #: Share of time the SMs ran tensor operations (GPM ANY_TENSOR_UTIL, Hopper+).
    tensor_active_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    slowdown_temperature_celsius: float | None = None
    shutdown_temperature_celsius: float | None = None
    gpu_max_temperature_celsius: float | None = None
    memory_max_temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    power_default_limit_watts: float | None = None
    power_min_limit_watts: float | None = None
    power_max_limit_watts: float | None = None
    energy_joules_total: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    sm_max_clock_hertz: float | None = None
    memory_max_clock_hertz: float | None = None
    throttle_reasons: tuple[tuple[str, bool], ...] | None = None
    ecc_corrected_errors_total: int | None = None
    ecc_uncorrected_errors_total: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    pcie_receive_bytes_per_second: float | None = None
    pcie_transmit_bytes_per_second: float | None = None
    pcie_replays_total: int | None = None
    pcie_link_generation: int | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    nvlinks: tuple[NvLinkSample, ...] = ()
    #: NVLink fabric (``nvmlDeviceGetGpuFabricInfo``): the NVML fabric state (1 not
    #: started, 2 in progress, 3 completed; a GPU without fabric support has None),
    #: the registration's NVML return code (only once completed: 0 success), the clique
    #: id and the cluster UUID. Fabric Manager (NVSwitch systems) or the IMEX / NVLink
    #: domain services (multi-node NVLink) set it up; until then NCCL cannot use NVLink.
    fabric_state: int | None = None
    fabric_status: int | None = None
    fabric_clique_id: int | None = None
    fabric_cluster_uuid: str | None = None
    #: Compute processes on the GPU; None when NVML cannot list them.
    processes: tuple[GpuProcess, ...] | None = None
    #: NVLink data sent and received over all the GPU's links since the driver loaded.
    nvlink_transmitted_bytes_total: int | None = None
    nvlink_received_bytes_total: int | None = None
    #: MIG mode now and after the next GPU reset (``nvmlDeviceGetMigMode``); None on a
    #: GPU without MIG. While it is on, NVML does not give the GPU's utilization (the
    #: field is None) and the work runs in :attr:`mig_instances`.
    mig_mode: bool | None = None
    mig_mode_pending: bool | None = None
    #: The MIG devices of a MIG-enabled GPU, by GPU and compute instance id.
    mig_instances: tuple[MigInstanceSample, ...] = ()
    #: Who uses the GPU (and its MIG instances), one entry per workload, sorted.
    workloads: tuple[GpuWorkload, ...] = ()


@dataclass(frozen=True, slots=True)
class NetDeviceSample:
    """One network interface from /proc/net/dev and /sys/class/net/<device>."""

    device: str
    receive_bytes_total: int
    receive_packets_total: int
    receive_errors_total: int
    receive_drops_total: int
    transmit_bytes_total: int
    transmit_packets_total: int
    transmit_errors_total: int
    transmit_drops_total: int
    carrier_up: bool | None = None
    carrier_changes_total: int | None = None
    speed_bytes_per_second: int | None = None
    mtu_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class IbPortSample:
    """One port of one InfiniBand / RoCE device from /sys/class/infiniband.

    ``counters`` holds cumulative counters under their metric stems (``received_bytes``,
    ``symbol_errors``, ``link_downed``, ``out_of_sequence`` ...), data already in bytes:
    the exporter turns a stem into ``sn_infiniband_port_<stem>_total``.
    """

    device: str
    port: int
    state: int | None = None
    phys_state: int | None = None
    rate_bytes_per_second: float | None = None
    link_layer: str | None = None
    counters: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MemoryBandwidthSample:
    """Bytes moved to and from memory by one resctrl monitoring domain (L3 cache id)."""

    domain: str
    bytes_total: int


@dataclass(frozen=True, slots=True)
class HostSample:
    """Host CPU and memory from /proc, memory bandwidth from resctrl where mounted."""

    cpu_seconds_total: tuple[tuple[str, float], ...] = ()
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    load1: float | None = None
    memory_bandwidth: tuple[MemoryBandwidthSample, ...] = ()


@dataclass(frozen=True, slots=True)
class StuckProcess:
    """A process seen in uninterruptible sleep (``D``) for longer than the threshold."""

    pid: int
    name: str
    stuck_seconds: float


@dataclass(frozen=True, slots=True)
class ProcessesSample:
    """What the ``processes`` collector saw in /proc/<pid>/stat.

    ``uninterruptible`` counts processes in ``D`` now (a moment in D is normal: disk I/O);
    ``stuck_count`` those in D since more than the threshold: a hung NFS or Lustre
    mount, a GPU driver call that never returns, a dying disk. They cannot be killed,
    and a job whose rank is one of them hangs. ``stuck`` lists the longest stuck (at
    most a few dozen).
    """

    total: int
    uninterruptible: int
    stuck_count: int = 0
    stuck: tuple[StuckProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Whether one workload-allocation source (``kubelet``, ``slurm``) answered this cycle."""

    name: str
    up: bool


@dataclass(frozen=True, slots=True)
class SourceStats:
    """One source's totals at one moment (see the module's drop reasons)."""

    source: str
    lines: int
    bytes: int
    dropped_bytes_rate: int
    dropped_bytes_too_long: int
    dropped_lines_queue: int
    dropped_lines_unparsed: int
    truncations: int
    rotations: int

    @property
    def dropped_bytes(self) -> int:
        """Bytes never handed on, every reason."""
        return self.dropped_bytes_rate + self.dropped_bytes_too_long

    @property
    def dropped_lines(self) -> int:
        """Lines read but never handed on, every reason."""
        return self.dropped_lines_queue + self.dropped_lines_unparsed


@dataclass(frozen=True, slots=True)
class JobLogStats:
    """What reading the job's logs did, for /metrics.

    Every source's totals, the files open, the lines queued, the reader thread's CPU time
    (reading and recognition), the findings and the ECS output's documents.
    """

    sources: tuple[SourceStats, ...]
    open_files: int
    queued_lines: int
    cpu_seconds: float
    #: Findings recognised, by category (recognition on: :mod:`sn_monitor.joblog`).
    findings: tuple[tuple[str, int], ...] = ()
    #: Template findings (``new``, ``burst``) of the jobs' template miners.
    template_findings: tuple[tuple[str, int], ...] = ()
    #: Findings dropped before they became events (the pending bound was full).
    findings_dropped: int = 0
    #: ECS documents written, dropped (queue full) and failed (disk), when an output is set.
    output_written: int = 0
    output_dropped: int = 0
    output_failed: int = 0

    def source(self, name: str) -> SourceStats | None:
        """The totals of source ``name``, or None."""
        return next((s for s in self.sources if s.source == name), None)


@dataclass(frozen=True, slots=True)
class Collected:
    """What one collector contributes to a cycle; the sampler merges them."""

    gpus: tuple[GpuSample, ...] = ()
    net: tuple[NetDeviceSample, ...] = ()
    infiniband: tuple[IbPortSample, ...] = ()
    host: HostSample | None = None
    processes: ProcessesSample | None = None
    events: tuple[Event, ...] = ()
    sources: tuple[SourceStatus, ...] = ()
    job_logs: JobLogStats | None = None


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """How one collector fared in one cycle.

    ``stuck``: its call has not returned by its deadline (never a success);
    ``duration_seconds`` is then how long the call has been running.
    """

    name: str
    success: bool
    duration_seconds: float
    stuck: bool = False


@dataclass(frozen=True, slots=True)
class XidCount:
    """How many times one XID code was seen on one GPU since the agent started.

    ``uuid`` is the GPU's as last seen ("" for an XID that names no known GPU), so a
    cycle in which NVML fails does not change the series' labels.
    """

    gpu: int | None
    xid: int
    count: int
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything one cycle saw on one node."""

    node: str
    timestamp_seconds: float
    gpus: tuple[GpuSample, ...] = ()
    net: tuple[NetDeviceSample, ...] = ()
    infiniband: tuple[IbPortSample, ...] = ()
    host: HostSample | None = None
    processes: ProcessesSample | None = None
    events: tuple[Event, ...] = ()
    xid_counts: tuple[XidCount, ...] = ()
    #: (GPU index, code of its latest XID) for each GPU with an XID since the agent started.
    last_xids: tuple[tuple[int, int], ...] = ()
    event_counts: tuple[tuple[str, int], ...] = ()
    collectors: tuple[CollectorStatus, ...] = field(default=())
    #: The workload-allocation sources the GPU collector asked this cycle.
    sources: tuple[SourceStatus, ...] = ()
    #: What reading the job's logs did (None: ``job_logs`` is off).
    job_logs: JobLogStats | None = None
