"""Cordon, uncordon and evict through the Kubernetes API (``kubernetes`` client, CoreV1Api).

* **cordon**: one patch sets ``spec.unschedulable``, adds the taint
  ``sn-monitor.io/unhealthy=<rule>:NoSchedule`` and the annotation
  ``sn-monitor.io/cordoned-by: sn-monitor``. The annotation is how we know a cordon is
  ours: a node that an operator cordoned keeps their cordon (we add only our taint).
* **uncordon** undoes only our own cordon: it refuses (PermanentError) when the node is
  unschedulable without our annotation. An already schedulable node is success (so a
  retry after a lost reply is harmless).
* **evict** first cordons (as ``kubectl drain`` does, or the pods come straight back;
  setting ``cordon_before_evict``), then creates a policy/v1 Eviction for every pod on
  the node except DaemonSet pods (their controller ignores cordons and would recreate
  them) and mirror pods (static pods: the kubelet owns them). Evictions respect
  PodDisruptionBudgets: a 429 means a budget would be violated, so the pod stays and the
  action raises TemporaryError with ``retry_after`` after trying every other pod; a 404
  means the pod is already gone, which is what we wanted.

Node patches carry the ``resourceVersion`` that was read, so a concurrent change makes
the API answer 409 and the runner retries on a fresh read instead of overwriting it
(``spec.taints`` has no merge key: a patch replaces the whole list).

Node names are Kubernetes node names: the agent's ``node`` is assumed to be the node
name (the DaemonSet sets it from ``spec.nodeName``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException, OpenApiException

from sn_monitor.controller.actions.base import Outcome, PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.http import TEMPORARY_STATUS
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.k8s.client import api_client
from sn_monitor.controller.k8s.settings import KubernetesSettings
from sn_monitor.transport import parse_retry_after

log = logging.getLogger(__name__)
T = TypeVar("T")

CORDONED_BY = "sn-monitor.io/cordoned-by"
CORDON_REASON = "sn-monitor.io/cordon-reason"
OWNER = "sn-monitor"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
#: Annotation values are limited only by object size; keep ours readable.
MAX_REASON = 256


def api_error(err: ApiException, what: str) -> TemporaryError | PermanentError:
    """Map an API error to the action error model."""
    status = int(err.status or 0)
    message = f"{what}: {status} {err.reason or ''}".strip()
    if status == 0 or status >= 500 or status in TEMPORARY_STATUS:
        headers = err.headers or {}
        return TemporaryError(message, retry_after=parse_retry_after(headers.get("Retry-After")))
    return PermanentError(message)


class KubernetesDriver:
    """cordon / uncordon / evict one node (``ActionRequest.action`` decides)."""

    name = "kubernetes"
    #: Each action checks the node first: running it twice does nothing more.
    idempotent = True
    actions = frozenset({"cordon", "uncordon", "evict"})

    def __init__(self, settings: KubernetesSettings | None = None) -> None:
        self.settings = settings or KubernetesSettings()
        self.client = api_client(self.settings)
        self.api = k8s.CoreV1Api(self.client)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ actions

    def run(self, request: ActionRequest) -> Outcome:
        """Carry out cordon, uncordon or evict on ``request.node``."""
        node = self._node_name(request)
        if request.action == "cordon":
            return self._cordon(node, request)
        if request.action == "uncordon":
            return self._uncordon(node)
        if request.action == "evict":
            return self._evict(node, request)
        raise PermanentError(f"the kubernetes driver cannot {request.action}")

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Was ``request`` already carried out? None when the API cannot tell us now."""
        node = self._node_name(request)
        try:
            if request.action == "cordon":
                found = self._read_node(node)
                return bool(found.spec and found.spec.unschedulable)
            if request.action == "uncordon":
                found = self._read_node(node)
                return not (found.spec and found.spec.unschedulable)
            if request.action == "evict":
                return not self._evictable_pods(node)
        except TemporaryError as err:
            log.warning("kubernetes: cannot reconcile %s on %s: %s", request.action, node, err)
            return None
        return None

    def _cordon(self, node: str, request: ActionRequest) -> Outcome:
        found = self._read_node(node)
        spec = found.spec or k8s.V1NodeSpec()
        annotations = dict((found.metadata and found.metadata.annotations) or {})
        ours = annotations.get(CORDONED_BY) == OWNER
        taints = self._taints(found)
        has_taint = any(t.get("key") == self.settings.taint_key for t in taints)
        if spec.unschedulable and has_taint and ours:
            return Outcome(f"node {node} already cordoned", {"changed": False})
        value = _taint_value(request.rule or request.action)
        others = [t for t in taints if t.get("key") != self.settings.taint_key]
        taint = {"key": self.settings.taint_key, "value": value, "effect": "NoSchedule"}
        metadata: dict[str, Any] = {"resourceVersion": _resource_version(found)}
        if not spec.unschedulable or ours:
            # Claim the cordon only when it is ours to claim: someone else's cordon stays
            # theirs (and uncordon will refuse to lift it).
            metadata["annotations"] = {CORDONED_BY: OWNER,
                                       CORDON_REASON: request.reason[:MAX_REASON]}
        body = {"metadata": metadata,
                "spec": {"unschedulable": True, "taints": [*others, taint]}}
        self._call(f"patch node {node}", lambda: self.api.patch_node(
            node, body, _request_timeout=self.settings.timeout))
        if "annotations" not in metadata:
            return Outcome(f"node {node} was already cordoned by someone else; added taint",
                           {"changed": True, "owner": "other"})
        return Outcome(f"cordoned node {node}", {"changed": True, "taint": taint})

    def _uncordon(self, node: str) -> Outcome:
        found = self._read_node(node)
        spec = found.spec or k8s.V1NodeSpec()
        annotations = dict((found.metadata and found.metadata.annotations) or {})
        taints = self._taints(found)
        kept = [t for t in taints if t.get("key") != self.settings.taint_key]
        if annotations.get(CORDONED_BY) != OWNER:
            if spec.unschedulable:
                raise PermanentError(
                    f"node {node} was cordoned by someone else (no {CORDONED_BY} annotation):"
                    " not uncordoning it")
            if len(kept) == len(taints):
                return Outcome(f"node {node} already schedulable", {"changed": False})
        body = {
            "metadata": {"resourceVersion": _resource_version(found),
                         "annotations": {CORDONED_BY: None, CORDON_REASON: None}},
            "spec": {"unschedulable": None, "taints": kept or None},
        }
        self._call(f"patch node {node}", lambda: self.api.patch_node(
            node, body, _request_timeout=self.settings.timeout))
        return Outcome(f"uncordoned node {node}", {"changed": True})

    def _evict(self, node: str, request: ActionRequest) -> Outcome:
        if self.settings.cordon_before_evict:
            self._cordon(node, request)
        pods = self._evictable_pods(node)
        evicted: list[str] = []
        gone: list[str] = []
        blocked: list[str] = []
        waits: list[float] = []
        for pod in pods:
            namespace, name = _pod_ref(pod)
            what = f"{namespace}/{name}"
            eviction = k8s.V1Eviction(
                api_version="policy/v1", kind="Eviction",
                metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
                delete_options=(
                    None if self.settings.grace_period_seconds is None
                    else k8s.V1DeleteOptions(
                        grace_period_seconds=self.settings.grace_period_seconds)),
            )
            try:
                self.api.create_namespaced_pod_eviction(
                    name, namespace, eviction, _request_timeout=self.settings.timeout)
            except ApiException as err:
                if err.status == 404:
                    gone.append(what)
                    continue
                if err.status == 429:
                    blocked.append(what)
                    wait = parse_retry_after((err.headers or {}).get("Retry-After"))
                    waits.append(wait if wait is not None else self.settings.eviction_retry_after)
                    continue
                raise api_error(err, f"evict pod {what}") from None
            except (urllib3.exceptions.HTTPError, OpenApiException) as err:
                raise TemporaryError(f"evict pod {what}: {type(err).__name__}") from None
            evicted.append(what)
        details = {"evicted": evicted, "gone": gone, "blocked": blocked}
        if blocked:
            log.info("kubernetes: evictions on %s blocked by disruption budgets: %s",
                     node, ", ".join(blocked))
            raise TemporaryError(
                f"{len(blocked)} pod(s) on {node} protected by a PodDisruptionBudget: "
                f"{', '.join(blocked)} (evicted {len(evicted)})", retry_after=min(waits))
        return Outcome(f"evicted {len(evicted)} pod(s) from node {node}", details)

    # ------------------------------------------------------------------ helpers

    def _node_name(self, request: ActionRequest) -> str:
        if not request.node:
            raise PermanentError(f"{request.action} needs a node")
        return request.node

    def _read_node(self, node: str) -> k8s.V1Node:
        return self._call(f"read node {node}", lambda: self.api.read_node(
            node, _request_timeout=self.settings.timeout))

    def _taints(self, node: k8s.V1Node) -> list[dict[str, Any]]:
        """The node's taints as patch JSON (a patch replaces the whole list)."""
        out: list[dict[str, Any]] = []
        for taint in (node.spec and node.spec.taints) or []:
            item: dict[str, Any] = {"key": taint.key, "effect": taint.effect}
            if taint.value is not None:
                item["value"] = taint.value
            if taint.time_added is not None:
                item["timeAdded"] = taint.time_added.strftime("%Y-%m-%dT%H:%M:%SZ")
            out.append(item)
        return out

    def _evictable_pods(self, node: str) -> list[k8s.V1Pod]:
        """Pods an eviction should move: not DaemonSet, not mirror, not finished."""
        pods = self._call(f"list pods on {node}", lambda: self.api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _request_timeout=self.settings.timeout))
        return [pod for pod in pods.items if _evictable(pod)]

    def _call(self, what: str, call: Callable[[], T]) -> T:
        """Run one API call; every failure becomes TemporaryError or PermanentError."""
        try:
            return call()
        except ApiException as err:
            if err.status == 404:
                raise PermanentError(f"{what}: not found") from None
            raise api_error(err, what) from None
        except urllib3.exceptions.HTTPError as err:
            raise TemporaryError(f"{what}: {type(err).__name__}") from None
        except (OpenApiException, ValueError) as err:
            # A request the client refused to build, or an answer it could not read
            # (pydantic's ValidationError is a ValueError): retrying will not change it.
            raise PermanentError(f"{what}: {type(err).__name__}: {err}") from None


def _evictable(pod: k8s.V1Pod) -> bool:
    meta = pod.metadata or k8s.V1ObjectMeta()
    if MIRROR_ANNOTATION in (meta.annotations or {}):
        return False
    if any(ref.kind == "DaemonSet" for ref in meta.owner_references or []):
        return False
    phase = pod.status.phase if pod.status else None
    return phase not in ("Succeeded", "Failed")


def _pod_ref(pod: k8s.V1Pod) -> tuple[str, str]:
    meta = pod.metadata or k8s.V1ObjectMeta()
    return meta.namespace or "default", meta.name or ""


def _resource_version(node: k8s.V1Node) -> str | None:
    return node.metadata.resource_version if node.metadata else None


def _taint_value(text: str) -> str:
    """A valid label value (<= 63 chars of [A-Za-z0-9._-], alphanumeric at both ends)."""
    clean = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in text)
    return clean[:63].strip("._-")
