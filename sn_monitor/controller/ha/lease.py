"""The lease contract and its settings (the ``ha:`` section of the controller config)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sn_monitor.config import Duration, optional, positive, setting
from sn_monitor.controller.k8s.settings import require_client
from sn_monitor.errors import SnMonitorError
from sn_monitor.transport import check_http_url


class LeaseError(SnMonitorError):
    """The lease's backend could not be asked (the store or the API server is away)."""


class Lease(Protocol):
    """One candidate's handle on the lease that decides which controller is active.

    ``try_acquire_or_renew`` is called every ``retry_period`` by the elector: it takes
    the lease when it is free or expired, renews it when this candidate holds it, and
    answers whether this candidate holds it now. It raises :class:`LeaseError` when the
    backend cannot be reached (the elector counts that as "not renewed").
    ``release`` gives the lease up on an orderly stop, so the standby takes over at
    once instead of after ``lease_duration``; it raises LeaseError when it cannot.
    """

    identity: str

    def try_acquire_or_renew(self) -> bool: ...

    def release(self) -> None: ...

    def holder(self) -> str | None:
        """Who holds the lease now, for a standby's /healthz (None: nobody, or unknown)."""
        ...


def default_identity() -> str:
    """``host:pid``: unique among candidates, and tells an operator where to look."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class KubernetesLeaseSettings:
    """Which ``coordination.k8s.io/v1`` Lease, and how to reach the API server.

    The namespace defaults to the pod's own (``POD_NAMESPACE``, set from the downward
    API in deploy/kubernetes), else ``sn-monitor``. ``host``/``kubeconfig``/``context``
    as for the Kubernetes driver: unset means in-cluster, else ``~/.kube/config``.
    """

    name: str = "sn-monitor-controller"
    namespace: str | None = None
    host: str | None = setting(default=None, check=optional(check_http_url))
    kubeconfig: str | None = None
    context: str | None = None
    timeout: Duration = setting(default=Duration(5.0), check=positive)


@dataclass(frozen=True)
class HaSettings:
    """``ha:`` in the controller config: absent means one controller, no lease.

    ``lease: postgresql`` keeps the lease in the shared store (``store.backend`` must be
    ``postgresql``); ``lease: kubernetes`` uses a Lease object, and the store (still
    PostgreSQL: both controllers must see the same decisions) only fences.
    The active controller renews every ``retry_period``; if it has not renewed for
    ``renew_deadline`` it stops acting and exits (systemd or Kubernetes restarts it as
    a standby); a standby takes an expired lease ``lease_duration`` after the last renewal.
    """

    lease: Literal["postgresql", "kubernetes"]
    identity: str = field(default_factory=default_identity)
    lease_duration: Duration = setting(default=Duration(15.0), check=positive)
    renew_deadline: Duration = setting(default=Duration(10.0), check=positive)
    retry_period: Duration = setting(default=Duration(2.0), check=positive)
    kubernetes: KubernetesLeaseSettings = field(default_factory=KubernetesLeaseSettings)

    def __post_init__(self) -> None:
        if self.lease == "kubernetes":
            require_client()
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "need retry_period < renew_deadline < lease_duration (got "
                f"{self.retry_period:g}s, {self.renew_deadline:g}s, {self.lease_duration:g}s):"
                " the active must give up before a standby may take over")
