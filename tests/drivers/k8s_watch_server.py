"""A recording Kubernetes API server for DistributedJobs: list, watch, status subresource.

Real HTTP on 127.0.0.1 (HTTP/1.1, chunked watch streams), so the controller's client
code runs as against a real API server:

* ``GET .../distributedjobs`` lists with a ``resourceVersion``;
* ``GET ...?watch=true&resourceVersion=N`` streams the events after N (ADDED, MODIFIED,
  DELETED, and BOOKMARK when ``allowWatchBookmarks`` and :meth:`bookmark` is called),
  then waits for more; a version older than the last :meth:`compact` gets an ERROR
  event with a 410 Status, as the API server sends it;
* ``PATCH`` (merge patch) and ``PUT`` of ``.../distributedjobs/NAME/status`` change only
  ``status`` and are recorded (:attr:`status_writes`).
"""

from __future__ import annotations

import copy
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/apis/training.ai/v1"
_PATH = re.compile(r"/apis/training\.ai/v1(?:/namespaces/(?P<ns>[^/]+))?/distributedjobs"
                   r"(?:/(?P<name>[^/]+)(?P<status>/status)?)?")


@dataclass(frozen=True)
class StatusWrite:
    method: str
    namespace: str
    name: str
    content_type: str
    body: dict[str, Any]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


class FakeDistributedJobAPI:
    """See the module docstring."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.version = 100
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.history: list[tuple[int, dict[str, Any]]] = []
        self.compacted = 0
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.status_writes: list[StatusWrite] = []
        self.watches = 0  # open watch streams
        self._epoch = 0   # break_watches() ends the streams of earlier epochs
        self._stopped = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _reply(self, code: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")  # no idle keep-alive threads
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def do_GET(self) -> None:
                split = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(split.query)
                owner._record("GET", split.path, query)
                match = _PATH.fullmatch(split.path)
                if match is None or match["name"]:
                    self._reply(404, _status(404, "NotFound", split.path))
                    return
                if query.get("watch") == ["true"]:
                    self._watch(match["ns"], query)
                else:
                    self._reply(200, owner.list_doc(match["ns"]))

            def _watch(self, namespace: str | None, query: dict[str, list[str]]) -> None:
                since = int(query.get("resourceVersion", ["0"])[0] or 0)
                bookmarks = query.get("allowWatchBookmarks") == ["true"]
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                sent = since
                with owner.cond:
                    owner.watches += 1
                    epoch = owner._epoch
                    owner.cond.notify_all()
                try:
                    if since < owner.compacted:
                        self._chunk({"type": "ERROR", "object": _status(
                            410, "Expired", f"too old resource version: {since} "
                                            f"({owner.compacted})")})
                        self._end()
                        return
                    while True:
                        with owner.cond:
                            while True:
                                if owner._stopped or owner._epoch != epoch:
                                    return  # the connection just closes: a broken stream
                                pending = [(v, e) for v, e in owner.history if v > sent
                                           and (namespace is None or e["ns"] == namespace)
                                           and (bookmarks or e["type"] != "BOOKMARK")]
                                if pending:
                                    break
                                owner.cond.wait(0.05)
                        for version, event in pending:
                            self._chunk({"type": event["type"], "object": event["object"]})
                            sent = version
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with owner.cond:
                        owner.watches -= 1
                    self.close_connection = True

            def _chunk(self, doc: Any) -> None:
                line = json.dumps(doc).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            def _end(self) -> None:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _write(self) -> None:
                split = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                owner._record(self.command, split.path, {})
                match = _PATH.fullmatch(split.path)
                if match is None or not match["status"] or not match["ns"]:
                    self._reply(405, _status(405, "MethodNotAllowed", split.path))
                    return
                found = owner.write_status(self.command, match["ns"], match["name"],
                                           self.headers.get("Content-Type", ""), body)
                if found is None:
                    self._reply(404, _status(404, "NotFound", match["name"]))
                else:
                    self._reply(200, found)

            do_PATCH = do_PUT = _write

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True, name="FakeDistributedJobAPI")

    # -- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeDistributedJobAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cond:
            self._stopped = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def _record(self, method: str, path: str, query: dict[str, list[str]]) -> None:
        with self.cond:
            self.requests.append((method, path, query))

    def calls(self, method: str, *, watch: bool | None = None) -> list[dict[str, list[str]]]:
        with self.cond:
            return [q for m, _, q in self.requests if m == method
                    and (watch is None or (q.get("watch") == ["true"]) == watch)]

    # -- the objects -----------------------------------------------------------------

    def _event(self, type_: str, obj: dict[str, Any]) -> None:
        self.history.append((self.version, {"type": type_, "ns": obj["metadata"].get(
            "namespace"), "object": copy.deepcopy(obj)}))
        self.cond.notify_all()

    def apply(self, doc: dict[str, Any], namespace: str = "training") -> dict[str, Any]:
        """``kubectl apply``: create, or replace the spec (generation + 1 if it changed)."""
        with self.cond:
            self.version += 1
            key = (namespace, doc["metadata"]["name"])
            old = self.objects.get(key)
            obj = copy.deepcopy(doc)
            meta = obj.setdefault("metadata", {})
            meta.update(namespace=namespace, resourceVersion=str(self.version),
                        uid=f"uid-{key[1]}", creationTimestamp="2026-12-02T10:00:00Z")
            if old is None:
                meta["generation"] = 1
            else:
                changed = old.get("spec") != obj.get("spec")
                meta["generation"] = old["metadata"]["generation"] + int(changed)
                if "status" in old:
                    obj["status"] = old["status"]
            self.objects[key] = obj
            self._event("ADDED" if old is None else "MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, name: str, namespace: str = "training") -> None:
        with self.cond:
            self.version += 1
            obj = self.objects.pop((namespace, name))
            obj["metadata"]["resourceVersion"] = str(self.version)
            self._event("DELETED", obj)

    def bookmark(self) -> None:
        with self.cond:
            self.version += 1
            self.history.append((self.version, {"type": "BOOKMARK", "ns": None, "object": {
                "apiVersion": "training.ai/v1", "kind": "DistributedJob",
                "metadata": {"resourceVersion": str(self.version)}}}))
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget the history: a watch from an older version gets 410 Gone."""
        with self.cond:
            self.version += 1
            self.compacted = self.version
            self.history.clear()

    def break_watches(self) -> None:
        """Close every open watch stream without ending it properly."""
        with self.cond:
            self._epoch += 1
            self.cond.notify_all()

    def list_doc(self, namespace: str | None) -> dict[str, Any]:
        with self.cond:
            items = [copy.deepcopy(o) for (ns, _), o in sorted(self.objects.items())
                     if namespace is None or ns == namespace]
            return {"apiVersion": "training.ai/v1", "kind": "DistributedJobList",
                    "metadata": {"resourceVersion": str(self.version)}, "items": items}

    def write_status(self, method: str, namespace: str, name: str, content_type: str,
                     body: dict[str, Any]) -> dict[str, Any] | None:
        with self.cond:
            self.status_writes.append(StatusWrite(method, namespace, name, content_type, body))
            obj = self.objects.get((namespace, name))
            if obj is None:
                return None
            if method == "PUT":
                obj["status"] = body.get("status")
            else:
                obj["status"] = _merge(obj.get("status") or {}, body.get("status") or {})
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            self._event("MODIFIED", obj)
            return copy.deepcopy(obj)

    def wait_watches(self, count: int, timeout: float = 5.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.watches >= count, timeout)


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}
