"""PodRoleLabel: the controller labels its own pod, with the real client, on the stub API."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator

import pytest

from sn_monitor.config import ConfigError, Duration
from sn_monitor.controller.ha.k8s_role import ROLE_LABEL, PodRoleLabel, Role
from sn_monitor.controller.ha.lease import HaSettings, KubernetesLeaseSettings
from sn_monitor.controller.process.leadership import build_role_label
from tests.drivers.servers import RecordingHTTPServer, Reply, StubKubernetesAPI

NS = "sn-monitor"
POD = "sn-controller-7d9f8c6b5-x2k4q"
PATH = f"/api/v1/namespaces/{NS}/pods/{POD}"
ENV = {"POD_NAME": POD, "POD_NAMESPACE": NS}


def settings(url: str, timeout: float = 2.0) -> KubernetesLeaseSettings:
    return KubernetesLeaseSettings(host=url, timeout=Duration(timeout))


@pytest.fixture
def api() -> Iterator[StubKubernetesAPI]:
    stub = StubKubernetesAPI()
    stub.start()
    stub.add_pod(NS, POD, "cpu-1", owner="ReplicaSet",
                 labels={"app.kubernetes.io/name": "sn-controller"})
    yield stub
    stub.stop()


@pytest.fixture
def label(api: StubKubernetesAPI) -> Iterator[PodRoleLabel]:
    marker = PodRoleLabel(settings(api.url), environ=ENV)
    yield marker
    marker.close()


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_marks_the_pod_active_then_standby(api: StubKubernetesAPI, label: PodRoleLabel) -> None:
    assert label.mark("active") is True
    labels = api.pod(NS, POD)["metadata"]["labels"]
    assert labels == {"app.kubernetes.io/name": "sn-controller", ROLE_LABEL: "active"}
    assert label.mark("standby") is True
    assert api.pod(NS, POD)["metadata"]["labels"][ROLE_LABEL] == "standby"
    assert api.pod(NS, POD)["metadata"]["labels"]["app.kubernetes.io/name"] == "sn-controller"


def test_one_merge_patch_of_the_label_only(api: StubKubernetesAPI, label: PodRoleLabel) -> None:
    label.mark("active")
    (patch,) = api.requests
    assert (patch.method, patch.path) == ("PATCH", PATH)
    assert patch.header("Content-Type") == "application/merge-patch+json"
    assert patch.json() == {"metadata": {"labels": {ROLE_LABEL: "active"}}}


def test_the_namespace_is_the_pods_own(api: StubKubernetesAPI) -> None:
    api.add_pod("ops", POD, "cpu-1")
    marker = PodRoleLabel(settings(api.url), environ={"POD_NAME": POD, "POD_NAMESPACE": "ops"})
    try:
        assert marker.mark("standby") is True
    finally:
        marker.close()
    assert api.pod("ops", POD)["metadata"]["labels"] == {ROLE_LABEL: "standby"}
    assert ROLE_LABEL not in api.pod(NS, POD)["metadata"]["labels"]


def test_without_pod_name_nothing_is_called(api: StubKubernetesAPI,
                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    marker = PodRoleLabel(settings(api.url), environ={"POD_NAMESPACE": NS})
    try:
        assert marker.mark("standby") is True
        assert marker.mark("active") is True
    finally:
        marker.close()
    assert api.requests == []
    assert errors(caplog) == []
    (line,) = [r for r in caplog.records if "POD_NAME" in r.getMessage()]
    assert line.levelno == logging.INFO


def test_without_pod_name_no_kubernetes_configuration_is_needed(
        caplog: pytest.LogCaptureFixture) -> None:
    # not on Kubernetes: no in-cluster account, no kubeconfig, and that is fine
    marker = PodRoleLabel(KubernetesLeaseSettings(kubeconfig="/nonexistent/kubeconfig"),
                          environ={})
    assert marker.mark("active") is True
    marker.close()


def test_a_bad_configuration_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no usable Kubernetes configuration"):
        PodRoleLabel(KubernetesLeaseSettings(kubeconfig="/nonexistent/kubeconfig"),
                     environ=ENV)


@pytest.mark.parametrize("role", ["active", "standby"])
def test_forbidden_is_false_and_an_error_naming_the_rbac(
        api: StubKubernetesAPI, label: PodRoleLabel, caplog: pytest.LogCaptureFixture,
        role: Role) -> None:
    api.fail_next = [403]
    assert label.mark(role) is False
    (message,) = errors(caplog)
    assert f"pod {NS}/{POD} {ROLE_LABEL}={role}" in message
    assert "403" in message
    assert "patch on pods" in message
    assert "deploy/kubernetes/ha/pod-label-rbac.yaml" in message
    assert ROLE_LABEL not in api.pod(NS, POD)["metadata"]["labels"]
    assert label.mark(role) is True  # nothing sticks: the next mark tries again


def test_an_unknown_pod_is_false_and_says_where_the_name_comes_from(
        api: StubKubernetesAPI, caplog: pytest.LogCaptureFixture) -> None:
    marker = PodRoleLabel(settings(api.url), environ={"POD_NAME": "gone", "POD_NAMESPACE": NS})
    try:
        assert marker.mark("active") is False
    finally:
        marker.close()
    (message,) = errors(caplog)
    assert "404" in message
    assert "downward API" in message
    assert "no endpoint" in message  # what a missing active label costs


def test_a_server_error_is_false(api: StubKubernetesAPI, label: PodRoleLabel,
                                 caplog: pytest.LogCaptureFixture) -> None:
    api.fail_method["PATCH"] = [500]
    assert label.mark("standby") is False
    (message,) = errors(caplog)
    assert "500" in message
    assert "503 and retry" in message


def test_a_stopped_api_server_is_false_within_the_timeout(
        api: StubKubernetesAPI, caplog: pytest.LogCaptureFixture) -> None:
    marker = PodRoleLabel(settings(api.url, timeout=1.0), environ=ENV)
    try:
        assert marker.mark("standby") is True
        api.stop()
        assert marker.mark("active") is False
    finally:
        marker.close()
    (message,) = errors(caplog)
    assert "unreachable" in message
    assert "Connection refused" in message  # refused at once, not waited out


def test_a_closed_port_is_false(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    marker = PodRoleLabel(settings(f"http://127.0.0.1:{port}"), environ=ENV)
    try:
        assert marker.mark("standby") is False
    finally:
        marker.close()
    assert "unreachable" in errors(caplog)[0]


def test_a_hanging_api_server_is_false_within_the_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    server = RecordingHTTPServer(default=Reply(delay=10.0))
    server.start()
    marker = PodRoleLabel(settings(server.url, timeout=0.3), environ=ENV)
    try:
        assert marker.mark("active") is False
    finally:
        marker.close()
        server.stop()
    (message,) = errors(caplog)
    assert "unreachable" in message
    # the configured 0.3 s timeout (what is left of it when the read starts) ended the
    # wait, not the 10 s reply
    assert re.search(r"Read timed out\. \(read timeout=0\.[0-3]\d*\)", message), message


def test_an_unreadable_answer_is_false(caplog: pytest.LogCaptureFixture) -> None:
    server = RecordingHTTPServer(default=Reply(
        body=b'{"kind": "Pod", "metadata": {"labels": "active"}}',
        headers={"Content-Type": "application/json"}))
    server.start()
    marker = PodRoleLabel(settings(server.url), environ=ENV)
    try:
        assert marker.mark("active") is False
    finally:
        marker.close()
        server.stop()
    assert "unreadable answer" in errors(caplog)[0]


def test_the_daemon_labels_only_with_a_kubernetes_lease(
        api: StubKubernetesAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    assert build_role_label(HaSettings(lease="postgresql")) is None
    marker = build_role_label(HaSettings(lease="kubernetes",
                                         kubernetes=settings(api.url)))
    assert marker is not None
    try:
        assert marker.mark("active") is True
    finally:
        marker.close()
    assert api.pod(NS, POD)["metadata"]["labels"][ROLE_LABEL] == "active"
    with pytest.raises(ConfigError, match=r"ha\.kubernetes"):
        build_role_label(HaSettings(lease="kubernetes", kubernetes=KubernetesLeaseSettings(
            kubeconfig="/nonexistent/kubeconfig")))
