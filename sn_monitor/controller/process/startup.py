"""What the controller process reads and opens from its settings before it serves.

Its rules (a controller that watches nothing refuses to start), the store (SQLite or
PostgreSQL), the DistributedJob watch (the Kubernetes client imported only for it), and
the garbage collector tuned for a long-lived process.
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError
from sn_monitor.controller.jobs.crd_watch import JobWatch
from sn_monitor.controller.service import Controller
from sn_monitor.controller.settings import STORE_DSN_ENV, ControllerSettings
from sn_monitor.controller.storage.database.postgres import PostgresDatabase
from sn_monitor.controller.storage.store import Store
from sn_monitor.rules.spec import (
    CONFIG_SOURCE,
    NO_RULES,
    RuleSet,
    default_rule_paths,
    load_rule_set,
)

log = logging.getLogger(__name__)


def rule_paths(settings: ControllerSettings) -> tuple[list[Path], str]:
    """The rule files or directories to load, and where they come from (for the log)."""
    if settings.rules is None:
        return default_rule_paths()
    paths = [Path(p) for p in settings.rules]
    return paths, ", ".join(map(str, paths))


def read_rules(settings: ControllerSettings) -> RuleSet:
    """The controller's rules (ConfigError naming file, key and line); logs their source.

    No rules at all is a ConfigError (a controller that watches nothing looks exactly
    like a healthy one), unless the config asks for none with ``rules: []``.
    """
    paths, source = rule_paths(settings)
    if not paths:
        log.warning("no rules: the config says rules: [] (no node fault is acted on)")
        return RuleSet([], {CONFIG_SOURCE: 0})
    loaded = load_rule_set(paths)
    if not loaded.rules:
        raise ConfigError(source, "", None, NO_RULES)
    log.info("%d rules from %s", len(loaded.rules), source)
    return loaded


def open_store(settings: ControllerSettings) -> Store:
    """The store the settings name: SQLite in the state directory, or PostgreSQL."""
    if settings.store.backend == "sqlite":
        state_dir = Path(settings.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        return Store(state_dir / "controller.db")
    return Store(PostgresDatabase(_store_dsn(settings)))


def _store_dsn(settings: ControllerSettings) -> str:
    path = settings.store.dsn_file
    if path is None:
        dsn = os.environ.get(STORE_DSN_ENV, "").strip()
        if not dsn:
            raise ConfigError("controller config", "store.dsn_file", None,
                              f"backend postgresql needs dsn_file or ${STORE_DSN_ENV}")
        return dsn
    try:
        dsn = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ConfigError("controller config", "store.dsn_file", None,
                          f"cannot read {path}: {err.strerror}") from None
    if not dsn:
        raise ConfigError("controller config", "store.dsn_file", None, f"{path} is empty")
    return dsn


def build_job_watch(settings: ControllerSettings, controller: Controller,
                    clock: Clock) -> JobWatch:
    """For ``kubernetes.watch_jobs``: the DistributedJob watch (imports the client)."""
    from sn_monitor.controller.k8s.job_api import DistributedJobApi

    watch = settings.kubernetes
    try:
        api = DistributedJobApi(watch.api_settings(), watch.namespace)
    except ValueError as err:
        raise ConfigError("controller config", "kubernetes", None, str(err)) from None
    return JobWatch(api, controller.jobs, clock,
                    status_interval=float(watch.status_interval))


def tune_garbage_collector() -> None:
    """Fewer, cheaper collections for a long-lived process holding many small objects.

    Everything allocated at start-up (modules, rules, the store) is frozen out of the
    collector, and the first generation collects every 50,000 allocations instead of 700:
    the ingest path allocates a lot and frees almost all of it by reference counting.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
