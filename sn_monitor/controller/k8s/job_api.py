"""DistributedJobs on the API server: list, watch, and write status (imports ``kubernetes``).

The :class:`~.watch.WatchApi` the controller's job watch uses. The watch is read as a
raw stream (``_preload_content=False``) and parsed line by line (:func:`.watch.parse_event`),
so that a 410 Gone and a broken stream are ours to classify; status is written as a JSON
merge patch on the status subresource. Every call carries ``kubernetes.timeout``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException, OpenApiException

from sn_monitor.controller.k8s.client import api_client
from sn_monitor.controller.k8s.settings import KubernetesSettings
from sn_monitor.controller.k8s.watch import (
    Gone,
    ObjectList,
    WatchError,
    WatchEvent,
    parse_event,
    split_lines,
)

GROUP, VERSION, PLURAL = "training.ai", "v1", "distributedjobs"

#: Every CustomObjectsApi method this module calls and the RBAC (resource, verb) it
#: needs; tests/integration/test_kubernetes_manifests.py checks controller-rbac.yaml.
JOB_API_CALLS = {
    "list_cluster_custom_object": (PLURAL, "list"),            # list, and watch=True
    "list_namespaced_custom_object": (PLURAL, "list"),
    "patch_namespaced_custom_object_status": (f"{PLURAL}/status", "patch"),
}
#: The server ends a watch after this long; we then watch again from the last version.
WATCH_SECONDS = 300


class DistributedJobApi:
    """DistributedJobs in ``namespace`` (None: every namespace)."""

    def __init__(self, settings: KubernetesSettings, namespace: str | None,
                 api: k8s.CustomObjectsApi | None = None) -> None:
        self.namespace = namespace
        self.timeout = float(settings.timeout)
        self.api = api if api is not None else k8s.CustomObjectsApi(api_client(settings))
        self._lock = threading.Lock()
        self._response: Any = None

    def _list(self, **kwargs: Any) -> Any:
        if self.namespace is None:
            return self.api.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kwargs)
        return self.api.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                      **kwargs)

    def list(self) -> ObjectList:
        try:
            doc = self._list(_request_timeout=self.timeout)
        except ApiException as err:
            raise _error(err) from None
        except (OpenApiException, urllib3.exceptions.HTTPError, OSError) as err:
            raise WatchError(f"cannot list DistributedJobs: {err}") from None
        if not isinstance(doc, dict):
            raise WatchError(f"a DistributedJob list that is not an object: {type(doc)}")
        meta = doc.get("metadata") or {}
        items = [i for i in doc.get("items") or [] if isinstance(i, dict)]
        return ObjectList(items=items, resource_version=str(meta.get("resourceVersion", "")))

    def watch(self, resource_version: str) -> Iterator[WatchEvent]:
        try:
            response = self._list(watch=True, resource_version=resource_version,
                                  allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS,
                                  _preload_content=False,
                                  _request_timeout=(self.timeout, WATCH_SECONDS + self.timeout))
        except ApiException as err:
            raise _error(err) from None
        except (OpenApiException, urllib3.exceptions.HTTPError, OSError) as err:
            raise WatchError(f"cannot watch DistributedJobs: {err}") from None
        status = getattr(response, "status", 200)
        if status >= 400:
            body = response.read()
            response.release_conn()
            raise _error(ApiException(status=status, reason=str(body[:200])))
        with self._lock:
            self._response = response
        try:
            for line in split_lines(response.stream(64 * 1024)):
                yield parse_event(line)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            raise WatchError(f"the watch stream broke: {err}") from None
        finally:
            with self._lock:
                self._response = None
            response.release_conn()

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": status},
                _content_type="application/merge-patch+json", _request_timeout=self.timeout)
        except ApiException as err:
            raise WatchError(f"status of {namespace}/{name} not written: "
                             f"{err.status} {err.reason}") from None
        except (OpenApiException, urllib3.exceptions.HTTPError, OSError) as err:
            raise WatchError(f"status of {namespace}/{name} not written: {err}") from None

    def close(self) -> None:
        with self._lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()
            except (AttributeError, OSError):
                response.close()


def _error(err: ApiException) -> WatchError:
    if err.status == 410:
        return Gone(f"410 Gone: {err.reason}")
    return WatchError(f"the API server answered {err.status} {err.reason}")


__all__ = ["JOB_API_CALLS", "DistributedJobApi"]
