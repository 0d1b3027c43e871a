"""Job control through Kubernetes: the job's operator restarts its pods, we only remove them.

A DistributedJob that runs on Kubernetes (a Kubeflow PyTorchJob, a JobSet, an Indexed
Job, a StatefulSet...) names its pods with a label selector in a namespace::

    control:
      kubernetes:
        namespace: ml
        selector: {training.kubeflow.org/job-name: trillion}
        gracePeriodSeconds: 30       # optional: the pods' own grace period when unset
        # API access, as for the controller's kubernetes driver (all optional):
        # host: http://127.0.0.1:8001, kubeconfig: ~/.kube/config, context: prod, timeout: 10s

* **restore** and **failover** delete the job's pods that run on the failed nodes, so
  that the job's operator recreates them and the scheduler places them elsewhere (the
  orchestrator evicts, i.e. cordons, a failed node before it restores, so it is not
  picked again). Which nodes failed: ``request.node`` (a failover names it) and
  ``params["failed_nodes"]`` when given; a ``restore`` from the orchestrator carries
  only the job's new node list ``params["nodes"]``, and then every node *not* in that
  list counts as failed. The selector should therefore match the pods that run on the
  job's (GPU) nodes: a launcher pod on a CPU node outside the list would be deleted too.
  Pods not yet scheduled are never touched, nor pods created after the action was
  requested (the replacements an earlier attempt caused: a retry does not kill them;
  this compares the API server's ``creationTimestamp`` with the controller's clock, so
  both should be NTP-synced). A pod already terminating is left alone, except with
  ``gracePeriodSeconds: 0``, which deletes it again: that is how a pod stuck in
  ``Terminating`` on a dead node is force-removed so that its replacement can start.
  The checkpoint to resume from (``params["checkpoint"]``) is not something Kubernetes
  can pass on: the restarted ranks learn it from the controller (the training client's
  progress replies carry it).
* **checkpoint** annotates the job's running pods with
  ``sn-monitor.io/checkpoint-requested: <checkpoint_id>``. A pod sees its own
  annotations through a downward-API volume (``fieldRef: metadata.annotations``), which
  the kubelet refreshes. This is a secondary channel: the training client's
  ``should_checkpoint()`` (the controller's progress replies) is the primary one, so a
  job that uses the client needs nothing else. Pods that already carry the id are not
  patched again.

Errors: 404 means the pod is already gone (what we wanted); 409, 429, 5xx and transport
errors are temporary; other API errors (403: the controller's service account may not
delete or patch pods in the namespace) are permanent. A run whose pods are all done (no
job pod left on a failed node / every running pod annotated) is success, so retries and
:meth:`KubernetesJobControl.reconcile` are safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException, OpenApiException

from sn_monitor.controller.actions.base import Outcome, PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.kubernetes import api_error
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.k8s.client import api_client
from sn_monitor.controller.k8s.settings import KubernetesJobSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

CHECKPOINT_ANNOTATION = "sn-monitor.io/checkpoint-requested"

class KubernetesJobControl:
    """checkpoint / restore / failover for one job's pods (see the module docstring)."""

    name = "kubernetes"
    #: Each action looks at the pods first: running it twice does nothing more.
    idempotent = True
    actions = frozenset({"checkpoint", "restore", "failover"})

    def __init__(self, settings: KubernetesJobSettings) -> None:
        self.settings = settings
        self.client = api_client(settings.api_settings())
        self.api = k8s.CoreV1Api(self.client)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ actions

    def run(self, request: ActionRequest) -> Outcome:
        if request.action in ("restore", "failover"):
            return self._delete_failed(request)
        if request.action == "checkpoint":
            return self._annotate(request)
        raise PermanentError(f"kubernetes job control cannot {request.action}")

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Done when no pod is left to delete (restore) or to annotate (checkpoint)."""
        try:
            if request.action in ("restore", "failover"):
                return not self._to_delete(request, self._pods())[0]
            if request.action == "checkpoint":
                return not self._to_annotate(_checkpoint_id(request), self._pods())
        except TemporaryError as err:
            log.warning("kubernetes job control: cannot reconcile %s: %s", request.action, err)
        except PermanentError:
            return None
        return None

    def _delete_failed(self, request: ActionRequest) -> Outcome:
        pods = self._pods()
        targets, failed = self._to_delete(request, pods)
        deleted: list[str] = []
        gone: list[str] = []
        options = (None if self.settings.grace_period_seconds is None else
                   k8s.V1DeleteOptions(grace_period_seconds=self.settings.grace_period_seconds))
        for pod in targets:
            name = _name(pod)
            try:
                self.api.delete_namespaced_pod(
                    name, self.settings.namespace, body=options,
                    _request_timeout=self.settings.timeout)
            except ApiException as err:
                if err.status == 404:
                    gone.append(name)
                    continue
                raise api_error(err, f"delete pod {self.settings.namespace}/{name}") from None
            except (urllib3.exceptions.HTTPError, OpenApiException) as err:
                raise TemporaryError(
                    f"delete pod {self.settings.namespace}/{name}: {type(err).__name__}"
                ) from None
            deleted.append(name)
        where = ", ".join(failed) if failed else "no failed node"
        details: dict[str, Any] = {"namespace": self.settings.namespace,
                                   "selector": self.settings.label_selector,
                                   "failed_nodes": failed, "deleted": deleted, "gone": gone}
        if not targets:
            return Outcome(f"no pod of the job left on {where}", {**details, "changed": False})
        return Outcome(f"deleted {len(deleted)} pod(s) of the job on {where}; its operator "
                       "recreates them", {**details, "changed": bool(deleted)})

    def _annotate(self, request: ActionRequest) -> Outcome:
        checkpoint_id = _checkpoint_id(request)
        targets = self._to_annotate(checkpoint_id, self._pods())
        annotated: list[str] = []
        body = {"metadata": {"annotations": {CHECKPOINT_ANNOTATION: checkpoint_id}}}
        for pod in targets:
            name = _name(pod)
            try:
                self.api.patch_namespaced_pod(name, self.settings.namespace, body,
                                              _request_timeout=self.settings.timeout)
            except ApiException as err:
                if err.status == 404:
                    continue  # gone meanwhile: nothing to tell it
                raise api_error(err, f"annotate pod {self.settings.namespace}/{name}") from None
            except (urllib3.exceptions.HTTPError, OpenApiException) as err:
                raise TemporaryError(
                    f"annotate pod {self.settings.namespace}/{name}: {type(err).__name__}"
                ) from None
            annotated.append(name)
        return Outcome(f"asked {len(annotated)} pod(s) to checkpoint ({CHECKPOINT_ANNOTATION}="
                       f"{checkpoint_id})",
                       {"annotation": CHECKPOINT_ANNOTATION, "checkpoint_id": checkpoint_id,
                        "annotated": annotated, "changed": bool(annotated)})

    # ------------------------------------------------------------------ helpers

    def _pods(self) -> list[k8s.V1Pod]:
        what = f"list pods {self.settings.label_selector} in {self.settings.namespace}"
        found = self._call(what, lambda: self.api.list_namespaced_pod(
            self.settings.namespace, label_selector=self.settings.label_selector,
            _request_timeout=self.settings.timeout))
        return list(found.items or [])

    def _to_delete(self, request: ActionRequest,
                   pods: Iterable[k8s.V1Pod]) -> tuple[list[k8s.V1Pod], list[str]]:
        """The pods to delete and the failed nodes (sorted) they were chosen by."""
        explicit = _failed_nodes(request)
        keep = _node_list(request.params.get("nodes"))
        if not explicit and keep is None:
            raise PermanentError(f"{request.action} names no failed node (node, "
                                 "params.failed_nodes) and no node list (params.nodes)")
        force = self.settings.grace_period_seconds == 0
        out: list[k8s.V1Pod] = []
        seen: set[str] = set(explicit)
        for pod in pods:
            node = pod.spec.node_name if pod.spec else None
            if not node:
                continue  # not scheduled: on no node, failed or not
            failed = node in explicit if explicit else node not in (keep or set())
            if not failed or _created_after(pod, request.created_seconds):
                continue
            if _terminating(pod) and not force:
                continue
            seen.add(node)
            out.append(pod)
        return out, sorted(seen)

    def _to_annotate(self, checkpoint_id: str, pods: Iterable[k8s.V1Pod]) -> list[k8s.V1Pod]:
        out = []
        for pod in pods:
            phase = pod.status.phase if pod.status else None
            if phase != "Running" or _terminating(pod):
                continue
            annotations = (pod.metadata and pod.metadata.annotations) or {}
            if annotations.get(CHECKPOINT_ANNOTATION) != checkpoint_id:
                out.append(pod)
        return out

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except ApiException as err:
            raise api_error(err, what) from None
        except urllib3.exceptions.HTTPError as err:
            raise TemporaryError(f"{what}: {type(err).__name__}") from None
        except (OpenApiException, ValueError) as err:
            raise PermanentError(f"{what}: {type(err).__name__}: {err}") from None


def _failed_nodes(request: ActionRequest) -> set[str]:
    out = {request.node} if request.node else set()
    out |= _node_list(request.params.get("failed_nodes")) or set()
    return out


def _node_list(value: Any) -> set[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return {value}
    if isinstance(value, list | tuple | set | frozenset):
        return {str(v) for v in value}
    raise PermanentError(f"expected a list of node names, got {value!r}")


def _checkpoint_id(request: ActionRequest) -> str:
    value = request.params.get("checkpoint_id")
    return str(value) if value else request.id


def _name(pod: k8s.V1Pod) -> str:
    return (pod.metadata.name if pod.metadata else None) or ""


def _terminating(pod: k8s.V1Pod) -> bool:
    return bool(pod.metadata and pod.metadata.deletion_timestamp)


def _created_after(pod: k8s.V1Pod, requested: float) -> bool:
    created = pod.metadata.creation_timestamp if pod.metadata else None
    if requested <= 0 or created is None:
        return False
    return bool(created.timestamp() >= requested)


__all__ = ["CHECKPOINT_ANNOTATION", "KubernetesJobControl"]
