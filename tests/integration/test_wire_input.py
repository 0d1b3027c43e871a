"""Strict wire input, through a real ``sn-monitor controller`` on 127.0.0.1.

What a client sends is taken only as the contract says (issue 15): names as whole
strings (no ``"sim-1\\n"``, neither in a report, a path nor a token's node pattern), the
agents' times on the controller's clock (events and training progress dated a day ahead,
a year back or at 1e308), a body over the limit answered 413 from its headers or as it
crosses the limit, with the connection closed and the rest of the body never read, and
a body of any media type but JSON (YAML too for jobs) answered 415.

One controller serves the whole module (a small body limit, so that crossing it is
cheap). Raw sockets send what HTTP libraries will not (a ``Content-Length`` of 100 GB
with no body, a chunked body that never ends); every wait is bounded, and "closed" means
closed within :data:`CLOSED_WITHIN` seconds, far more than it takes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sn_monitor.controller.ingest.decode import MAX_EVENT_AGE_SECONDS
from sn_monitor.controller.security.auth import ConfigError, Identity, TokenBook
from tests.conftest import ROOT
from tests.integration.cluster import Cluster
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

MAX_BODY = 64 * 1024
#: A ``Content-Length`` no controller may read: 100 GB.
HUGE = 100_000_000_000
#: How long a refused connection may take to close (it takes milliseconds).
CLOSED_WITHIN = 10.0
YEAR = 365 * 86_400.0
JSON = "application/json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("wire"), nodes=0,
                config={"max_body_bytes": MAX_BODY})
    try:
        c.start_controller()
        assert report(c, "sim-0").status_code == 200  # a node that exists, for the paths
        yield c
    finally:
        c.close()


def report_doc(node: str, **extra: Any) -> dict[str, Any]:
    return {"node": node, "instance": f"wire-{time.monotonic_ns()}", "sequence": 1,
            "sample_time_seconds": time.time(), "interval_seconds": 1.0, **extra}


def report(c: Cluster, node: str, *, path: str = "/api/v1/reports",
           **extra: Any) -> requests.Response:
    return requests.post(f"{c.url}{path}", json=report_doc(node, **extra), timeout=10,
                         headers={"Authorization": f"Bearer {c.agent_token}"})


def post(c: Cluster, path: str, body: bytes, media: str | None,
         token: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token or c.admin_token}"}
    if media is not None:
        headers["Content-Type"] = media
    return requests.post(f"{c.url}{path}", data=body, headers=headers, timeout=10)


def add_job(c: Cluster, name: str) -> None:
    job = {"apiVersion": "training.ai/v1", "kind": "DistributedJob",
           "metadata": {"name": name}, "spec": {"replicas": 1}}
    created = post(c, "/api/v1/jobs", json.dumps(job).encode(), JSON)
    assert created.status_code == 201, created.text


# --------------------------------------------------------------------------- raw HTTP


def connect(c: Cluster) -> socket.socket:
    return socket.create_connection(("127.0.0.1", c.port), timeout=CLOSED_WITHIN)


def head(c: Cluster, path: str, *, length: int | None = None, chunked: bool = False,
         media: str | None = JSON, extra: str = "", token: str | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: controller",
             f"Authorization: Bearer {token or c.agent_token}"]
    if media is not None:
        lines.append(f"Content-Type: {media}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The next answer on ``sock`` (after a ``100 Continue``, if one comes first): status,
    headers (lower-case names) and body (by its Content-Length)."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed before an answer: {data!r}"
            data += chunk
        top, _, data = data.partition(b"\r\n\r\n")
        lines = top.decode("latin-1").split("\r\n")
        if int(lines[0].split()[1]) != 100:
            break
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(data) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of the answer"
        data += chunk
    return int(lines[0].split()[1]), headers, data


def closed(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` within CLOSED_WITHIN s while the client still
    sends its body (a byte every 0.2 s): a connection closed only once idle (uvicorn's
    keep-alive timeout) does not count. EOF or a reset both count as closed."""
    deadline = time.monotonic() + CLOSED_WITHIN
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionResetError:
            return True
        try:
            sock.sendall(b" ")
        except (BrokenPipeError, ConnectionResetError):
            return True
    return False


def error_of(body: bytes) -> str:
    return str(json.loads(body)["error"])


# --------------------------------------------------------------------------- names


def test_a_node_name_with_a_trailing_newline_is_refused_and_never_shown(cluster: Cluster
                                                                        ) -> None:
    refused = report(cluster, "sim-1\n")
    assert refused.status_code == 422, refused.text
    assert "$.node" in refused.json()["error"]
    assert report(cluster, "sim-1").status_code == 200  # the same name, whole, is fine
    names = [n["name"] for n in cluster.get("/api/v1/nodes")["nodes"]]
    assert "sim-1" in names
    assert "sim-1\n" not in names
    metrics = cluster.controller_metrics()
    assert 'node="sim-1"' in metrics
    assert 'node="sim-1\\n"' not in metrics  # as Prometheus escapes it
    assert 'node="sim-1\n' not in metrics


def test_a_path_names_no_node_with_a_trailing_newline(cluster: Cluster) -> None:
    admin = {"Authorization": f"Bearer {cluster.admin_token}"}
    assert requests.get(f"{cluster.url}/api/v1/nodes/sim-0", headers=admin,
                        timeout=10).status_code == 200
    for path in ("/api/v1/nodes/sim-0%0A", "/api/v1/nodes/sim-0%0A/uncordon"):
        method = requests.post if path.endswith("cordon") else requests.get
        answer = method(f"{cluster.url}{path}", headers=admin, timeout=10)
        assert answer.status_code == 404, (path, answer.text)


def test_a_node_pattern_does_not_match_a_name_with_a_newline(cluster: Cluster) -> None:
    # the cluster's agent token may report for "sim-*"
    assert Identity("agents", "agent", ("sim-*",)).may_report_for("sim-1")
    assert not Identity("agents", "agent", ("sim-*",)).may_report_for("sim-1\n")
    assert not Identity("root", "admin").may_report_for("sim-1\n")
    refused = report(cluster, "sim-2\n")
    assert refused.status_code in (403, 422), refused.text
    assert "sim-2\n" not in [n["name"] for n in cluster.get("/api/v1/nodes")["nodes"]]


def test_a_bad_node_pattern_in_a_token_file_is_a_config_error(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text('- name: fleet\n'
                      '  token: "0123456789abcdef0123"\n'
                      '  nodes:\n'
                      '    - gpu-*\n'
                      '    - "gpu-*\\n"\n')
    with pytest.raises(ConfigError) as err:
        TokenBook.load(tokens)
    assert (err.value.file, err.value.key, err.value.line) == (str(tokens), "[0].nodes[1]", 5)
    assert "not a node pattern" in err.value.message
    done = subprocess.run(
        [sys.executable, "-m", "sn_monitor.cli", "controller", "--listen",
         f"127.0.0.1:{free_port()}",
         "--state-dir", str(tmp_path / "state"), "--token-file", str(tokens),
         "--rules", str(ROOT / "sn_monitor" / "rules")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert f"{tokens}:5: [0].nodes[1]: 'gpu-*\\n' is not a node pattern" in done.stderr


# --------------------------------------------------------------------------- times


def test_event_times_are_kept_on_the_controllers_clock(cluster: Cluster) -> None:
    sent = time.time()
    times = {1: sent + 86_400.0, 2: sent - YEAR, 3: 1e308}
    events = [{"id": i, "kind": "xid", "source": "kmsg", "time_seconds": at, "code": 1,
               "message": "Xid 1"} for i, at in times.items()]
    answer = report(cluster, "sim-3", events=events)
    received = time.time()
    assert answer.status_code == 200, answer.text

    def stored() -> list[dict[str, Any]]:
        found = cluster.get("/api/v1/events", node="sim-3")["events"]
        return list(found) if len(found) == len(events) else []
    for event in cluster.wait_for(stored, 30, "the three events stored"):
        assert sent - MAX_EVENT_AGE_SECONDS <= event["time"] <= received, event


def test_progress_times_are_kept_on_the_controllers_clock(cluster: Cluster) -> None:
    now = time.time()
    cases = {"wire-skewed": (now - YEAR, now + 86_400.0), "wire-extreme": (-1e308, 1e308)}
    for job, (first, second) in cases.items():
        add_job(cluster, job)
        body = {"rank": 0, "node": "sim-4", "world_size": 1,
                "updates": [{"step": 1, "time": first}, {"step": 2, "time": second}]}
        answer = post(cluster, f"/api/v1/jobs/{job}/progress", json.dumps(body).encode(),
                      JSON, token=cluster.agent_token)
        assert answer.status_code == 200, answer.text
        status = cluster.get(f"/api/v1/jobs/{job}")
        assert status["last_step"] == 2
        # the step took no longer than the span the clamp leaves: now - 1 day .. now
        assert 0 < status["median_step_seconds"] <= MAX_EVENT_AGE_SECONDS, (job, status)
        ratio = status["effective_training_ratio"]
        assert ratio is None or 0.0 <= ratio <= 1.0


def test_a_time_beyond_the_double_range_is_refused(cluster: Cluster) -> None:
    add_job(cluster, "wire-range")
    body = (b'{"rank": 0, "node": "sim-4", "world_size": 1, '
            b'"updates": [{"step": 1, "time": 1e999}]}')
    answer = post(cluster, "/api/v1/jobs/wire-range/progress", body, JSON,
                  token=cluster.agent_token)
    assert answer.status_code == 422, answer.text
    assert "$.updates[0].time" in answer.json()["error"]


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("path", ["/api/v1/reports", "/api/v1/reports?from=wire",
                                  "/api/v1/jobs/wire-size/progress"])
def test_a_body_announced_over_the_limit_is_refused_from_its_headers(cluster: Cluster,
                                                                    path: str) -> None:
    with connect(cluster) as sock:
        sock.sendall(head(cluster, path, length=HUGE))  # and not one byte of the body
        status, _, body = read_answer(sock)
        assert status == 413, body
        assert str(MAX_BODY) in error_of(body)
        assert closed(sock)


def test_an_unknown_client_announcing_too_much_is_answered_and_closed(cluster: Cluster
                                                                      ) -> None:
    with connect(cluster) as sock:
        sock.sendall(head(cluster, "/api/v1/reports", length=HUGE, token="not-a-token"))
        status, headers, body = read_answer(sock)
        assert status == 401, body
        assert headers["connection"] == "close"
        assert closed(sock)


@pytest.mark.parametrize("path", ["/api/v1/reports", "/api/v1/jobs/wire-size/progress"])
def test_a_chunked_body_is_refused_as_it_crosses_the_limit(cluster: Cluster,
                                                           path: str) -> None:
    with connect(cluster) as sock:
        # a chunk of 4 limits, sent up to one byte over the limit: the answer cannot wait
        # for the end of the body (nor of the chunk)
        sock.sendall(head(cluster, path, chunked=True) + f"{4 * MAX_BODY:x}\r\n".encode()
                     + b" " * (MAX_BODY + 1))
        status, _, body = read_answer(sock)
        assert status == 413, body
        assert closed(sock)


# --------------------------------------------------------------------------- media types


MEDIA_CASES = {
    "text/plain": ("text/plain", 415),
    "no Content-Type": (None, 415),
    "JSON with a charset": ("Application/JSON; charset=utf-8", 200),
}


@pytest.mark.parametrize("case", sorted(MEDIA_CASES))
@pytest.mark.parametrize("path", ["/api/v1/reports", "/api/v1/reports?from=wire"])
def test_a_report_must_be_json(cluster: Cluster, case: str, path: str) -> None:
    media, expected = MEDIA_CASES[case]
    body = json.dumps(report_doc("sim-5")).encode()
    answer = post(cluster, path, body, media, token=cluster.agent_token)
    assert answer.status_code == expected, answer.text
    if expected == 415:
        error = answer.json()["error"]
        assert "application/json" in error
        assert (media or "without a Content-Type") in error


@pytest.mark.parametrize("media", ["text/plain", None])
def test_a_report_expecting_100_continue_must_be_json(cluster: Cluster, media: str | None
                                                      ) -> None:
    body = json.dumps(report_doc("sim-5")).encode()
    with connect(cluster) as sock:
        sock.sendall(head(cluster, "/api/v1/reports", length=len(body), media=media,
                          extra="Expect: 100-continue\r\n"))
        status, _, answer = read_answer(sock)  # refused before it asks for the body
        assert status == 415, answer
        assert "application/json" in error_of(answer)


@pytest.mark.parametrize("case", sorted(MEDIA_CASES))
def test_progress_must_be_json(cluster: Cluster, case: str) -> None:
    media, expected = MEDIA_CASES[case]
    add_job(cluster, "wire-media")
    body = {"rank": 0, "node": "sim-6", "world_size": 1,
            "updates": [{"step": 1, "time": time.time()}]}
    answer = post(cluster, "/api/v1/jobs/wire-media/progress", json.dumps(body).encode(),
                  media, token=cluster.agent_token)
    assert answer.status_code == expected, answer.text


@pytest.mark.parametrize(("media", "expected"), [
    ("application/json", 201), ("application/yaml", 201), ("application/x-yaml", 201),
    ("text/yaml; charset=utf-8", 201), ("text/plain", 415), (None, 415)])
def test_a_job_is_json_or_yaml(cluster: Cluster, media: str | None, expected: int) -> None:
    if media is not None and "json" in media:
        body = json.dumps({"apiVersion": "training.ai/v1", "kind": "DistributedJob",
                           "metadata": {"name": "wire-job"}, "spec": {"replicas": 2}}).encode()
    else:
        body = (b"apiVersion: training.ai/v1\nkind: DistributedJob\n"
                b"metadata: {name: wire-job}\nspec: {replicas: 2}\n")
    answer = post(cluster, "/api/v1/jobs", body, media)
    assert answer.status_code == expected, answer.text
    if expected == 415:
        assert "application/yaml" in answer.json()["error"]


def test_a_request_without_a_body_needs_no_content_type(cluster: Cluster) -> None:
    answer = post(cluster, "/api/v1/nodes/sim-0/uncordon", b"", None)
    assert answer.status_code == 202, answer.text  # refused by the policy: not ours
    assert answer.json()["state"] == "refused"
    with_text = post(cluster, "/api/v1/nodes/sim-0/uncordon", b'{"reason": "x"}',
                     "text/plain")
    assert with_text.status_code == 415, with_text.text
