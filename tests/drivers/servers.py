"""Real HTTP servers on 127.0.0.1 that stand in for webhooks, Slack, Alertmanager and the
Kubernetes API, and a fake ``scontrol``: the drivers under test use their real clients.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


@dataclass(frozen=True)
class Reply:
    """A scripted answer: status, body, headers, and a delay before answering."""

    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


class _Base:
    """Start/stop and the request log shared by both servers."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                split = urllib.parse.urlsplit(self.path)
                record = Recorded(self.command, split.path, urllib.parse.parse_qs(split.query),
                                  dict(self.headers.items()), body)
                with owner.lock:
                    owner.requests.append(record)
                status, payload, headers, delay = owner.answer(record)
                if delay:
                    owner._stop.wait(delay)
                try:
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True, name=type(self).__name__)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def answer(self, record: Recorded) -> tuple[int, bytes, dict[str, str], float]:
        raise NotImplementedError

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self._stop.is_set():
            return  # stopped already (a test that takes a server down)
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> _Base:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def calls(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests
                    if (method is None or r.method == method)
                    and (path is None or r.path == path)]


class RecordingHTTPServer(_Base):
    """Records every request; answers per path from a script (the last reply repeats).

    ``server.script("/hook", Reply(503), Reply(503), Reply(200))``: two 503s, then 200s.
    Paths without a script get ``default`` (200 ``ok``).
    """

    def __init__(self, default: Reply | None = None) -> None:
        super().__init__()
        self.default = default or Reply()
        self._scripts: dict[str, list[Reply]] = {}

    def script(self, path: str, *replies: Reply) -> None:
        with self.lock:
            self._scripts[path] = list(replies)

    def answer(self, record: Recorded) -> tuple[int, bytes, dict[str, str], float]:
        with self.lock:
            queue = self._scripts.get(record.path)
            if not queue:
                reply = self.default
            elif len(queue) > 1:
                reply = queue.pop(0)
            else:
                reply = queue[0]
        return reply.status, reply.body, reply.headers, reply.delay


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch (null deletes; lists replace)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = json.loads(json.dumps(value))
    return target


class StubKubernetesAPI(_Base):
    """Just enough of the Kubernetes API for the drivers: nodes, pods, evictions.

    Node patches (merge or strategic-merge JSON: both applied as a merge patch, which is
    right for the fields we touch) honour ``metadata.resourceVersion`` (409 on a stale
    one) and bump it. Evicting a pod removes it, unless it is in ``pdb_protected`` (429)
    or unknown (404). Pods in a namespace can be listed by ``labelSelector`` (equality
    terms, ``a=b,c=d``), patched (merge) and deleted (404 when unknown). ``fail_next``
    fails the next requests, whatever they are; ``fail_method["DELETE"]`` the next ones
    of that method. Every call is in ``requests``.

    coordination.k8s.io/v1 Leases (leader election) as the API server keeps them: GET
    of a missing one is a 404 Status, POST of an existing one 409 AlreadyExists, PUT with
    a ``resourceVersion`` other than the current one 409 Conflict; every write bumps the
    version. Times must be ``MicroTime`` (RFC 3339, six fraction digits): 400 otherwise.
    """

    def __init__(self) -> None:
        super().__init__()
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pdb_protected: set[tuple[str, str]] = set()
        self.fail_next: list[int] = []
        self.fail_method: dict[str, list[int]] = {}
        self._version = 100

    def add_node(self, name: str, **spec: Any) -> None:
        with self.lock:
            self._version += 1
            self.nodes[name] = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "resourceVersion": str(self._version),
                             "annotations": {}, "labels": {}},
                "spec": dict(spec),
            }

    def add_pod(self, namespace: str, name: str, node: str | None, *, owner: str | None = None,
                mirror: bool = False, pdb: bool = False, phase: str = "Running",
                labels: dict[str, str] | None = None,
                created: str = "2024-05-01T10:00:00Z", deleting: bool = False) -> None:
        """A pod on ``node`` (None: not scheduled yet); ``created``: its creationTimestamp."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": {},
                                "labels": dict(labels or {}), "creationTimestamp": created}
        if deleting:
            meta["deletionTimestamp"] = "2024-05-01T11:00:00Z"
        if owner is not None:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner,
                                        "name": f"{name}-owner", "uid": f"uid-{name}"}]
        if mirror:
            meta["annotations"]["kubernetes.io/config.mirror"] = "hash"
        with self.lock:
            self.pods[(namespace, name)] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                                            "spec": {"nodeName": node,
                                                     "containers": [{"name": "main",
                                                                     "image": "busybox"}]},
                                            "status": {"phase": phase}}
            if pdb:
                self.pdb_protected.add((namespace, name))

    def node(self, name: str) -> dict[str, Any]:
        with self.lock:
            copy: dict[str, Any] = json.loads(json.dumps(self.nodes[name]))
        return copy

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            copy: dict[str, Any] = json.loads(json.dumps(self.pods[(namespace, name)]))
        return copy

    def lease(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            copy: dict[str, Any] = json.loads(json.dumps(self.leases[(namespace, name)]))
        return copy

    def answer(self, record: Recorded) -> tuple[int, bytes, dict[str, str], float]:
        with self.lock:
            if self.fail_next:
                return self._status(self.fail_next.pop(0), "InternalError", "scripted")
            if self.fail_method.get(record.method):
                return self._status(self.fail_method[record.method].pop(0), "InternalError",
                                    "scripted")
            return self._route(record)

    def _status(self, code: int, reason: str, message: str,
                headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str], float]:
        doc = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
               "reason": reason, "message": message}
        return code, json.dumps(doc).encode(), {"Content-Type": "application/json",
                                                **(headers or {})}, 0.0

    def _ok(self, doc: Any, code: int = 200) -> tuple[int, bytes, dict[str, str], float]:
        return code, json.dumps(doc).encode(), {"Content-Type": "application/json"}, 0.0

    def _route(self, record: Recorded) -> tuple[int, bytes, dict[str, str], float]:
        parts = [p for p in record.path.split("/") if p]
        if parts[:4] == ["apis", "coordination.k8s.io", "v1", "namespaces"] \
                and len(parts) in (6, 7) and parts[5] == "leases":
            return self._lease_route(record, parts[4], parts[6] if len(parts) == 7 else None)
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            node = self.nodes.get(parts[3])
            if node is None:
                return self._status(404, "NotFound", f'nodes "{parts[3]}" not found')
            if record.method == "GET":
                return self._ok(node)
            if record.method == "PATCH":
                patch = json.loads(record.body)
                wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
                if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
                    return self._status(409, "Conflict", "the object has been modified")
                _merge(node, patch)
                self._version += 1
                node["metadata"]["resourceVersion"] = str(self._version)
                return self._ok(node)
        if record.path == "/api/v1/pods" and record.method == "GET":
            selector = record.query.get("fieldSelector", [""])[0]
            _, _, node_name = selector.partition("spec.nodeName=")
            items = [p for p in self.pods.values() if p["spec"]["nodeName"] == node_name]
            return self._ok({"apiVersion": "v1", "kind": "PodList",
                             "metadata": {"resourceVersion": str(self._version)},
                             "items": items})
        if (len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"]
                and parts[4] == "pods" and record.method == "GET"):
            wanted = _selector(record.query.get("labelSelector", [""])[0])
            items = [p for (ns, _), p in sorted(self.pods.items()) if ns == parts[3]
                     and all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
            return self._ok({"apiVersion": "v1", "kind": "PodList",
                             "metadata": {"resourceVersion": str(self._version)},
                             "items": items})
        if (len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"]
                and parts[4] == "pods" and record.method in ("DELETE", "PATCH")):
            key = (parts[3], parts[5])
            pod = self.pods.get(key)
            if pod is None:
                return self._status(404, "NotFound", f'pods "{parts[5]}" not found')
            if record.method == "PATCH":
                _merge(pod, json.loads(record.body))
                return self._ok(pod)
            del self.pods[key]
            return self._ok(pod)
        if (len(parts) == 7 and parts[:3] == ["api", "v1", "namespaces"]
                and parts[4] == "pods" and parts[6] == "eviction" and record.method == "POST"):
            key = (parts[3], parts[5])
            if key not in self.pods:
                return self._status(404, "NotFound", f'pods "{parts[5]}" not found')
            if key in self.pdb_protected:
                return self._status(429, "TooManyRequests",
                                    "Cannot evict pod as it would violate the pod's "
                                    "disruption budget.")
            del self.pods[key]
            return self._ok({"kind": "Status", "apiVersion": "v1", "status": "Success"}, 201)
        return self._status(404, "NotFound", f"no route for {record.method} {record.path}")


    def _lease_route(self, record: Recorded, namespace: str,
                     name: str | None) -> tuple[int, bytes, dict[str, str], float]:
        if record.method == "GET" and name is not None:
            found = self.leases.get((namespace, name))
            if found is None:
                return self._status(404, "NotFound",
                                    f'leases.coordination.k8s.io "{name}" not found')
            return self._ok(found)
        if record.method not in ("POST", "PUT") or (record.method == "PUT") != bool(name):
            return self._status(405, "MethodNotAllowed", f"{record.method} {record.path}")
        doc = json.loads(record.body)
        meta = doc.setdefault("metadata", {})
        if name is not None and meta.get("name") != name:
            return self._status(400, "BadRequest", "the name of the object does not match")
        bad = [k for k in ("acquireTime", "renewTime")
               if k in (doc.get("spec") or {}) and not _MICRO_TIME.fullmatch(doc["spec"][k])]
        if bad:
            return self._status(400, "BadRequest", f"spec.{bad[0]}: not a MicroTime")
        key = (namespace, meta.get("name", ""))
        current = self.leases.get(key)
        if record.method == "POST":
            if current is not None:
                return self._status(409, "AlreadyExists",
                                    f'leases.coordination.k8s.io "{key[1]}" already exists')
            meta["creationTimestamp"] = "2024-05-01T10:00:00Z"
        else:
            if current is None:
                return self._status(404, "NotFound",
                                    f'leases.coordination.k8s.io "{name}" not found')
            if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return self._status(409, "Conflict",
                                    "Operation cannot be fulfilled on leases.coordination.k8s.io"
                                    f' "{name}": the object has been modified')
        self._version += 1
        meta.update(namespace=namespace, resourceVersion=str(self._version))
        doc.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
        self.leases[key] = doc
        return self._ok(doc, 201 if record.method == "POST" else 200)


#: metav1.MicroTime as the API server parses it (Go's RFC3339Micro layout).
_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")


def _selector(text: str) -> dict[str, str]:
    """An equality label selector ``a=b,c=d`` (all the drivers send)."""
    out: dict[str, str] = {}
    for term in filter(None, text.split(",")):
        key, _, value = term.partition("=")
        out[key] = value
    return out


FAKE_SCONTROL = """#!/bin/sh
# A stand-in for Slurm's scontrol: records argv, prints canned `show node` output.
dir="$(dirname "$0")"
printf '%s\\n' "$*" >> "$dir/scontrol.argv"
if [ -f "$dir/scontrol.sleep" ]; then sleep "$(cat "$dir/scontrol.sleep")"; fi
if [ -f "$dir/scontrol.fail" ]; then cat "$dir/scontrol.fail" >&2; exit 1; fi
if [ "$1" = show ]; then cat "$dir/scontrol.show"; fi
exit 0
"""


FAKE_SQUEUE = """#!/bin/sh
# A stand-in for Slurm's squeue: records argv, prints canned output.
dir="$(dirname "$0")"
printf '%s\\n' "$*" >> "$dir/squeue.argv"
if [ -f "$dir/squeue.fail" ]; then cat "$dir/squeue.fail" >&2; exit 1; fi
if [ -f "$dir/squeue.out" ]; then cat "$dir/squeue.out"; fi
exit 0
"""


def show_job(job_id: str, state: str) -> str:
    """``scontrol show job`` output (the lines a driver may read)."""
    return (f"JobId={job_id} JobName=trillion\n"
            "   UserId=ml(1000) GroupId=ml(1000) MCS_label=N/A\n"
            f"   JobState={state} Reason=None Dependency=(null)\n"
            "   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0\n"
            "   NodeList=node-[1-4]\n")


def show_node(name: str, state: str, reason: str | None) -> str:
    """``scontrol show node`` output in Slurm's multi-line format."""
    lines = [
        f"NodeName={name} Arch=x86_64 CoresPerSocket=56",
        "   CPUAlloc=0 CPUEfctv=112 CPUTot=112 CPULoad=0.01",
        "   Gres=gpu:h100:8",
        f"   NodeAddr={name} NodeHostName={name} Version=23.11.4",
        f"   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A",
        "   Partitions=gpu",
    ]
    if reason is not None:
        lines.append(f"   Reason={reason} [root@2024-05-01T10:00:00]")
    return "\n".join(lines) + "\n"


@dataclass
class FakeScontrol:
    """A fake ``scontrol`` in ``directory``: see :data:`FAKE_SCONTROL`."""

    directory: Path

    @property
    def path(self) -> str:
        return str(self.directory / "scontrol")

    def calls(self) -> list[str]:
        log = self.directory / "scontrol.argv"
        return log.read_text().splitlines() if log.exists() else []

    def set_node(self, name: str, state: str, reason: str | None = None) -> None:
        (self.directory / "scontrol.show").write_text(show_node(name, state, reason))

    def fail_with(self, stderr: str) -> None:
        (self.directory / "scontrol.fail").write_text(stderr)

    def hang(self, seconds: float) -> None:
        (self.directory / "scontrol.sleep").write_text(str(seconds))

    def set_job(self, job_id: str, state: str) -> None:
        """What ``scontrol show`` prints (the file serves show node and show job alike)."""
        (self.directory / "scontrol.show").write_text(show_job(job_id, state))

    @property
    def squeue_path(self) -> str:
        return str(self.directory / "squeue")

    def squeue_calls(self) -> list[str]:
        log = self.directory / "squeue.argv"
        return log.read_text().splitlines() if log.exists() else []

    def set_queue(self, *lines: str) -> None:
        """What the fake squeue prints, e.g. ``set_queue("4242 RUNNING")``."""
        (self.directory / "squeue.out").write_text("".join(f"{line}\n" for line in lines))


def make_fake_scontrol(directory: Path) -> FakeScontrol:
    """A fake ``scontrol`` (and ``squeue`` next to it) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("scontrol", FAKE_SCONTROL), ("squeue", FAKE_SQUEUE)):
        script = directory / name
        script.write_text(text)
        script.chmod(0o755)
    return FakeScontrol(directory)


@contextmanager
def running(server: _Base) -> Iterator[Any]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_until(predicate: Any, timeout: float = 5.0, step: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (a bounded loop, for async effects)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())
