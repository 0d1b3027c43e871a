"""labels_from_node: the agent's supernode and rack from its Kubernetes Node's labels.

The Node is read from a stand-in API server (tests/drivers/servers.py) over plain HTTP,
and once over HTTPS with a throwaway CA; the token and CA files are in tmp_path.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.agent.daemon import build_agent
from sn_monitor.agent.node_labels import (
    NodeLabelLoop,
    NodeLabelsError,
    NodeReader,
    build_node_label_loop,
    in_cluster_url,
    node_labels,
)
from sn_monitor.agent.settings import (
    AgentSettings,
    ControllerSettings,
    NodeLabelSettings,
    agent_settings_from,
    default_node_name,
)
from sn_monitor.clock import ManualClock, SystemClock
from sn_monitor.config import ConfigError, Document, Duration
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.node import SimulatedNode
from tests.drivers.servers import RecordingHTTPServer, Reply, StubKubernetesAPI, wait_until
from tests.support.ports import free_port
from tests.support.reporter import Controller, make_reporter, snapshot
from tests.support.tls import Pki

MAP = {"supernode": "sn-monitor.io/supernode", "rack": "sn-monitor.io/rack"}
TOKEN = "sa-token-0123456789"
NODE = "gpu-node-017"
NODE_PATH = f"/api/v1/nodes/{NODE}"
FORBIDDEN = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
    "code": 403, "message": f'nodes "{NODE}" is forbidden: User '
                           '"system:serviceaccount:sn-monitor:sn-agent" cannot get resource '
                           '"nodes" in API group "" at the cluster scope'}


def node_doc(labels: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}


# ------------------------------------------------------------------ the pure part


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"sn-monitor.io/supernode": "sn01", "sn-monitor.io/rack": "r012", "other": "x"},
         {"supernode": "sn01", "rack": "r012"}),
        ({"sn-monitor.io/supernode": "sn01"}, {"supernode": "sn01"}),   # rack not set
        ({}, {}),
        (None, {}),                                                       # no labels at all
        ({"sn-monitor.io/supernode": ""}, {}),                            # empty: no supernode
        ({"sn-monitor.io/supernode": 7, "sn-monitor.io/rack": ["r"]}, {}),  # not strings
        ({"sn-monitor.io/supernode": "s" * 129}, {}),                     # too long to report
    ],
)
def test_node_labels_takes_the_mapped_labels(labels, expected):
    assert node_labels(node_doc(labels), MAP) == expected


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ([1, 2], "not a Node"),
        ("Node", "not a Node"),
        ({"kind": "Status", "code": 200}, "not a Node"),
        ({"kind": "Node"}, "no metadata"),
        ({"kind": "Node", "metadata": "x"}, "no metadata"),
        ({"kind": "Node", "metadata": {"labels": ["a=b"]}}, "not a mapping"),
    ],
)
def test_node_labels_refuses_what_is_not_a_node(document, problem):
    with pytest.raises(ValueError, match=problem):
        node_labels(document, MAP)


@pytest.mark.parametrize(
    ("environ", "url"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
         "https://10.96.0.1:443"),
        ({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"},
         "https://[fd00::1]:6443"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "https://10.96.0.1:443"),
        ({}, None),
    ],
)
def test_the_in_cluster_address(environ, url):
    assert in_cluster_url(environ) == url


# ------------------------------------------------------------------ settings


def test_settings_default_off_with_our_label_keys():
    settings = AgentSettings().labels_from_node
    assert settings.enabled is False
    assert settings.mapping == MAP
    assert settings.interval == 300.0
    assert settings.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert settings.ca_file == "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


def test_settings_are_read_and_checked():
    doc = Document("agent.yaml", {"labels_from_node": {
        "enabled": True, "interval": "1m", "map": {"supernode": "nvidia.com/gpu.clique"}}}, {})
    settings = agent_settings_from(doc).labels_from_node
    assert settings.mapping == {"supernode": "nvidia.com/gpu.clique"}
    assert settings.interval == 60.0
    for bad in ({"map": {"rack": "not a key!"}}, {"map": {}}, {"api_url": "10.0.0.1:443"},
                {"mapping": {"rack": "a"}}):
        with pytest.raises(ConfigError):
            agent_settings_from(Document("agent.yaml", {"labels_from_node": bad}, {}))


def test_the_node_name_comes_from_node_name_when_unset(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "k8s-node-3")
    assert default_node_name() == "k8s-node-3"
    assert AgentSettings().node == "k8s-node-3"
    assert AgentSettings(node="set").node == "set"
    monkeypatch.delenv("NODE_NAME")
    assert AgentSettings().node == default_node_name() != ""


# ------------------------------------------------------------------ reading the Node


@pytest.fixture
def api() -> Iterator[StubKubernetesAPI]:
    server = StubKubernetesAPI()
    server.add_node(NODE)
    server.nodes[NODE]["metadata"]["labels"] = {"sn-monitor.io/supernode": "sn07",
                                                "sn-monitor.io/rack": "r003",
                                                "kubernetes.io/hostname": NODE}
    with server:
        yield server


@pytest.fixture
def scripted() -> Iterator[RecordingHTTPServer]:
    with RecordingHTTPServer() as server:
        yield server


def settings_for(tmp_path: Path, url: str | None = None, **extra: Any) -> NodeLabelSettings:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text(TOKEN + "\n")
    return NodeLabelSettings(enabled=True, api_url=url, token_file=str(token),
                             ca_file=str(tmp_path / "ca.crt"), **extra)


def test_the_reader_gets_the_node_with_the_service_account_token(api, tmp_path):
    reader = NodeReader(settings_for(tmp_path, api.url), api.url)
    try:
        assert node_labels(reader.read(NODE), MAP) == {"supernode": "sn07", "rack": "r003"}
        (tmp_path / "token").write_text("renewed-token\n")  # the kubelet renews it
        reader.read(NODE)
    finally:
        reader.close()
    first, second = api.calls("GET", NODE_PATH)
    assert first.header("Authorization") == f"Bearer {TOKEN}"
    assert second.header("Authorization") == "Bearer renewed-token"


def test_the_reader_checks_the_api_servers_certificate(api, tmp_path):
    pki = Pki(tmp_path / "pki")
    cert, key = pki.server()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    api.server.socket = context.wrap_socket(api.server.socket, server_side=True)
    url = api.url.replace("http://", "https://")
    settings = settings_for(tmp_path, url)
    reader = NodeReader(settings, url)
    try:
        with pytest.raises(NodeLabelsError, match=r"no CA file at .*ca.crt"):
            reader.read(NODE)
        (tmp_path / "ca.crt").write_bytes(pki.ca_file.read_bytes())
        assert node_labels(reader.read(NODE), MAP)["supernode"] == "sn07"
        (tmp_path / "ca.crt").write_bytes(Pki(tmp_path / "other").ca_file.read_bytes())
        with pytest.raises(NodeLabelsError, match="TLS: certificate not trusted"):
            reader.read(NODE)
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (Reply(403, json.dumps(FORBIDDEN).encode()),
         r"HTTP 403: .*needs a ClusterRole with apiGroups \[\"\"\], resources \[nodes\], "
         r"verbs \[get\].*agent-rbac.yaml.*cannot get resource \"nodes\""),
        (Reply(401, b'{"kind":"Status","code":401,"message":"Unauthorized"}'),
         "HTTP 401: the API server does not take the service account token"),
        (Reply(500, b"etcd is down"), "HTTP 500: the API server failed.*etcd is down"),
        (Reply(200, b"<html>a proxy's login page</html>"), "is not JSON"),
        (Reply(200, b'{"kind": "Node", "metad'), "is not JSON"),
        (Reply(200, b"\xff\xfe\x00garbage"), "is not JSON"),
    ],
)
def test_each_failure_says_what_to_fix(scripted, tmp_path, reply, problem):
    scripted.script(NODE_PATH, reply)
    reader = NodeReader(settings_for(tmp_path), scripted.url)
    try:
        with pytest.raises(NodeLabelsError, match=problem):
            reader.read(NODE)
    finally:
        reader.close()


def test_an_unknown_node_says_the_name_must_be_the_kubernetes_one(api, tmp_path):
    reader = NodeReader(settings_for(tmp_path), api.url)
    try:
        with pytest.raises(NodeLabelsError,
                           match=r"HTTP 404: no Node named gpu-9: .*spec\.nodeName.*not found"):
            reader.read("gpu-9")
    finally:
        reader.close()


def test_a_hanging_api_server_times_out(scripted, tmp_path):
    scripted.script(NODE_PATH, Reply(200, json.dumps(node_doc({})).encode(), delay=2.0))
    reader = NodeReader(settings_for(tmp_path, timeout=Duration(0.2)), scripted.url)
    try:
        with pytest.raises(NodeLabelsError, match=f"cannot read Node {NODE} from .*: timed out"):
            reader.read(NODE)
    finally:
        reader.close()


def test_no_api_server_and_no_token_are_errors_too(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    reader = NodeReader(settings_for(tmp_path), url)
    try:
        with pytest.raises(NodeLabelsError, match=r"cannot read Node .*: connection refused"):
            reader.read(NODE)
        (tmp_path / "token").unlink()
        with pytest.raises(NodeLabelsError, match=r"cannot read token file.*automount"):
            reader.read(NODE)
    finally:
        reader.close()


# ------------------------------------------------------------------ the loop


class FakeNode:
    """What the loop reads, scripted: a Node document or an error per read."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.names: list[str] = []

    def __call__(self, name: str) -> Any:
        self.names.append(name)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_configured_labels_win_and_changes_are_handed_on(caplog):
    delivered: list[dict[str, str]] = []
    read = FakeNode(node_doc({"sn-monitor.io/supernode": "sn07", "sn-monitor.io/rack": "r3"}),
                    node_doc({"sn-monitor.io/supernode": "sn07", "sn-monitor.io/rack": "r3"}),
                    node_doc({"sn-monitor.io/supernode": "sn08"}))
    loop = NodeLabelLoop(NodeLabelSettings(enabled=True), NODE,
                         {"rack": "r-config", "job": "llm"}, delivered.append, read)
    caplog.set_level(logging.INFO, logger="sn_monitor.agent.node_labels")
    assert [loop.read_once() for _ in range(3)] == [True, True, True]
    assert read.names == [NODE] * 3
    assert delivered == [{"supernode": "sn07", "rack": "r-config", "job": "llm"},
                         {"supernode": "sn08", "rack": "r-config", "job": "llm"}]
    assert "labels from Node gpu-node-017: rack=r3, supernode=sn07; " \
           "the config's own win for rack" in caplog.text
    assert "not on the Node: rack (sn-monitor.io/rack)" in caplog.text


def test_a_failed_read_keeps_the_labels_and_is_logged_once(caplog):
    delivered: list[dict[str, str]] = []
    forbidden = NodeLabelsError("reading Node gpu-node-017 answered HTTP 403: needs get")
    read = FakeNode(node_doc({"sn-monitor.io/supernode": "sn07"}), forbidden, forbidden,
                    {"kind": "Status"}, node_doc({"sn-monitor.io/supernode": "sn07"}))
    loop = NodeLabelLoop(NodeLabelSettings(enabled=True), NODE, {}, delivered.append, read)
    caplog.set_level(logging.DEBUG, logger="sn_monitor.agent.node_labels")
    assert loop.read_once()
    assert [loop.read_once() for _ in range(3)] == [False, False, False]
    assert loop.labels == {"supernode": "sn07"}
    assert loop.read_once()
    assert delivered == [{"supernode": "sn07"}]  # the same labels again: nothing to hand on
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "labels_from_node: reading Node gpu-node-017 answered HTTP 403: needs get; keeping "
        "the labels read before, next try in 30 s",
        "labels_from_node: Node gpu-node-017: the answer is not a Node object; keeping the "
        "labels read before, next try in 30 s"]
    assert "Node gpu-node-017 read again" in caplog.text


def test_the_loop_runs_on_its_own_thread_and_stops(api, tmp_path):
    delivered: list[dict[str, str]] = []
    built = build_node_label_loop(settings_for(tmp_path, api.url), NODE, {}, delivered.append)
    assert built is not None
    loop, reader = built
    loop.start()
    try:
        assert wait_until(lambda: delivered == [{"supernode": "sn07", "rack": "r003"}])
    finally:
        loop.stop(timeout=2.0)
        reader.close()


def test_without_an_address_the_loop_is_not_built(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    assert build_node_label_loop(settings_for(tmp_path), NODE, {}, print, environ={}) is None
    assert "KUBERNETES_SERVICE_HOST is not set" in caplog.text
    built = build_node_label_loop(settings_for(tmp_path), NODE, {}, print,
                                  environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                           "KUBERNETES_SERVICE_PORT": "443"})
    assert built is not None
    assert built[1].url == "https://10.96.0.1:443"
    built[1].close()


# ------------------------------------------------------------------ into the reports


def test_set_labels_changes_the_next_report(tmp_path):
    controller = Controller()
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    try:
        reporter.report(snapshot(clock))
        reporter.set_labels({"supernode": "sn07", "rack": "r003"})
        reporter.report(snapshot(clock))
    finally:
        reporter.close()
        controller.close()
    assert [r.labels for r in controller.reports()] == [
        {"supernode": "sn0"}, {"supernode": "sn07", "rack": "r003"}]


def test_the_agent_reports_its_nodes_labels(api, tmp_path):
    controller = Controller()
    sim = SimulatedNode(tmp_path / "node")
    settings = sim.agent_settings(AgentSettings(
        node=NODE, labels={"job": "llm"}, listen=f"127.0.0.1:{free_port()}", interval=0.2,
        controller=ControllerSettings(url=controller.url),
        labels_from_node=settings_for(tmp_path, api.url)))
    agent = build_agent(settings, sim.nvml, SystemClock(), before_sample=sim.step)
    try:
        agent.start()
        assert wait_until(lambda: any(r.labels.get("rack") for r in controller.reports()),
                          timeout=20.0)
    finally:
        agent.stop()
        fake_nvml.reset()
        controller.close()
    labelled = [r.labels for r in controller.reports() if r.labels.get("rack")]
    assert labelled[-1] == {"supernode": "sn07", "rack": "r003", "job": "llm"}
    assert api.calls("GET", NODE_PATH)
