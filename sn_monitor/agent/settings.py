"""The agent's settings: grouped dataclasses with safe defaults, read by the one loader."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from sn_monitor.config import (
    Document,
    Duration,
    at_least_one,
    bind,
    fraction,
    listen_address,
    load_yaml,
    optional,
    positive,
    setting,
)
from sn_monitor.joblog.ecs_options import EcsOutputOptions
from sn_monitor.joblog.template_settings import TemplateSettings
from sn_monitor.tls import ca_bundle, check_key_pair, readable_file
from sn_monitor.transport import check_http_url


def _regex(value: str | None) -> None:
    if value is None:
        return
    try:
        re.compile(value)
    except re.error as err:
        raise ValueError(f"invalid regular expression {value!r}: {err}") from None


def _http_url(value: str | None) -> None:
    if value is not None:
        check_http_url(value)


def _http_urls(value: list[str] | None) -> None:
    """Each like ``url``, all of one scheme, none twice (a trailing ``/`` aside)."""
    if value is None:
        return
    if not value:
        raise ValueError("list at least one controller URL, or leave urls out")
    seen: set[str] = set()
    for index, url in enumerate(value):
        try:
            _http_url(url)
        except ValueError as err:
            raise ValueError(f"[{index}]: {err}") from None
        normal = url.rstrip("/")
        if normal in seen:
            raise ValueError(f"[{index}]: {url!r} is listed twice")
        seen.add(normal)
    schemes = sorted({url.partition("://")[0] for url in value})
    if len(schemes) > 1:
        raise ValueError(f"every URL must use one scheme, got {' and '.join(schemes)}: "
                         "ca_file, cert_file and key_file apply to all of them")


def _temperature(value: float) -> None:
    if not 20 <= value <= 120:
        raise ValueError(f"must be a GPU temperature between 20 and 120 °C, got {value}")


@dataclass(frozen=True)
class ControllerSettings:
    """Where the agent reports; no url (nor urls) means the agent only exports and guards.

    ``urls`` instead of ``url`` lists the controllers of a high-availability pair (bare
    metal, no Service in front): the agent reports to the one that last accepted a
    report, and moves to the next at once when that one is unreachable or answers as a
    standby (:mod:`sn_monitor.agent.reporter`).

    Over ``https://``: ``ca_file`` is the CA the controller's certificate must chain to
    (default: the system's), ``cert_file`` and ``key_file`` the agent's client
    certificate (mutual TLS; it names this node). Both files are read again for each
    new connection, so a renewed certificate needs no restart.
    """

    url: str | None = setting(default=None, check=_http_url)
    urls: list[str] | None = setting(default=None, check=_http_urls)
    token_file: str | None = None
    ca_file: str | None = setting(default=None, check=ca_bundle)
    cert_file: str | None = setting(default=None, check=readable_file)
    key_file: str | None = setting(default=None, check=readable_file)
    timeout: Duration = setting(default=Duration(2.0), check=positive)
    spool_max_bytes: int = setting(default=64 << 20, check=positive)

    def __post_init__(self) -> None:
        if self.url is not None and self.urls is not None:
            raise ValueError("give url (one controller) or urls (several), not both")
        try:  # the loader checked; settings built in code (flags) were not
            _http_url(self.url)
        except ValueError as err:
            raise ValueError(f"url: {err}") from None
        try:
            _http_urls(self.urls)
        except ValueError as err:
            raise ValueError(f"urls: {err}") from None
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give both cert_file and key_file, or neither")
        if self.cert_file is not None and self.key_file is not None:
            check_key_pair(self.cert_file, self.key_file)

    @property
    def controller_urls(self) -> tuple[str, ...]:
        """Every controller to report to, in order (empty: report to none)."""
        if self.urls is not None:
            return tuple(self.urls)
        return () if self.url is None else (self.url,)

    @property
    def client_cert(self) -> tuple[str, str] | None:
        """``(cert_file, key_file)`` for requests, or None."""
        if self.cert_file is None or self.key_file is None:
            return None
        return self.cert_file, self.key_file


@dataclass(frozen=True)
class PathSettings:
    """Roots of the kernel's file systems: tests and the simulator point them elsewhere."""

    procfs: str = "/proc"
    sysfs: str = "/sys"
    kmsg: str = "/dev/kmsg"


#: How long one collector's run may take before it counts as stuck (see
#: :mod:`sn_monitor.agent.watchdog`): far above a normal NVML sweep of eight GPUs (tens of
#: milliseconds, a second on a bad day), far below the agent's stop deadline.
DEFAULT_DEADLINE_SECONDS = 5.0


def _deadline() -> Any:
    return setting(default=Duration(DEFAULT_DEADLINE_SECONDS), check=positive)


@dataclass(frozen=True)
class CollectorSwitch:
    """A collector with no options of its own but its switch and its ``deadline``.

    A run that has not returned by ``deadline`` makes the collector *stuck*: the cycle
    goes on without it until the run returns (:mod:`sn_monitor.agent.watchdog`).
    """

    enabled: bool = True
    deadline: Duration = _deadline()


@dataclass(frozen=True)
class NetCollectorSettings:
    """The net collector: which interfaces to read, and its ``deadline``."""

    enabled: bool = True
    deadline: Duration = _deadline()
    include: str | None = setting(default=None, check=_regex)
    exclude: str | None = setting(default=r"^(lo|docker.*|veth.*)$", check=_regex)


@dataclass(frozen=True)
class ProcessesCollectorSettings:
    """The processes collector: how often /proc is scanned for processes stuck in D.

    ``interval``: seconds between scans (one file per process each); ``stuck_after``: how
    long a process stays in D, using no CPU time, before it counts as stuck; ``deadline``
    as every collector's (a scan blocked on a dead mount is stuck too).
    """

    enabled: bool = True
    deadline: Duration = _deadline()
    interval: Duration = setting(default=Duration(10.0), check=positive)
    stuck_after: Duration = setting(default=Duration(120.0), check=positive)


@dataclass(frozen=True)
class CollectorSettings:
    """Every collector by name; each can be switched off."""

    nvml: CollectorSwitch = field(default_factory=CollectorSwitch)
    net: NetCollectorSettings = field(default_factory=NetCollectorSettings)
    infiniband: CollectorSwitch = field(default_factory=CollectorSwitch)
    host: CollectorSwitch = field(default_factory=CollectorSwitch)
    kmsg: CollectorSwitch = field(default_factory=CollectorSwitch)
    processes: ProcessesCollectorSettings = field(default_factory=ProcessesCollectorSettings)

    def deadlines(self) -> dict[str, float]:
        """Every collector's deadline in seconds, by name."""
        return {f.name: float(getattr(self, f.name).deadline) for f in fields(self)}


@dataclass(frozen=True)
class GuardSettings:
    """The agent's own thermal protection (acts without the controller)."""

    mode: Literal["enforce", "dry-run", "off"] = "enforce"
    throttle_at: float = setting(default=85.0, check=_temperature)
    release_at: float = setting(default=80.0, check=_temperature)
    hold: Duration = setting(default=Duration(5.0), key="for")
    power_cap: float = setting(default=0.7, check=fraction)

    def __post_init__(self) -> None:
        if self.release_at >= self.throttle_at:
            raise ValueError(
                f"release_at ({self.release_at}) must be below throttle_at ({self.throttle_at})"
            )


#: Where a reset command names the GPU: replaced by its NVML index.
GPU_PLACEHOLDER = "{gpu}"


def _program(value: list[str] | None) -> None:
    if value is not None and (not value or not value[0]):
        raise ValueError("name the program to run, as a list: [/usr/bin/nvidia-smi, ...]")


def _reset_program(value: list[str]) -> None:
    _program(value)
    if not any(GPU_PLACEHOLDER in part for part in value):
        raise ValueError(f"must name the GPU to reset with {GPU_PLACEHOLDER} "
                         "(nvidia-smi --gpu-reset -i {gpu}); without it every GPU might be reset")


def _dcgm_level(value: int) -> None:
    if not 0 <= value <= 4:
        raise ValueError(f"must be a dcgmi diag level from 1 to 4, or 0 for none; got {value}")


def _margin(value: float) -> None:
    if not 0 <= value <= 60:
        raise ValueError(f"must be a margin from 0 to 60 °C, got {value}")


@dataclass(frozen=True)
class VerifySettings:
    """The node's return-to-service checks (:mod:`sn_monitor.agent.verify`).

    ``expected_gpus``: how many GPUs the node must show; unset, the most this agent has
    seen on the node (kept in ``state_dir``, so a GPU missing after a reboot still
    fails). ``temperature_margin``: every GPU must be this far below its slowdown
    temperature. ``dcgm_level``: ``dcgmi diag -r LEVEL`` when dcgmi is installed (0:
    never). ``command``: an extra program that must exit 0 (an NCCL all-reduce test).
    """

    expected_gpus: int | None = setting(default=None, check=optional(at_least_one))
    temperature_margin: float = setting(default=10.0, check=_margin)
    dcgm_level: int = setting(default=1, check=_dcgm_level)
    dcgm_timeout: Duration = setting(default=Duration(300.0), check=positive)
    dcgmi: str = "dcgmi"
    command: list[str] | None = setting(default=None, check=_program)
    command_timeout: Duration = setting(default=Duration(600.0), check=positive)
    #: How long a verification waits for a sample taken after it was asked.
    sample_wait: Duration = setting(default=Duration(10.0), check=positive)


@dataclass(frozen=True)
class RemediationSettings:
    """What the agent does for the controller's ``reset_gpu`` and ``reboot``.

    ``mode``: ``dry-run`` answers what would have run and runs nothing; ``enforce``
    runs it. Unset: dry-run on a real node, enforce on a simulated one (its reset and
    reboot touch only simulated GPUs). Programs are argv lists run without a shell;
    ``{gpu}`` in ``reset_command`` becomes the GPU's index. ``timeout`` bounds each.
    """

    mode: Literal["dry-run", "enforce"] | None = None
    reset_command: list[str] = setting(
        default_factory=lambda: ["nvidia-smi", "--gpu-reset", "-i", GPU_PLACEHOLDER],
        check=_reset_program)
    reboot_command: list[str] = setting(
        default_factory=lambda: ["systemctl", "reboot"], check=_program)
    timeout: Duration = setting(default=Duration(60.0), check=positive)
    verify: VerifySettings = field(default_factory=VerifySettings)

    @property
    def enforce(self) -> bool:
        """Whether reset and reboot really run (unset mode: no)."""
        return self.mode == "enforce"


#: Where Kubernetes mounts a pod's service account token and the cluster's CA.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

#: Report label -> Node label key. No Kubernetes convention names a rack or a supernode
#: (topology.kubernetes.io has only region and zone), so the defaults are keys of our own
#: prefix, the one of the controller's taint; ``nvidia.com/gpu.clique`` (NVIDIA GPU feature
#: discovery, on multi-node NVLink systems) names the NVLink domain and may be mapped to
#: supernode instead.
DEFAULT_NODE_LABEL_MAP: dict[str, str] = {"supernode": "sn-monitor.io/supernode",
                                          "rack": "sn-monitor.io/rack"}

_NODE_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _label_map(value: dict[str, str]) -> None:
    if not value:
        raise ValueError("map at least one report label to a Node label key, "
                         "e.g. {supernode: sn-monitor.io/supernode}")
    for label, key in value.items():
        if not label or len(label) > 64:
            raise ValueError(f"report label {label!r} must be 1 to 64 characters")
        if not isinstance(key, str) or len(key) > 317 or not _NODE_LABEL_KEY.fullmatch(key):
            raise ValueError(f"{label}: {key!r} is not a Kubernetes label key "
                             "(prefix/name, e.g. sn-monitor.io/rack)")


@dataclass(frozen=True)
class NodeLabelSettings:
    """Report labels read from this node's Kubernetes Node (:mod:`sn_monitor.agent.node_labels`).

    The Node named ``node`` is read at start and every ``interval`` with the pod's
    service account (``token_file``, ``ca_file``) from ``api_url`` (default: the
    in-cluster address, ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``);
    ``map`` says which Node label becomes which report label. Labels set in ``labels``
    win over the Node's. The service account needs ``get`` on ``nodes``.
    """

    enabled: bool = False
    mapping: dict[str, str] = setting(default_factory=lambda: dict(DEFAULT_NODE_LABEL_MAP),
                                      key="map", check=_label_map)
    interval: Duration = setting(default=Duration(300.0), check=positive)
    timeout: Duration = setting(default=Duration(5.0), check=positive)
    api_url: str | None = setting(default=None, check=_http_url)
    token_file: str = f"{SERVICE_ACCOUNT_DIR}/token"
    ca_file: str = f"{SERVICE_ACCOUNT_DIR}/ca.crt"


def default_node_name() -> str:
    """``$NODE_NAME`` (the DaemonSet's downward API: spec.nodeName), else the hostname."""
    return os.environ.get("NODE_NAME", "").strip() or socket.gethostname()


@dataclass(frozen=True)
class KubeletAttributionSettings:
    """The kubelet's pod-resources API as an allocation source (``kubelet`` extra)."""

    enabled: bool = False
    socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    #: Resource names read as GPUs besides nvidia.com/gpu, nvidia.com/gpu.shared and
    #: nvidia.com/mig-*; a trailing ``*`` makes a prefix.
    resources: list[str] = field(default_factory=list)
    #: How often the kubelet is asked, on a thread of its own (each answer kept until then).
    refresh: Duration = setting(default=Duration(10.0), check=positive)
    timeout: Duration = setting(default=Duration(2.0), check=positive)


@dataclass(frozen=True)
class SlurmAttributionSettings:
    """Slurm as an allocation source: the GPUs its jobs hold on this node, idle or not."""

    enabled: bool = False
    #: This node's name in Slurm (default: the short host name).
    node: str | None = None
    #: How often squeue and scontrol are asked (each answer is kept until then).
    refresh: Duration = setting(default=Duration(30.0), check=positive)
    timeout: Duration = setting(default=Duration(5.0), check=positive)


@dataclass(frozen=True)
class AttributionSettings:
    """Whose workload holds each GPU: the platforms' sources, each off unless enabled."""

    kubelet: KubeletAttributionSettings = field(default_factory=KubeletAttributionSettings)
    slurm: SlurmAttributionSettings = field(default_factory=SlurmAttributionSettings)


def _rank_pattern(value: str | None) -> None:
    """A regular expression naming at least one of the groups a log path may give."""
    _regex(value)
    if value is not None and not {"rank", "local_rank", "node", "stream"} & set(
            re.compile(value).groupindex):
        raise ValueError(f"{value!r} names none of the groups (?P<rank>...), "
                         "(?P<local_rank>...), (?P<node>...), (?P<stream>...)")


def _not_empty(value: str) -> None:
    if not value.strip():
        raise ValueError("must not be empty")


def _units(value: list[str]) -> None:
    for index, unit in enumerate(value):
        if not unit.strip() or "/" in unit:
            raise ValueError(f"[{index}]: {unit!r} is not a systemd unit name")


#: The longest line a job log may have kept whole (the queue holds at most ``queue_lines``
#: of them).
MAX_LINE_BYTES = 1 << 20


def _line_bytes(value: int) -> None:
    if not 64 <= value <= MAX_LINE_BYTES:
        raise ValueError(f"must be from 64 to {MAX_LINE_BYTES} bytes, got {value}")


@dataclass(frozen=True)
class JobLogFileSettings:
    """A job's log files: their ``glob``, their ``job``, what their paths say.

    ``glob`` is expanded again every ``rescan_interval``; ``rank_pattern`` is a regular
    expression searched in each path whose named groups ``rank``, ``local_rank``,
    ``node``, ``stream`` say where a line came from (default: torchrun's ``--log-dir``
    layout, ``attempt_N/<local rank>/stdout.log``).
    """

    glob: str = setting(check=_not_empty)
    job: str | None = None
    rank_pattern: str | None = setting(default=None, check=_rank_pattern)


@dataclass(frozen=True)
class ContainerLogSettings:
    """Container logs in the CRI format: ``dir``'s ``<pod>_<namespace>_<container>-<id>.log``."""

    enabled: bool = False
    dir: str = "/var/log/containers"


@dataclass(frozen=True)
class JournaldLogSettings:
    """systemd units whose journal is read (``journalctl --follow``, a name on PATH or a path)."""

    units: list[str] = setting(default_factory=list, check=_units)
    journalctl: str = setting(default="journalctl", check=_not_empty)


@dataclass(frozen=True)
class JobLogSettings:
    """The job's own logs, read on the agent (:mod:`sn_monitor.agent.joblogs`); off by default.

    ``max_bytes_per_second`` bounds all reading together, ``stream_bytes_per_second`` each
    file or unit: over it, a file's oldest unread bytes are skipped (counted as dropped).
    ``max_line_bytes`` bounds a line (longer ones are cut), ``queue_lines`` the lines
    waiting for their consumer (full: the oldest is dropped), ``max_open_files`` the files
    open at once. ``from_start``: read the files and units already there from their start
    (default: from their end). The lines are recognised on the reader's thread
    (:mod:`sn_monitor.joblog`'s catalogue) and each finding goes to the controller as a
    ``log`` event.
    """

    enabled: bool = False
    files: list[JobLogFileSettings] = field(default_factory=list)
    containers: ContainerLogSettings = field(default_factory=ContainerLogSettings)
    journald: JournaldLogSettings = field(default_factory=JournaldLogSettings)
    #: 256 KiB/s: reading and recognising the lines costs ~13 % of a core per MB/s of a
    #: dense log (``bench.joblog_bench``), so this keeps the worst case under 5 %.
    max_bytes_per_second: int = setting(default=256 << 10, check=positive)
    stream_bytes_per_second: int = setting(default=256 << 10, check=positive)
    max_line_bytes: int = setting(default=4096, check=_line_bytes)
    queue_lines: int = setting(default=8192, check=at_least_one)
    max_open_files: int = setting(default=256, check=at_least_one)
    poll_interval: Duration = setting(default=Duration(0.25), check=positive)
    rescan_interval: Duration = setting(default=Duration(1.0), check=positive)
    from_start: bool = False
    #: The findings (and, when asked, the lines) as ECS JSON lines for Filebeat or
    #: Vector (``deploy/logging/``); None: none written.
    output: EcsOutputOptions | None = None
    #: The template miner per job (new and bursting templates); None: off.
    templates: TemplateSettings | None = None


@dataclass(frozen=True)
class EventSettings:
    """How fault events leave the agent.

    ``fast`` (on by default): a thread blocked in NVML's event wait and one following
    the kernel log hand an XID, or a GPU fallen off the bus, to the reporter the moment
    it happens, and the reporter sends it at once in an event-only report instead of
    with the next sample (:mod:`sn_monitor.agent.fastpath`). Off: events go with the
    sampled reports only. Only with a controller: without one there is nothing to send
    at once, and /metrics changes with each sample either way.
    """

    fast: bool = True


#: What /metrics serves: ``sn``, the agent's own ``sn_*`` families; ``dcgm``, those and
#: dcgm-exporter's ``DCGM_FI_*`` families (:mod:`sn_monitor.agent.exposition_dcgm`), for
#: a node where the agent replaces dcgm-exporter; ``dcgm-only``, dcgm-exporter's alone
#: (sn-monitor's own dashboards and alert rules then see nothing of the node).
Exposition = Literal["sn", "dcgm", "dcgm-only"]


@dataclass(frozen=True)
class AgentSettings:
    """Everything ``sn-monitor agent`` reads from deploy/agent.yaml."""

    node: str = field(default_factory=default_node_name)
    labels: dict[str, str] = field(default_factory=dict)
    labels_from_node: NodeLabelSettings = field(default_factory=NodeLabelSettings)
    interval: Duration = setting(default=Duration(1.0), check=positive)
    listen: str = setting(default="0.0.0.0:9847", check=listen_address)
    exposition: Exposition = "sn"
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    state_dir: str = "/var/lib/sn-monitor"
    paths: PathSettings = field(default_factory=PathSettings)
    collectors: CollectorSettings = field(default_factory=CollectorSettings)
    events: EventSettings = field(default_factory=EventSettings)
    attribution: AttributionSettings = field(default_factory=AttributionSettings)
    guard: GuardSettings = field(default_factory=GuardSettings)
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    job_logs: JobLogSettings = field(default_factory=JobLogSettings)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"


def agent_settings_from(doc: Document) -> AgentSettings:
    """Validate a parsed agent config file."""
    return bind(AgentSettings, doc)


def load_agent_settings(path: str | Path | None) -> AgentSettings:
    """Read the agent config file, or the defaults when there is none."""
    if path is None:
        return AgentSettings()
    return agent_settings_from(load_yaml(path))



