"""The Kubernetes driver with the real client against a stub API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sn_monitor.controller.actions.base import PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.kubernetes import (
    CORDONED_BY,
    KubernetesDriver,
)
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.k8s.settings import KubernetesSettings
from tests.drivers.servers import StubKubernetesAPI

TAINT = "sn-monitor.io/unhealthy"


@pytest.fixture
def api() -> Iterator[StubKubernetesAPI]:
    stub = StubKubernetesAPI()
    stub.add_node("n1", taints=[{"key": "gpu", "value": "h100", "effect": "NoSchedule"}])
    stub.start()
    yield stub
    stub.stop()


@pytest.fixture
def k8s(api: StubKubernetesAPI) -> Iterator[KubernetesDriver]:
    driver = KubernetesDriver(KubernetesSettings(host=api.url, timeout=2.0,  # type: ignore[arg-type]
                                                 eviction_retry_after=5.0))  # type: ignore[arg-type]
    yield driver
    driver.close()


def act(action: str, node: str = "n1") -> ActionRequest:
    return ActionRequest(id=f"{action}-1", key=action, action=action,  # type: ignore[arg-type]
                         node=node, reason="GPU 3 XID 79", rule="fatal-xid")


def test_cordon_sets_unschedulable_taint_and_annotation(
        api: StubKubernetesAPI, k8s: KubernetesDriver) -> None:
    k8s.run(act("cordon"))
    node = api.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert {"key": TAINT, "value": "fatal-xid", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert {"key": "gpu", "value": "h100", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["metadata"]["annotations"][CORDONED_BY] == "sn-monitor"
    (patch,) = api.calls("PATCH")
    assert patch.header("Content-Type") == "application/strategic-merge-patch+json"
    assert patch.json()["metadata"]["resourceVersion"]  # optimistic concurrency
    assert k8s.reconcile(act("cordon")) is True


def test_cordon_twice_changes_nothing(api: StubKubernetesAPI, k8s: KubernetesDriver) -> None:
    k8s.run(act("cordon"))
    outcome = k8s.run(act("cordon"))
    assert outcome.details["changed"] is False
    assert len(api.calls("PATCH")) == 1


def test_uncordon_undoes_our_cordon(api: StubKubernetesAPI, k8s: KubernetesDriver) -> None:
    k8s.run(act("cordon"))
    k8s.run(act("uncordon"))
    node = api.node("n1")
    assert not node["spec"].get("unschedulable")
    assert node["spec"]["taints"] == [{"key": "gpu", "value": "h100", "effect": "NoSchedule"}]
    assert CORDONED_BY not in node["metadata"]["annotations"]
    assert k8s.reconcile(act("uncordon")) is True
    assert k8s.run(act("uncordon")).details["changed"] is False  # a retry is harmless


def test_uncordon_refuses_someone_elses_cordon(api: StubKubernetesAPI,
                                               k8s: KubernetesDriver) -> None:
    api.add_node("n2", unschedulable=True)
    with pytest.raises(PermanentError, match="someone else"):
        k8s.run(act("uncordon", "n2"))
    # Cordoning it does not claim the operator's cordon either.
    outcome = k8s.run(act("cordon", "n2"))
    assert outcome.details["owner"] == "other"
    assert CORDONED_BY not in api.node("n2")["metadata"]["annotations"]
    with pytest.raises(PermanentError):
        k8s.run(act("uncordon", "n2"))
    assert api.node("n2")["spec"]["unschedulable"] is True


def test_evict_skips_daemonset_and_mirror_pods(api: StubKubernetesAPI,
                                               k8s: KubernetesDriver) -> None:
    api.add_pod("ml", "trainer-0", "n1", owner="StatefulSet")
    api.add_pod("ml", "loose", "n1")
    api.add_pod("kube-system", "dcgm-exporter", "n1", owner="DaemonSet")
    api.add_pod("kube-system", "etcd-n1", "n1", mirror=True)
    api.add_pod("ml", "done", "n1", phase="Succeeded")
    api.add_pod("ml", "elsewhere", "n9")
    assert k8s.reconcile(act("evict")) is False
    outcome = k8s.run(act("evict"))
    assert sorted(outcome.details["evicted"]) == ["ml/loose", "ml/trainer-0"]
    evictions = {c.path for c in api.calls("POST")}
    assert evictions == {"/api/v1/namespaces/ml/pods/trainer-0/eviction",
                         "/api/v1/namespaces/ml/pods/loose/eviction"}
    body = api.calls("POST")[0].json()
    assert body["apiVersion"] == "policy/v1"
    assert body["kind"] == "Eviction"
    listing = api.calls("GET", "/api/v1/pods")[-1]
    assert listing.query["fieldSelector"] == ["spec.nodeName=n1"]
    assert api.node("n1")["spec"]["unschedulable"] is True  # cordoned first, like drain
    assert ("kube-system", "dcgm-exporter") in api.pods
    assert k8s.reconcile(act("evict")) is True


def test_evict_blocked_by_disruption_budget_is_temporary(
        api: StubKubernetesAPI, k8s: KubernetesDriver) -> None:
    api.add_pod("ml", "protected", "n1", pdb=True)
    api.add_pod("ml", "free", "n1")
    with pytest.raises(TemporaryError, match="PodDisruptionBudget") as caught:
        k8s.run(act("evict"))
    assert caught.value.retry_after == 5.0
    assert ("ml", "free") not in api.pods  # the others were still evicted
    assert ("ml", "protected") in api.pods


def test_unknown_node_is_permanent(k8s: KubernetesDriver) -> None:
    with pytest.raises(PermanentError, match="not found"):
        k8s.run(act("cordon", "nope"))


def test_server_errors_and_conflicts_are_temporary(api: StubKubernetesAPI,
                                                   k8s: KubernetesDriver) -> None:
    api.fail_next = [503]
    with pytest.raises(TemporaryError, match="503"):
        k8s.run(act("cordon"))
    api.fail_next = [409]
    with pytest.raises(TemporaryError, match="409"):
        k8s.run(act("cordon"))


def test_stale_resource_version_is_a_conflict(api: StubKubernetesAPI) -> None:
    # The stub enforces resourceVersion as the API server does.
    api.add_node("n3")
    response = requests.patch(f"{api.url}/api/v1/nodes/n3", timeout=2, data=json.dumps(
        {"metadata": {"resourceVersion": "1"}, "spec": {"unschedulable": True}}))
    assert response.status_code == 409


def test_unreachable_api_is_temporary(api: StubKubernetesAPI) -> None:
    driver = KubernetesDriver(KubernetesSettings(host=api.url, timeout=2.0))  # type: ignore[arg-type]
    api.stop()
    with pytest.raises(TemporaryError):
        driver.run(act("cordon"))


def test_actions_it_cannot_do(k8s: KubernetesDriver) -> None:
    with pytest.raises(PermanentError):
        k8s.run(act("throttle"))
    with pytest.raises(PermanentError):
        k8s.run(ActionRequest(id="x", key="x", action="cordon", node=None, reason="r"))


def test_missing_configuration_is_an_error_at_start(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="Kubernetes configuration"):
        KubernetesDriver(KubernetesSettings(kubeconfig=str(tmp_path / "missing")))
