"""The controller's role as a label on its own pod, for a Service that selects the active.

With ``ha.lease: kubernetes``, both controller pods are Ready while they serve (their
readiness probe is ``/livez``, which a standby answers too), and the Service that
agents and jobs reach selects ``sn-monitor.io/controller-role: active`` as well:
:class:`PodRoleLabel` puts that label on the pod the controller runs in. It is how
HashiCorp Vault's ``vault-active`` Service works.

The daemon marks the pod ``standby`` before its standby server serves (a restarted
container of a former active must not keep a stale ``active`` label while it answers
as a standby) and ``active`` after it fenced the store, before its active server
serves. A mark that fails is logged at ERROR and answered False; it is never retried:
an active without the label leaves the Service without an endpoint (agents cannot
report, and SnControllerDown fires for want of a target), which is visible and which
the log explains.

One merge patch of ``metadata.labels`` on ``pods/{POD_NAME}`` in ``POD_NAMESPACE``
(both from the downward API in deploy/kubernetes/ha). Without ``POD_NAME`` (not on
Kubernetes, or a manifest from before this label) marking does nothing.

The ``kubernetes`` package is an optional extra: import this module only for
``ha.lease: kubernetes``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Final, Literal

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException, OpenApiException

from sn_monitor.controller.ha.k8s_lease import DEFAULT_NAMESPACE
from sn_monitor.controller.ha.lease import KubernetesLeaseSettings
from sn_monitor.controller.k8s.client import api_client
from sn_monitor.controller.k8s.settings import KubernetesSettings

log = logging.getLogger(__name__)

#: The label, on the controller's own pod; deploy/kubernetes/ha's Service selects
#: ``active``.
ROLE_LABEL: Final = "sn-monitor.io/controller-role"
Role = Literal["active", "standby"]

#: Every CoreV1Api method this module calls, and the RBAC (resource, verb) it needs.
#: tests/integration/test_kubernetes_manifests.py reads the calls out of this file and
#: checks them against this table and the Role in deploy/kubernetes/ha/pod-label-rbac.yaml.
POD_CALLS: Final = {
    "patch_namespaced_pod": ("pods", "patch"),  # mark
}
RBAC_FILE: Final = "deploy/kubernetes/ha/pod-label-rbac.yaml"
_MERGE_PATCH: Final = "application/merge-patch+json"


class PodRoleLabel:
    """Labels the controller's own pod ``active`` or ``standby`` (see the module doc).

    ``host``/``kubeconfig``/``context``/``timeout`` are the Lease's: one API server, one
    identity. A bad configuration raises ValueError here, as :func:`api_client` does.
    ``close()`` closes the connection pool.
    """

    def __init__(self, settings: KubernetesLeaseSettings,
                 environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        #: None: not on Kubernetes (or POD_NAME not passed down): marking does nothing.
        self.pod = env.get("POD_NAME") or None
        self.namespace = env.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
        self.timeout = float(settings.timeout)
        self.client: k8s.ApiClient | None = None
        if self.pod is None:
            log.info("POD_NAME is not set: the controller's role is not put on a pod label "
                     "(%s; deploy/kubernetes/ha sets POD_NAME from the downward API)",
                     ROLE_LABEL)
            return
        self.client = api_client(KubernetesSettings(
            host=settings.host, kubeconfig=settings.kubeconfig, context=settings.context,
            timeout=settings.timeout))
        self.api = k8s.CoreV1Api(self.client)

    def mark(self, role: Role) -> bool:
        """Set the pod's role label; False (and an ERROR log) when it could not be set.

        Never raises for an API or transport failure. True without a call when there
        is no pod to label.
        """
        if self.pod is None:
            return True
        body = {"metadata": {"labels": {ROLE_LABEL: role}}}
        what = f"cannot label pod {self.namespace}/{self.pod} {ROLE_LABEL}={role}"
        try:
            self.api.patch_namespaced_pod(self.pod, self.namespace, body,
                                          _content_type=_MERGE_PATCH,
                                          _request_timeout=self.timeout)
        except ApiException as err:
            log.error("%s: %s%s", what, _status(err), _consequence(role))
            return False
        except (urllib3.exceptions.HTTPError, OSError) as err:
            # MaxRetryError (refused, unresolvable), ReadTimeoutError, ProtocolError
            log.error("%s: API server unreachable: %s: %s%s", what, type(err).__name__, err,
                      _consequence(role))
            return False
        except (OpenApiException, ValueError) as err:
            # An answer the client could not read (pydantic's ValidationError is a
            # ValueError): the patch may have been applied; we cannot tell.
            log.error("%s: unreadable answer: %s: %s%s", what, type(err).__name__, err,
                      _consequence(role))
            return False
        log.info("pod %s/%s labelled %s=%s", self.namespace, self.pod, ROLE_LABEL, role)
        return True

    def close(self) -> None:
        """Close the connection pool."""
        if self.client is not None:
            self.client.close()  # type: ignore[no-untyped-call]


def _status(err: ApiException) -> str:
    status = int(err.status or 0)
    message = f"{status} {err.reason or ''}".rstrip()
    if status in (401, 403):
        message += (" (the controller's ServiceAccount needs patch on pods in its own"
                    f" namespace: {RBAC_FILE})")
    elif status == 404:
        message += " (no such pod: POD_NAME and POD_NAMESPACE must come from the downward API)"
    return message


def _consequence(role: Role) -> str:
    if role == "active":
        return ("; the Service that selects the active controller by this label has no"
                " endpoint: agents cannot report until this pod is labelled")
    return ("; if this pod still carries the label active, the Service sends agents to this"
            " standby (they get 503 and retry)")
