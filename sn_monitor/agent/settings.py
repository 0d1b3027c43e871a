"""The agent's settings: grouped dataclasses with safe defaults, read by the one loader."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sn_monitor.config import (
    Document,
    Duration,
    bind,
    fraction,
    listen_address,
    load_yaml,
    positive,
    setting,
)
from sn_monitor.tls import ca_bundle, check_key_pair, readable_file


def _regex(value: str | None) -> None:
    if value is None:
        return
    try:
        re.compile(value)
    except re.error as err:
        raise ValueError(f"invalid regular expression {value!r}: {err}") from None


def _http_url(value: str | None) -> None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")


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
        try:
            _http_urls(self.urls)  # the loader checked; settings built in code were not
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


@dataclass(frozen=True)
class CollectorSwitch:
    """A collector with no options of its own."""

    enabled: bool = True


@dataclass(frozen=True)
class NetCollectorSettings:
    """The net collector: which interfaces to read."""

    enabled: bool = True
    include: str | None = setting(default=None, check=_regex)
    exclude: str | None = setting(default=r"^(lo|docker.*|veth.*)$", check=_regex)


@dataclass(frozen=True)
class ProcessesCollectorSettings:
    """The processes collector: how often /proc is scanned for processes stuck in D.

    ``interval``: seconds between scans (one file per process each); ``stuck_after``: how
    long a process stays in D, using no CPU time, before it counts as stuck.
    """

    enabled: bool = True
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


@dataclass(frozen=True)
class AgentSettings:
    """Everything ``sn-monitor agent`` reads from deploy/agent.yaml."""

    node: str = field(default_factory=socket.gethostname)
    labels: dict[str, str] = field(default_factory=dict)
    interval: Duration = setting(default=Duration(1.0), check=positive)
    listen: str = setting(default="0.0.0.0:9847", check=listen_address)
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    state_dir: str = "/var/lib/sn-monitor"
    paths: PathSettings = field(default_factory=PathSettings)
    collectors: CollectorSettings = field(default_factory=CollectorSettings)
    guard: GuardSettings = field(default_factory=GuardSettings)
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



