"""How to reach the Kubernetes API and what to touch there: plain data, no client imported.

The controller's ``drivers.kubernetes``, a job's ``spec.control.kubernetes`` and
``ha.lease: kubernetes`` are checked with the rest of their file; configuring one where
the Kubernetes client is not installed is a config error that says what to install.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from sn_monitor.config import Duration, optional, positive, setting
from sn_monitor.transport import check_http_url

#: What to install for the Kubernetes drivers and lease.
KUBERNETES_EXTRA = "pip install 'sn-monitor[kubernetes]'"

# Matched with fullmatch: the whole string ("$" would let a final newline through).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_KEY = re.compile(r"([a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?/)?"
                        r"[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?")
_LABEL_VALUE = re.compile(r"([a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?)?")



#: Where a missing client is noted instead of raised (``check-config``: the file may be
#: checked on a machine other than the one it is for).
_ABSENT_CLIENT_NOTES: ContextVar[list[str] | None] = ContextVar("absent_client_notes",
                                                                 default=None)
_ABSENT_CLIENT = ("the Kubernetes client is not installed on this machine: Kubernetes "
                  "settings not checked against it (where the controller runs: "
                  f"{KUBERNETES_EXTRA})")


@contextmanager
def absent_client_noted(notes: list[str]) -> Iterator[None]:
    """Within, a missing Kubernetes client is a note in ``notes``, not a config error."""
    token = _ABSENT_CLIENT_NOTES.set(notes)
    try:
        yield
    finally:
        _ABSENT_CLIENT_NOTES.reset(token)


def require_client() -> None:
    """ValueError (a config error where the setting is) without the ``kubernetes`` package.

    Inside :func:`absent_client_noted` it is a note instead, given once.
    """
    if importlib.util.find_spec("kubernetes") is not None:
        return
    notes = _ABSENT_CLIENT_NOTES.get()
    if notes is None:
        raise ValueError("needs the Kubernetes client, which is not installed: "
                         f"{KUBERNETES_EXTRA}")
    if _ABSENT_CLIENT not in notes:
        notes.append(_ABSENT_CLIENT)


def check_grace_period(value: int | None) -> None:
    """Settings check for a pod deletion's grace period (absent, or 0 s or more)."""
    if value is not None and value < 0:
        raise ValueError(f"must be 0 or more, got {value}")


@dataclass(frozen=True)
class KubernetesSettings:
    """How to reach the API server and how to mark nodes.

    Credentials: in-cluster (the controller's service account) when running in a pod,
    else ``kubeconfig`` (default ``~/.kube/config``) and its ``context``. ``host`` talks
    to that URL with no authentication at all: for ``kubectl proxy`` and tests.
    """

    host: str | None = setting(default=None, check=optional(check_http_url))
    kubeconfig: str | None = None
    context: str | None = None
    timeout: Duration = setting(default=Duration(10.0), check=positive)
    taint_key: str = "sn-monitor.io/unhealthy"
    cordon_before_evict: bool = True
    grace_period_seconds: int | None = setting(default=None, check=check_grace_period)
    #: Wait before retrying an eviction that a PodDisruptionBudget blocked (when the
    #: API server gives no Retry-After).
    eviction_retry_after: Duration = setting(default=Duration(10.0), check=positive)

    def __post_init__(self) -> None:
        require_client()


def _namespace(value: str) -> None:
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(f"must be a Kubernetes namespace name (a DNS-1123 label), got {value!r}")


def _selector(value: dict[str, str]) -> None:
    if not value:
        raise ValueError("an empty selector would match every pod in the namespace: give at "
                         "least one label, e.g. {training.kubeflow.org/job-name: trillion}")
    for key, wanted in value.items():
        if len(key) > 316 or not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"invalid label key {key!r}")
        if len(wanted) > 63 or not _LABEL_VALUE.fullmatch(wanted):
            raise ValueError(f"invalid label value {wanted!r} for {key!r}")


@dataclass(frozen=True)
class KubernetesJobSettings:
    """A job's pods on Kubernetes (``spec.control.kubernetes`` of a DistributedJob).

    ``host`` / ``kubeconfig`` / ``context`` / ``timeout`` reach the API server as the
    controller's kubernetes driver does (in-cluster by default).
    """

    namespace: str = setting(check=_namespace)
    selector: dict[str, str] = setting(check=_selector)
    grace_period_seconds: int | None = setting(key="gracePeriodSeconds", default=None,
                                               check=check_grace_period)
    host: str | None = setting(default=None, check=optional(check_http_url))
    kubeconfig: str | None = None
    context: str | None = None
    timeout: Duration = setting(default=Duration(10.0), check=positive)

    @property
    def label_selector(self) -> str:
        """The selector as the API takes it: ``k1=v1,k2=v2``."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))

    def __post_init__(self) -> None:
        require_client()

    def api_settings(self) -> KubernetesSettings:
        return KubernetesSettings(host=self.host, kubeconfig=self.kubeconfig,
                                  context=self.context, timeout=self.timeout)


@dataclass(frozen=True)
class JobWatchSettings:
    """The controller's ``kubernetes:``: DistributedJob custom resources as jobs.

    ``watch_jobs``: list and watch ``training.ai/v1`` DistributedJobs (install
    deploy/kubernetes/distributedjob-crd.yaml) and write their status; ``namespace``:
    only that namespace's (unset: every namespace). ``api`` reaches the API server as
    the drivers do (in-cluster by default). ``status_interval``: at most one status
    write per object this often.
    """

    watch_jobs: bool = False
    namespace: str | None = setting(default=None, check=optional(_namespace))
    status_interval: Duration = setting(default=Duration(5.0), check=positive)
    api: KubernetesSettings | None = None

    def __post_init__(self) -> None:
        if self.watch_jobs:
            require_client()

    def api_settings(self) -> KubernetesSettings:
        return self.api if self.api is not None else KubernetesSettings()
