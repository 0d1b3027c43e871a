"""Leadership of a pair: the lease, the pod's role label, standing by, and the fence.

With ``ha`` set the process stands by (serving the standby's answers) until its lease
is granted, then fences the store against the controller before it and serves as the
active (:mod:`~sn_monitor.controller.process.active`). The Kubernetes client is
imported only for a Kubernetes lease or label.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING, Literal

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError
from sn_monitor.controller.ha.elector import Elector
from sn_monitor.controller.ha.lease import HaSettings, Lease
from sn_monitor.controller.ha.standby import StandbyApp, StandbyStatus
from sn_monitor.controller.ha.store_lease import StoreLease
from sn_monitor.controller.process.server import NotifyingServer, uvicorn_config
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.controller.storage.store import Store
from sn_monitor.notify import SystemdNotifier

if TYPE_CHECKING:
    from sn_monitor.controller.ha.k8s_role import PodRoleLabel

log = logging.getLogger(__name__)


def build_lease(ha: HaSettings, store: Store, clock: Clock) -> Lease:
    """The lease ``ha.lease`` names (the Kubernetes client is imported only for it)."""
    if ha.lease == "postgresql":
        return StoreLease(store, ha, clock)
    from sn_monitor.controller.ha.k8s_lease import KubernetesLease

    try:
        lease: Lease = KubernetesLease(ha)
    except ValueError as err:
        raise ConfigError("controller config", "ha.kubernetes", None, str(err)) from None
    return lease


def build_role_label(ha: HaSettings) -> PodRoleLabel | None:
    """For ``ha.lease: kubernetes``: the label on our pod that the active's Service selects."""
    if ha.lease != "kubernetes":
        return None
    from sn_monitor.controller.ha.k8s_role import PodRoleLabel

    try:
        return PodRoleLabel(ha.kubernetes)
    except ValueError as err:
        raise ConfigError("controller config", "ha.kubernetes", None, str(err)) from None


def fence_store(store: Store, lease: Lease, ha: HaSettings, clock: Clock) -> int:
    """Make the store refuse writes once another controller takes over; the epoch.

    The PostgreSQL lease is its own fence. A Kubernetes Lease is not in the store, so
    the new active claims the store's lease row (a new epoch) as it takes over.
    """
    record = lease.granted if isinstance(lease, StoreLease) else None
    if record is None:
        record = store.acquire_lease(lease.identity, clock.time(),
                                     float(ha.lease_duration), force=True)
    assert record is not None  # a forced acquisition always takes the row
    store.fence(lease.identity, record.epoch)
    log.info("controller %s is active (lease epoch %d)", lease.identity, record.epoch)
    return record.epoch


def stand_by(settings: ControllerSettings, elector: Elector, notifier: SystemdNotifier,
             listener: socket.socket) -> Literal["won", "stopped", "failed"]:
    """Serve the standby's answers until the lease is ours, a signal, or the campaign fails.

    The campaign is this phase's one worker: an unexpected error in it is logged and
    stops the process (exit 1; the supervisor starts it again), never a standby that
    silently stopped campaigning. The standby serves on a copy of ``listener`` (uvicorn
    closes the sockets it served on): the address stays bound for the active.
    """
    status = StandbyStatus(elector.lease.identity)
    server = NotifyingServer(uvicorn_config(StandbyApp(status), settings,
                                            graceful_seconds=2), notifier)
    stop = threading.Event()
    won = threading.Event()
    failed = threading.Event()

    def campaign() -> None:
        try:
            leads = elector.wait_to_lead(stop, observe=status.saw)
        except Exception:  # the campaign's supervisor: log it and stop the process
            log.exception("worker lease-standby failed: the controller stops",
                          extra={"worker": "lease-standby"})
            failed.set()
            leads = False
        if leads:
            won.set()
        server.should_exit = True

    thread = threading.Thread(target=campaign, name="lease-standby", daemon=True)
    thread.start()
    log.info("controller %s standing by on %s", elector.lease.identity, settings.listen)
    try:
        server.run(sockets=[listener.dup()])
    finally:
        stop.set()
        thread.join(timeout=float(elector.settings.retry_period) + 15)
    return "won" if won.is_set() else "failed" if failed.is_set() else "stopped"
