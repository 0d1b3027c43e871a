"""Report labels (supernode, rack) from this node's Kubernetes Node, on a thread of its own.

The downward API gives a pod its node's name (``spec.nodeName``) but not the Node's
labels, so the agent reads its own Node: ``GET /api/v1/nodes/{name}`` with the pod's
service account token, over plain HTTPS (no ``kubernetes`` client: it is an optional
extra of the controller). The token file is read for every request (a projected token is
renewed by the kubelet); ``requests`` is imported only when the feature is on.

:func:`node_labels` is the pure part (a Node document and the map -> report labels);
:class:`NodeReader` does one read and turns each way it can fail into one
:class:`NodeLabelsError` whose message says what to fix (a 403 names the missing RBAC
rule); :class:`NodeLabelLoop` reads at start and every ``interval`` (sooner after a
failure), merges the mapped labels under the configured ones (those win) and hands the
result on. A failed read is logged and the labels from the last good one stay.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sn_monitor.agent.settings import NodeLabelSettings
from sn_monitor.errors import SnMonitorError
from sn_monitor.transport import TokenError, describe_failure, error_text, read_token, redact_url

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)

#: After a failed read, the next comes this soon (or after ``interval``, if shorter): an
#: RBAC binding applied after the DaemonSet is picked up within a minute.
RETRY_SECONDS = 30.0
#: A Node document is tens of kilobytes (its images list included); more is not a Node.
MAX_BODY_BYTES = 4 << 20
#: A report label value is at most this long (:data:`sn_monitor.model.LabelValue`).
MAX_VALUE_LENGTH = 128


class NodeLabelsError(SnMonitorError):
    """The Node could not be read; the message says why and what to fix."""


def in_cluster_url(environ: Mapping[str, str]) -> str | None:
    """``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``; None outside a pod."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = environ.get("KUBERNETES_SERVICE_PORT", "").strip() or "443"
    if not host:
        return None
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"https://{host}:{port}"


def node_labels(document: Any, mapping: Mapping[str, str]) -> dict[str, str]:
    """The report labels ``mapping`` takes from a Node ``document`` (parsed JSON).

    Raises ValueError when ``document`` is not a Node. A Node label that is missing,
    empty, not a string or too long for a report is left out.
    """
    if not isinstance(document, dict) or document.get("kind", "Node") != "Node":
        raise ValueError("the answer is not a Node object")
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        raise ValueError("the Node has no metadata")
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict):
        raise ValueError("the Node's metadata.labels is not a mapping")
    found: dict[str, str] = {}
    for name, key in mapping.items():
        value = labels.get(key)
        if isinstance(value, str) and 0 < len(value) <= MAX_VALUE_LENGTH:
            found[name] = value
    return found


class NodeReader:
    """Reads one Node from the API server with the pod's service account."""

    def __init__(self, settings: NodeLabelSettings, api_url: str,
                 session: requests.Session | None = None) -> None:
        self._settings = settings
        self._url = api_url.rstrip("/")
        self._session = session
        self._owns_session = session is None

    @property
    def url(self) -> str:
        return self._url

    def read(self, name: str) -> Any:
        """The Node ``name`` as parsed JSON; :class:`NodeLabelsError` says what failed."""
        import requests  # only when the feature is on (requests is ~16 MB of RSS)

        try:
            token = read_token(self._settings.token_file)
        except TokenError as err:
            raise NodeLabelsError(f"{err} (the service account token: is "
                                  "automountServiceAccountToken on for the pod?)") from None
        verify: bool | str = True
        if self._url.startswith("https://"):
            if not Path(self._settings.ca_file).is_file():
                raise NodeLabelsError(f"no CA file at {self._settings.ca_file} to check the "
                                      "API server's certificate with")
            verify = self._settings.ca_file
        if self._session is None:
            self._session = requests.Session()
            self._session.trust_env = False  # no proxy between a pod and its API server
        url = f"{self._url}/api/v1/nodes/{quote(name, safe='')}"
        where = redact_url(self._url)
        try:
            answer = self._session.get(url, headers={"Authorization": f"Bearer {token}",
                                                     "Accept": "application/json"},
                                       timeout=float(self._settings.timeout), verify=verify)
            body, status = answer.content, answer.status_code
        except (requests.RequestException, OSError) as err:
            raise NodeLabelsError(f"cannot read Node {name} from {where}: "
                                  f"{describe_failure(err)}") from None
        if status != 200:
            raise NodeLabelsError(_refusal(status, name, error_text(body)))
        if len(body) > MAX_BODY_BYTES:
            raise NodeLabelsError(f"the answer for Node {name} is over {MAX_BODY_BYTES} bytes")
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as err:
            raise NodeLabelsError(f"the answer for Node {name} is not JSON: {err}") from None

    def close(self) -> None:
        if self._owns_session and self._session is not None:
            self._session.close()
            self._session = None


def _refusal(status: int, name: str, text: str) -> str:
    """What a non-200 answer means, and what to change."""
    if status == 401:
        why = ("the API server does not take the service account token (expired, or "
               "from another cluster)")
    elif status == 403:
        why = ("the agent's service account may not read Nodes: it needs a ClusterRole "
               "with apiGroups [\"\"], resources [nodes], verbs [get], bound to it "
               "(deploy/kubernetes/agent-rbac.yaml)")
    elif status == 404:
        why = (f"no Node named {name}: the agent's node name (node, --node, $NODE_NAME) "
               "must be the Kubernetes node name (the downward API's spec.nodeName)")
    else:
        why = "the API server failed the request"
    return f"reading Node {name} answered HTTP {status}: {why}" + (f"; it said: {text}"
                                                                   if text else "")


class NodeLabelLoop:
    """Reads the Node now and every ``interval``; hands on the labels when they change.

    What ``deliver`` gets is the mapped Node labels under ``configured`` (those win).
    """

    def __init__(
        self,
        settings: NodeLabelSettings,
        node: str,
        configured: Mapping[str, str],
        deliver: Callable[[dict[str, str]], None],
        read: Callable[[str], Any],
        *,
        retry: float = RETRY_SECONDS,
    ) -> None:
        self._settings = settings
        self._node = node
        self._configured = dict(configured)
        self._deliver = deliver
        self._read = read
        self._period = float(settings.interval)
        self._retry = min(retry, self._period)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-node-labels", daemon=True)
        self._last_error: str | None = None
        #: The labels from the Node's last good read (None: none read yet).
        self.from_node: dict[str, str] | None = None
        #: The labels handed on last (None: none yet).
        self.labels: dict[str, str] | None = None

    def start(self) -> None:
        self._thread.start()

    def read_once(self) -> bool:
        """One read; False when it failed (logged; the labels read before stay)."""
        try:
            found = node_labels(self._read(self._node), self._settings.mapping)
        except NodeLabelsError as err:
            self._failed(str(err))
            return False
        except ValueError as err:
            self._failed(f"Node {self._node}: {err}")
            return False
        if self._last_error is not None:
            log.info("Node %s read again", self._node, extra={"node": self._node})
            self._last_error = None
        if found != self.from_node:
            self._note(found)
        self.from_node = found
        labels = {**found, **self._configured}
        if labels != self.labels:
            self.labels = labels
            self._deliver(dict(labels))
        return True

    def _note(self, found: dict[str, str]) -> None:
        missing = {name: key for name, key in self._settings.mapping.items()
                   if name not in found}
        overridden = sorted(name for name in found if name in self._configured)
        log.info("labels from Node %s: %s%s%s", self._node,
                 ", ".join(f"{k}={v}" for k, v in sorted(found.items())) or "none",
                 "; not on the Node: " + ", ".join(f"{k} ({v})" for k, v in
                                                  sorted(missing.items())) if missing else "",
                 "; the config's own win for " + ", ".join(overridden) if overridden else "",
                 extra={"node": self._node})

    def _failed(self, message: str) -> None:
        kept = ("keeping the labels read before" if self.from_node is not None
                else "reporting the config's labels only")
        level = logging.DEBUG if message == self._last_error else logging.WARNING
        log.log(level, "labels_from_node: %s; %s, next try in %.0f s", message, kept,
                self._retry, extra={"node": self._node})
        self._last_error = message

    def _run(self) -> None:
        while not self._stop.is_set():
            ok = False
            try:
                ok = self.read_once()
            except Exception:  # the loop must outlive a bug in one read; it is logged
                log.exception("reading the Node's labels failed", extra={"node": self._node})
            if self._stop.wait(self._period if ok else self._retry):
                return

    def stop(self, timeout: float) -> None:
        """Stop after the read running now, if any (waits at most ``timeout``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)


def build_node_label_loop(settings: NodeLabelSettings, node: str,
                          configured: Mapping[str, str],
                          deliver: Callable[[dict[str, str]], None],
                          environ: Mapping[str, str] | None = None,
                          ) -> tuple[NodeLabelLoop, NodeReader] | None:
    """The loop for ``settings`` (None, logged, when no API server address is known)."""
    url = settings.api_url or in_cluster_url(os.environ if environ is None else environ)
    if url is None:
        log.error("labels_from_node is on but KUBERNETES_SERVICE_HOST is not set (not in a "
                  "pod?): set labels_from_node.api_url; reporting the config's labels only",
                  extra={"node": node})
        return None
    reader = NodeReader(settings, url)
    return NodeLabelLoop(settings, node, configured, deliver, reader.read), reader
