"""The lease as a Kubernetes ``coordination.k8s.io/v1`` Lease.

The kubernetes client's leader election (``kubernetes.leaderelection``) does the
deciding: :meth:`LeaderElection.try_acquire_or_renew` is one step of client-go's
algorithm (read the Lease; create it if absent; take it if its holder has not renewed
for ``lease_duration`` as measured on *our* clock since we last saw it change; renew it
if it is ours), and its ``LeaseLock`` writes with the ``resourceVersion`` it read, so of
two candidates writing at once the API server lets one through and answers 409 to the
other. We call that one step from our own loop (:mod:`.elector`) instead of the
library's ``run()``, and wrap the library where it falls short of our contract:

* **Errors.** ``LeaseLock`` turns every ``ApiException`` into "not acquired" and lets
  transport errors (urllib3) escape. Through :class:`_LeaseApi`, only the election's
  normal answers stay ``ApiException`` (404 on read: no Lease yet, create it; 409 on
  create or update: another candidate wrote first): the library reads those as "not
  ours". Anything else (a 5xx, a 403 from missing RBAC, a timeout, a refused
  connection) raises :class:`LeaseError`: "cannot ask", which the elector counts
  against ``renew_deadline`` and logs, instead of a standby that quietly never leads.
* **Timeouts.** Every call carries ``kubernetes.timeout``; urllib3 retries are off.
* **Durations.** ``electionconfig.Config`` exits the process (``sys.exit``) on a
  duration under 1 s; :class:`HaSettings` has validated ours, so a plain config object
  is passed. ``LeaseLock`` writes ``int(str(lease_duration))``: the duration goes to the
  library in whole seconds, rounded up (the safe side: a standby waits a little longer).
* **Release.** The library has none: :meth:`KubernetesLease.release` is client-go's
  ``ReleaseOnCancel`` (holder cleared, ``leaseDurationSeconds: 1``), so the standby, which
  takes a Lease without a holder at once, does not wait for it to expire.
* **Times on the wire.** The client writes ``datetime.isoformat()``, which drops the
  fraction when it is zero; the API server reads ``MicroTime`` with exactly six digits
  and would refuse that one write in a million. :class:`_ApiClient` writes RFC 3339 with
  six digits and ``Z``, as client-go does.

The ``kubernetes`` package is an optional extra: import this module only for
``ha.lease: kubernetes``.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException, OpenApiException
from kubernetes.leaderelection.leaderelection import LeaderElection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from sn_monitor.controller.ha.lease import HaSettings, KubernetesLeaseSettings, LeaseError
from sn_monitor.controller.k8s.client import api_client
from sn_monitor.controller.k8s.settings import KubernetesSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

# The election library logs at INFO on every step that does not win ("yet to finish
# lease_duration, lease held by ...", "Failed to create lock as ..."): on a standby, a
# line every retry_period for as long as it stands by. What matters of it reaches our
# log anyway: a failure to ask is a LeaseError (the elector logs it), a change of
# holder is logged by the elector.
logging.getLogger("leaderelection").setLevel(logging.WARNING)

#: Every CoordinationV1Api method this module calls, and the RBAC (resource, verb) it
#: needs. tests/integration/test_kubernetes_manifests.py reads the calls out of this
#: file and checks them against this table and the Role in deploy/kubernetes/ha/.
LEASE_CALLS = {
    "read_namespaced_lease": ("leases", "get"),        # every step; release
    "create_namespaced_lease": ("leases", "create"),   # the first candidate ever
    "replace_namespaced_lease": ("leases", "update"),  # take, renew, release
}
#: The answers that are part of the election, per call: anything else is a LeaseError.
_EXPECTED = {"read_namespaced_lease": 404, "create_namespaced_lease": 409,
             "replace_namespaced_lease": 409}
DEFAULT_NAMESPACE = "sn-monitor"


def lease_namespace(settings: KubernetesLeaseSettings,
                    environ: Mapping[str, str] | None = None) -> str:
    """The Lease's namespace: the setting, else ``POD_NAMESPACE``, else ``sn-monitor``."""
    env = os.environ if environ is None else environ
    return settings.namespace or env.get("POD_NAMESPACE") or DEFAULT_NAMESPACE


def micro_time(value: dt.datetime) -> str:
    """``metav1.MicroTime`` as the API server reads it: UTC, six fraction digits, ``Z``."""
    if value.tzinfo is None:
        value = value.astimezone()  # naive means local, as the election library makes them
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _ApiClient(k8s.ApiClient):
    """An ApiClient that writes every datetime as :func:`micro_time`.

    ``metav1.Time`` fields (seconds) accept the fraction too, so this is safe for any
    object this client writes.
    """

    def sanitize_for_serialization(self, obj: Any) -> Any:
        if isinstance(obj, dt.datetime):
            return micro_time(obj)
        return super().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]


class _LeaseApi:
    """What ``LeaseLock`` calls on its ``api_instance``: our client, timeout and errors.

    The election's normal answers (see ``_EXPECTED``) stay ApiException for LeaseLock to
    read as "not ours"; every other failure is a :class:`LeaseError`, which LeaseLock
    and LeaderElection do not catch.
    """

    def __init__(self, api: k8s.CoordinationV1Api, timeout: float) -> None:
        self.api = api
        self.timeout = timeout

    def read_namespaced_lease(self, name: str, namespace: str) -> k8s.V1Lease:
        return self._call("read_namespaced_lease", namespace, name, lambda: (
            self.api.read_namespaced_lease(name, namespace, _request_timeout=self.timeout)))

    def create_namespaced_lease(self, namespace: str, body: k8s.V1Lease) -> k8s.V1Lease:
        name = body.metadata.name if body.metadata else "?"
        return self._call("create_namespaced_lease", namespace, str(name), lambda: (
            self.api.create_namespaced_lease(namespace, body,
                                             _request_timeout=self.timeout)))

    def replace_namespaced_lease(self, name: str, namespace: str,
                                 body: k8s.V1Lease) -> k8s.V1Lease:
        return self._call("replace_namespaced_lease", namespace, name, lambda: (
            self.api.replace_namespaced_lease(name, namespace, body,
                                              _request_timeout=self.timeout)))

    def _call(self, method: str, namespace: str, name: str, call: Callable[[], T]) -> T:
        what = f"{method} {namespace}/{name}"
        try:
            return call()
        except ApiException as err:
            if err.status == _EXPECTED[method]:
                raise  # the election's own answer: LeaseLock makes it False
            raise LeaseError(_api_message(what, err)) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            # MaxRetryError (refused, unresolvable), ReadTimeoutError, ProtocolError
            raise LeaseError(f"{what}: API server unreachable: {type(err).__name__}: "
                             f"{err}") from None
        except (OpenApiException, ValueError) as err:
            # an answer the client could not read (pydantic's ValidationError is a
            # ValueError): not a Lease we can decide on
            raise LeaseError(f"{what}: unreadable answer: {type(err).__name__}: "
                             f"{err}") from None


def _api_message(what: str, err: ApiException) -> str:
    status = int(err.status or 0)
    message = f"{what}: {status} {err.reason or ''}".rstrip()
    if status in (401, 403):
        message += (" (the controller's ServiceAccount needs get, create and update on"
                    " coordination.k8s.io leases: deploy/kubernetes/ha/lease-rbac.yaml)")
    return message


@dataclass(frozen=True)
class _ElectionConfig:
    """The attributes LeaderElection reads (``electionconfig.Config`` without its exits).

    The callbacks are for the library's ``run()``, which we do not use.
    """

    lock: LeaseLock
    lease_duration: int
    renew_deadline: float
    retry_period: float
    onstarted_leading: Callable[[], None] = lambda: None
    onstopped_leading: Callable[[], None] = lambda: None


class KubernetesLease:
    """One candidate's handle on the ``ha.kubernetes.name`` Lease (see the module doc).

    ``close()`` closes the connection pool.
    """

    def __init__(self, settings: HaSettings, environ: Mapping[str, str] | None = None) -> None:
        ours = settings.kubernetes
        self.identity = settings.identity
        self.name = ours.name
        self.namespace = lease_namespace(ours, environ)
        # Configured as the Kubernetes driver is (host, in-cluster or kubeconfig; no
        # urllib3 retries); a bad configuration raises ValueError at start-up.
        configured = api_client(KubernetesSettings(
            host=ours.host, kubeconfig=ours.kubeconfig, context=ours.context,
            timeout=ours.timeout))
        self.client = _ApiClient(configured.configuration)
        configured.close()  # type: ignore[no-untyped-call]
        self.api = _LeaseApi(k8s.CoordinationV1Api(self.client), float(ours.timeout))
        lock = LeaseLock(self.name, self.namespace, self.identity)  # type: ignore[no-untyped-call]
        # Its own is on the default configuration; ours duck-types the three calls.
        lock.api_instance = self.api  # type: ignore[assignment]
        self._lock = lock
        self._election = LeaderElection(_ElectionConfig(  # type: ignore[no-untyped-call]
            lock=lock, lease_duration=math.ceil(settings.lease_duration),
            renew_deadline=float(settings.renew_deadline),
            retry_period=float(settings.retry_period)))
        self._known = False

    def try_acquire_or_renew(self) -> bool:
        """One election step; raises LeaseError when the API server cannot be asked."""
        self._known = False
        held = bool(self._election.try_acquire_or_renew())  # type: ignore[no-untyped-call]
        self._known = True
        return held

    def holder(self) -> str | None:
        """Who held the Lease at the last step (None: nobody, or that step failed).

        No API call: the elector asks right after a step. An expired Lease still names
        its last holder.
        """
        record = self._election.observed_record
        if not self._known or record is None:
            return None
        holder = record.holder_identity
        return str(holder) if holder else None

    def release(self) -> None:
        """Clear the Lease if this candidate holds it, so the standby takes it at once.

        client-go's ``ReleaseOnCancel``: no holder, ``leaseDurationSeconds: 1``, both
        times now. A Lease someone else holds, or wrote since we read it (409), is left
        alone. Raises LeaseError when the API server cannot be asked (the elector logs
        it; the standby then takes over when the Lease expires).
        """
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException:
            return  # 404: no Lease, nothing to release
        spec = lease.spec
        if spec is None or spec.holder_identity != self.identity:
            log.debug("lease %s/%s is not ours (holder %s): nothing to release",
                      self.namespace, self.name, spec.holder_identity if spec else None)
            return
        now = dt.datetime.now(dt.UTC)
        lease.spec = spec.model_copy(update={"holder_identity": None,
                                             "lease_duration_seconds": 1,
                                             "acquire_time": now, "renew_time": now})
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException:
            log.info("lease %s/%s changed while we released it: left as it is",
                     self.namespace, self.name)
            return
        self._known = False

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()  # type: ignore[no-untyped-call]
