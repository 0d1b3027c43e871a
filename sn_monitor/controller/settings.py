"""The controller's settings (deploy/controller.yaml), read by the one config loader."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sn_monitor.config import (
    ConfigError,
    Document,
    Duration,
    bind,
    listen_address,
    load_yaml,
    non_negative,
    optional,
    positive,
    setting,
)
from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.actions.routing import DriverSettings, check_routes
from sn_monitor.controller.actions.runner import RunnerSettings
from sn_monitor.controller.failslow.finder import FailSlowSettings
from sn_monitor.controller.ha.lease import HaSettings
from sn_monitor.controller.jobs.settings import JobSettings
from sn_monitor.controller.k8s.settings import JobWatchSettings
from sn_monitor.controller.remediation.ladder import LadderSettings
from sn_monitor.controller.security.tls import TlsSettings
from sn_monitor.controller.workloads.accounting import WorkloadSettings
from sn_monitor.rules.spec import NO_RULES, load_rule_set
from sn_monitor.rules.xid_catalog import check_catalog_file

#: Where a PostgreSQL store's connection string may come from instead of ``dsn_file``.
STORE_DSN_ENV = "SN_STORE_DSN"


@dataclass(frozen=True)
class StoreSettings:
    """Where the controller keeps its decisions.

    ``sqlite`` (the default): ``controller.db`` in the state directory, for one
    controller. ``postgresql``: a database two controllers share (``ha``); the libpq
    connection string (``host=... dbname=... user=...`` or a ``postgresql://`` URI) is
    read from ``dsn_file`` or the environment variable ``SN_STORE_DSN``, never from the
    config file or the command line, because it may hold a password (libpq's
    ``PGPASSFILE`` and ``PGPASSWORD`` work too).
    """

    backend: Literal["sqlite", "postgresql"] = "sqlite"
    dsn_file: str | None = None

    def __post_init__(self) -> None:
        if self.dsn_file is not None and self.backend != "postgresql":
            raise ValueError("dsn_file is for backend: postgresql")


@dataclass(frozen=True)
class ControllerSettings:
    """Everything ``sn-monitor controller`` reads from deploy/controller.yaml.

    ``routes`` picks the driver of each action; unset actions take the defaults: alerts
    go to every configured alert driver, throttle/release to the agent, cordon, uncordon
    and evict to the first configured of kubernetes, slurm and command, checkpoint,
    restore and failover to job control.
    """

    listen: str = setting(default="0.0.0.0:9848", check=listen_address)
    state_dir: str = "/var/lib/sn-monitor"
    #: Rule files or directories; unset: ``/etc/sn-monitor/rules`` when it exists, else
    #: the rules packaged with sn-monitor.
    rules: list[str] | None = None
    #: NVIDIA's Xid catalogue (each XID code's name and immediate action) as a file; unset:
    #: the catalogue packaged with sn-monitor. The file must load when the config does.
    xid_catalog: str | None = setting(default=None, check=optional(check_catalog_file))
    token_file: str | None = None
    #: Serve HTTPS (and verify agents' client certificates); unset: plain HTTP.
    tls: TlsSettings | None = None
    max_body_bytes: int = setting(default=1 << 20, check=positive)
    sweep_interval: Duration = setting(default=Duration(0.5), check=positive)
    #: Node-taking actions (cordon, evict, failover) wait this long before they are
    #: submitted, so that a burst of simultaneous faults (a switch, a partition) reaches
    #: the circuit breaker before the first eviction runs, and a node that blinks back
    #: within it is left alone.
    settle: Duration = setting(default=Duration(3.0), check=non_negative)
    policy: PolicySettings = field(default_factory=PolicySettings)
    runner: RunnerSettings = field(default_factory=RunnerSettings)
    drivers: DriverSettings = field(default_factory=DriverSettings)
    routes: dict[str, list[str]] = setting(default_factory=dict, check=check_routes)
    #: DistributedJob files (a directory of *.yaml); jobs can also come through the API.
    jobs: str | None = None
    #: DistributedJob custom resources as jobs (``kubernetes: {watch_jobs: true}``).
    kubernetes: JobWatchSettings = field(default_factory=JobWatchSettings)
    recovery: JobSettings = field(default_factory=JobSettings)
    #: The remediation ladder: reset the GPU, reboot, replace (each verified).
    remediation: LadderSettings = field(default_factory=LadderSettings)
    #: The bottleneck finder: a slow job, and the node and link that hold it back.
    fail_slow: FailSlowSettings = field(default_factory=FailSlowSettings)
    #: The workloads' accounting: when a GPU a workload holds counts as idle.
    workloads: WorkloadSettings = field(default_factory=WorkloadSettings)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    store: StoreSettings = field(default_factory=StoreSettings)
    #: Run as one of a pair of controllers (a lease decides the active one).
    ha: HaSettings | None = None

    def __post_init__(self) -> None:
        if self.ha is not None and self.store.backend != "postgresql":
            raise ValueError("ha: needs store.backend: postgresql (both controllers must "
                             "share one store: a SQLite file is one machine's)")


def load_controller_settings(path: str | Path | None) -> ControllerSettings:
    """Read the controller config file, or the defaults when there is none."""
    if path is None:
        return ControllerSettings()
    return bind(ControllerSettings, load_yaml(path))


def check_rules(settings: ControllerSettings, doc: Document) -> list[str]:
    """``check-config``'s look at the rules a controller config names; returns notes.

    The rules paths on this machine are loaded as the controller loads them: a directory
    without rule files, or rule files without a rule, is an error at ``rules``. A path
    not on this machine (a container's, the host's the file is for) is named in a note
    and not checked: the controller refuses to start without it.
    """
    if not settings.rules:  # unset: the defaults; []: no rules, asked for
        return []
    paths = [Path(p) for p in settings.rules]
    here = [p for p in paths if p.exists()]
    notes = [f"rules[{i}]: {p} is not on this machine: not checked"
             for i, p in enumerate(paths) if not p.exists()]
    try:
        loaded = load_rule_set(here)
    except ConfigError as err:
        raise doc.error(("rules",), str(err)) from None
    if not notes and not loaded.rules:
        raise doc.error(("rules",), NO_RULES)
    return notes


__all__ = ["ConfigError", "ControllerSettings", "DriverSettings", "HaSettings", "StoreSettings",
           "TlsSettings", "check_rules", "load_controller_settings"]
