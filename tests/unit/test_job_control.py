"""Job control on Kubernetes and Slurm: the spec, the drivers, and the router that builds them.

Kubernetes runs the real client against the stub API server; Slurm a fake scontrol /
squeue that record their argv.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError, parse_yaml
from sn_monitor.controller.actions.base import Outcome, PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.job_control import JobControlDriver
from sn_monitor.controller.actions.drivers.k8s_jobs import (
    CHECKPOINT_ANNOTATION,
    KubernetesJobControl,
)
from sn_monitor.controller.actions.drivers.slurm_jobs import SlurmJobControl, SlurmJobSettings
from sn_monitor.controller.actions.routing import JobControlDrivers, JobControlRouter
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.jobs.spec import (
    JobControl,
    JobSpecError,
    job_from_json,
    job_to_dict,
    load_job,
    parse_job,
)
from sn_monitor.controller.k8s.settings import KubernetesJobSettings
from tests.drivers.servers import FakeScontrol, StubKubernetesAPI, make_fake_scontrol

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "tests" / "fixtures" / "jobs"
SELECTOR = {"training.kubeflow.org/job-name": "trillion"}
JOB_LABELS = {**SELECTOR, "training.kubeflow.org/replica-type": "worker"}
#: 2024-05-01T12:00:00Z: after the stub's default creationTimestamp (10:00).
REQUESTED = 1714564800.0


def job_yaml(control: str) -> str:
    return f"""\
apiVersion: sn-monitor/v1
kind: DistributedJob
metadata: {{name: trillion}}
spec:
  replicas: 4
  nodes: [n1, n2, n3, n4]
  checkpoint: {{dir: /ckpt}}
  control:
{control}
"""


def control_of(text: str) -> JobControl:
    return parse_job(parse_yaml(job_yaml(text), "job.yaml")).spec.control


def act(action: str, node: str | None = None, created: float = REQUESTED,
        **params: Any) -> ActionRequest:
    return ActionRequest(id=f"{action}-1", key=f"recovery:1:{action}",
                         action=action,  # type: ignore[arg-type]
                         node=node, reason="node n1 failed", created_seconds=created,
                         params={"job": "trillion", **params})


# ------------------------------------------------------------------ spec


def test_the_kubernetes_and_slurm_examples_load() -> None:
    k8s = load_job(JOBS / "pytorchjob-k8s.yaml").spec.control
    assert k8s.kind == "kubernetes"
    assert k8s.kubernetes is not None
    assert k8s.kubernetes.namespace == "ml"
    assert k8s.kubernetes.label_selector == (
        "training.kubeflow.org/job-name=llama-pretrain,"
        "training.kubeflow.org/replica-type=worker")
    assert k8s.kubernetes.grace_period_seconds == 30
    slurm = load_job(JOBS / "slurm-batch.yaml").spec.control
    assert slurm.kind == "slurm"
    assert slurm.slurm == SlurmJobSettings(job_id="4242", scontrol="/usr/bin/scontrol",
                                           timeout=20.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["pytorchjob-k8s.yaml", "slurm-batch.yaml"])
def test_new_control_kinds_round_trip_through_the_api(name: str) -> None:
    job = load_job(JOBS / name)
    again = job_from_json(json.dumps(job_to_dict(job)).encode())
    assert again == job


def test_slurm_job_by_name_and_user() -> None:
    control = control_of("    slurm: {jobName: trillion, user: ml, squeue: /opt/slurm/squeue}")
    assert control.slurm is not None
    assert (control.slurm.job_id, control.slurm.job_name, control.slurm.user) == (
        None, "trillion", "ml")
    with pytest.raises(ConfigError, match="user only narrows a jobName"):
        control_of("    slurm: {jobId: '1', user: ml}")


def test_kubernetes_control_takes_api_settings() -> None:
    control = control_of("    kubernetes:\n      namespace: ml\n      selector: {app: t}\n"
                         "      host: http://127.0.0.1:8001\n      timeout: 3s\n")
    assert control.kubernetes is not None
    api = control.kubernetes.api_settings()
    assert (api.host, api.timeout) == ("http://127.0.0.1:8001", 3.0)
    with pytest.raises(ConfigError, match="invalid label value"):
        control_of("    kubernetes: {namespace: ml, selector: {app: 'a b'}}")


def test_api_body_errors_name_the_key() -> None:
    body = {"apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
            "metadata": {"name": "x"},
            "spec": {"replicas": 1, "nodes": ["n1"], "checkpoint": {"dir": "/c"},
                     "control": {"slurm": {"jobId": "x1"}}}}
    with pytest.raises(JobSpecError) as caught:
        job_from_json(json.dumps(body).encode())
    assert str(caught.value).startswith("spec.control.slurm.jobId: expected a Slurm job id")
    body["spec"]["control"] = {"slurm": {"jobId": 7}, "webhook": "http://l/c"}  # type: ignore[index]
    with pytest.raises(JobSpecError, match="exactly one of webhook, command, kubernetes"):
        job_from_json(json.dumps(body).encode())


def test_job_control_driver_takes_exactly_one_target(tmp_path: Path) -> None:
    slurm = SlurmJobControl(SlurmJobSettings(job_id="1"))
    assert JobControlDriver(slurm=slurm).via == "slurm"
    with pytest.raises(ValueError, match="exactly one"):
        JobControlDriver()
    with pytest.raises(ValueError, match="exactly one"):
        JobControlDriver(slurm=slurm, command=slurm)


# ------------------------------------------------------------------ kubernetes


@pytest.fixture
def api() -> Iterator[StubKubernetesAPI]:
    stub = StubKubernetesAPI()
    stub.add_pod("ml", "trainer-worker-0", "n1", labels=JOB_LABELS)
    stub.add_pod("ml", "trainer-worker-1", "n2", labels=JOB_LABELS)
    stub.add_pod("ml", "trainer-worker-2", "n3", labels=JOB_LABELS)
    stub.add_pod("ml", "trainer-worker-3", None, labels=JOB_LABELS, phase="Pending")
    stub.add_pod("ml", "other-job-0", "n1", labels={"training.kubeflow.org/job-name": "other"})
    stub.add_pod("team-b", "trainer-worker-0", "n1", labels=JOB_LABELS)  # another namespace
    stub.start()
    yield stub
    stub.stop()


def k8s_driver(api: StubKubernetesAPI, grace: int | None = 30) -> KubernetesJobControl:
    return KubernetesJobControl(KubernetesJobSettings(
        namespace="ml", selector=dict(SELECTOR), grace_period_seconds=grace, host=api.url,
        timeout=2.0))  # type: ignore[arg-type]


def pods(api: StubKubernetesAPI) -> set[tuple[str, str]]:
    return set(api.pods)


def test_restore_deletes_only_the_jobs_pods_off_the_new_node_list(
        api: StubKubernetesAPI) -> None:
    driver = k8s_driver(api)
    request = act("restore", nodes=["n2", "n3", "n5"], checkpoint={"step": 900, "path": "/c"},
                  generation=2)
    assert driver.reconcile(request) is False
    outcome = driver.run(request)
    assert outcome.details["deleted"] == ["trainer-worker-0"]
    assert outcome.details["failed_nodes"] == ["n1"]
    assert outcome.details["changed"] is True
    assert pods(api) == {("ml", "trainer-worker-1"), ("ml", "trainer-worker-2"),
                         ("ml", "trainer-worker-3"), ("ml", "other-job-0"),
                         ("team-b", "trainer-worker-0")}
    (listing,) = api.calls("GET", "/api/v1/namespaces/ml/pods")[:1]
    assert listing.query["labelSelector"] == ["training.kubeflow.org/job-name=trillion"]
    (delete,) = api.calls("DELETE")
    assert delete.path == "/api/v1/namespaces/ml/pods/trainer-worker-0"
    assert delete.json()["gracePeriodSeconds"] == 30
    assert driver.reconcile(request) is True
    again = driver.run(request)  # a retry: nothing left to do
    assert again.details["changed"] is False
    assert len(api.calls("DELETE")) == 1
    driver.close()


def test_failover_deletes_the_jobs_pods_on_the_named_node(api: StubKubernetesAPI) -> None:
    driver = k8s_driver(api, grace=None)
    outcome = driver.run(act("failover", node="n3"))
    assert outcome.details["deleted"] == ["trainer-worker-2"]
    (delete,) = api.calls("DELETE")
    assert not delete.body  # no grace period set: the pod's own
    # Explicit failed nodes win over the node list.
    outcome = driver.run(act("restore", failed_nodes=["n2"], nodes=["n1"]))
    assert outcome.details["deleted"] == ["trainer-worker-1"]
    assert ("ml", "trainer-worker-0") in api.pods


def test_replacement_pods_created_after_the_request_are_kept(api: StubKubernetesAPI) -> None:
    api.add_pod("ml", "trainer-worker-0-new", "n9", labels=JOB_LABELS,
                created="2024-05-01T12:00:05Z")
    outcome = k8s_driver(api).run(act("restore", nodes=["n2", "n3"]))
    assert outcome.details["deleted"] == ["trainer-worker-0"]
    assert ("ml", "trainer-worker-0-new") in api.pods


def test_terminating_pods_are_left_unless_grace_is_zero(api: StubKubernetesAPI) -> None:
    api.add_pod("ml", "stuck", "n4", labels=JOB_LABELS, deleting=True)
    request = act("failover", node="n4")
    outcome = k8s_driver(api).run(request)
    assert outcome.details["deleted"] == []
    assert k8s_driver(api).reconcile(request) is True
    forced = k8s_driver(api, grace=0).run(request)
    assert forced.details["deleted"] == ["stuck"]
    assert api.calls("DELETE")[-1].json()["gracePeriodSeconds"] == 0


def test_a_pod_already_gone_is_fine(api: StubKubernetesAPI) -> None:
    api.fail_method["DELETE"] = [404]
    outcome = k8s_driver(api).run(act("failover", node="n1"))
    assert outcome.details["gone"] == ["trainer-worker-0"]
    assert outcome.details["deleted"] == []


@pytest.mark.parametrize("status", [409, 429, 500, 503])
def test_conflicts_throttling_and_server_errors_are_temporary(
        api: StubKubernetesAPI, status: int) -> None:
    api.fail_method["DELETE"] = [status]
    with pytest.raises(TemporaryError, match=str(status)):
        k8s_driver(api).run(act("failover", node="n1"))
    api.fail_next = [status]  # the listing too
    with pytest.raises(TemporaryError):
        k8s_driver(api).run(act("failover", node="n1"))


def test_forbidden_is_permanent(api: StubKubernetesAPI) -> None:
    api.fail_method["DELETE"] = [403]
    with pytest.raises(PermanentError, match="403"):
        k8s_driver(api).run(act("failover", node="n1"))


def test_restore_without_nodes_is_permanent(api: StubKubernetesAPI) -> None:
    with pytest.raises(PermanentError, match="no failed node"):
        k8s_driver(api).run(act("restore"))
    assert not api.calls("DELETE")


def test_unreachable_api_is_temporary(api: StubKubernetesAPI) -> None:
    driver = k8s_driver(api)
    api.stop()
    with pytest.raises(TemporaryError):
        driver.run(act("failover", node="n1"))
    assert driver.reconcile(act("failover", node="n1")) is None


def test_checkpoint_annotates_the_running_pods_once(api: StubKubernetesAPI) -> None:
    driver = k8s_driver(api)
    request = act("checkpoint", checkpoint_id="ck-17", reason="interval")
    assert driver.reconcile(request) is False
    outcome = driver.run(request)
    assert outcome.details["annotated"] == ["trainer-worker-0", "trainer-worker-1",
                                            "trainer-worker-2"]  # not the pending one
    for name in outcome.details["annotated"]:
        assert api.pod("ml", name)["metadata"]["annotations"][CHECKPOINT_ANNOTATION] == "ck-17"
    assert CHECKPOINT_ANNOTATION not in api.pod("ml", "other-job-0")["metadata"]["annotations"]
    assert CHECKPOINT_ANNOTATION not in api.pod("team-b",
                                                "trainer-worker-0")["metadata"]["annotations"]
    assert driver.reconcile(request) is True
    assert driver.run(request).details["changed"] is False
    assert len(api.calls("PATCH")) == 3
    assert not api.calls("DELETE")


def test_kubernetes_job_control_refuses_other_actions(api: StubKubernetesAPI) -> None:
    with pytest.raises(PermanentError):
        k8s_driver(api).run(act("cordon", node="n1"))


# ------------------------------------------------------------------ slurm


@pytest.fixture
def scontrol(tmp_path: Path) -> FakeScontrol:
    return make_fake_scontrol(tmp_path / "bin")


def slurm(fake: FakeScontrol, timeout: float = 5.0, **settings: Any) -> SlurmJobControl:
    settings.setdefault("job_id", "4242")
    return SlurmJobControl(SlurmJobSettings(scontrol=fake.path, squeue=fake.squeue_path,
                                            timeout=timeout, **settings))  # type: ignore[arg-type]


@pytest.mark.parametrize("action", ["restore", "failover"])
def test_restore_and_failover_requeue_the_job(scontrol: FakeScontrol, action: str) -> None:
    outcome = slurm(scontrol).run(act(action, nodes=["n2"]))
    assert scontrol.calls() == ["requeue 4242"]
    assert outcome.details == {"requeued": ["4242"], "pending": [], "changed": True}


def test_a_job_already_pending_is_done(scontrol: FakeScontrol) -> None:
    scontrol.fail_with("Requeue job 4242 error: Job is pending execution\n")
    outcome = slurm(scontrol).run(act("restore"))
    assert outcome.details["changed"] is False
    assert "already waiting" in outcome.message


def test_checkpoint_is_nothing_to_do_on_slurm(scontrol: FakeScontrol) -> None:
    outcome = slurm(scontrol).run(act("checkpoint", checkpoint_id="ck-1"))
    assert "should_checkpoint()" in outcome.message
    assert outcome.details["supported"] is False
    assert scontrol.calls() == []


@pytest.mark.parametrize("stderr", [
    "slurm_requeue error: Invalid job id specified",
    "Requeue job 4242 error: Job/step already completing or completed",
    "slurm_requeue error: Access/permission denied",
    "slurm_requeue error: Requested operation is presently disabled",
])
def test_hopeless_requeues_are_permanent(scontrol: FakeScontrol, stderr: str) -> None:
    scontrol.fail_with(stderr + "\n")
    with pytest.raises(PermanentError, match=stderr.split(": ")[-1].split("/")[0]):
        slurm(scontrol).run(act("restore"))


def test_other_failures_and_timeouts_are_temporary(scontrol: FakeScontrol) -> None:
    scontrol.fail_with("slurm_requeue error: Unable to contact slurm controller\n")
    with pytest.raises(TemporaryError, match="Unable to contact"):
        slurm(scontrol).run(act("restore"))
    (scontrol.directory / "scontrol.fail").unlink()
    scontrol.hang(30)
    with pytest.raises(TemporaryError, match="timed out"):
        slurm(scontrol, timeout=0.3).run(act("restore"))


def test_missing_scontrol_is_permanent(tmp_path: Path) -> None:
    driver = SlurmJobControl(SlurmJobSettings(job_id="1", scontrol=str(tmp_path / "nope")))
    with pytest.raises(PermanentError, match="cannot run"):
        driver.run(act("restore"))


def test_hostile_text_never_reaches_a_shell(scontrol: FakeScontrol) -> None:
    # The reason and params are never part of argv: only the configured job id is.
    request = ActionRequest(id="x", key="x", action="restore", node="n1",
                            reason='$(touch /tmp/pwned) "; rm -rf /',
                            params={"job": "trillion", "nodes": ["`id`"]})
    slurm(scontrol).run(request)
    assert scontrol.calls() == ["requeue 4242"]


def test_job_by_name_requeues_its_running_jobs(scontrol: FakeScontrol) -> None:
    scontrol.set_queue("4242 RUNNING", "4243_1 PENDING", "4243_2 RUNNING")
    driver = slurm(scontrol, job_id=None, job_name="trillion", user="ml")
    outcome = driver.run(act("restore"))
    assert scontrol.squeue_calls() == ["--noheader --format=%i %T --name=trillion --user=ml"]
    assert scontrol.calls() == ["requeue 4242", "requeue 4243_2"]
    assert outcome.details["pending"] == ["4243_1"]
    scontrol.set_queue()
    with pytest.raises(PermanentError, match="no Slurm job named 'trillion' of user ml"):
        driver.run(act("restore"))


def test_slurm_reconcile(scontrol: FakeScontrol) -> None:
    driver = slurm(scontrol)
    scontrol.set_job("4242", "PENDING")
    assert driver.reconcile(act("restore")) is True
    scontrol.set_job("4242", "RUNNING")
    assert driver.reconcile(act("restore")) is None  # restarted already, or never requeued
    assert scontrol.calls() == ["show job 4242", "show job 4242"]
    assert driver.reconcile(act("checkpoint")) is True


# ------------------------------------------------------------------ router


def test_router_builds_the_drivers_from_the_jobs_spec(api: StubKubernetesAPI,
                                                      scontrol: FakeScontrol) -> None:
    controls = {
        "trillion": control_of(
            "    kubernetes:\n      namespace: ml\n"
            "      selector: {training.kubeflow.org/job-name: trillion}\n"
            f"      host: {api.url}\n"),
        "moe": control_of(f"    slurm: {{jobId: 77, scontrol: {scontrol.path}}}"),
    }
    fallback_calls: list[ActionRequest] = []

    class Fallback:
        name = "job"

        def run(self, request: ActionRequest) -> Outcome:
            fallback_calls.append(request)
            return Outcome("fallback")

    shared = JobControlDrivers(ManualClock())
    router = JobControlRouter(Fallback(), controls.get, ManualClock(), shared)
    outcome = router.run(act("restore", nodes=["n2", "n3"]))
    assert outcome.details["via"] == "kubernetes"
    assert outcome.details["deleted"] == ["trainer-worker-0"]
    assert router.reconcile(act("restore", nodes=["n2", "n3"])) is True

    moe = ActionRequest(id="m", key="m", action="failover", node="n1", reason="r",
                        params={"job": "moe"})
    assert router.run(moe).details["via"] == "slurm"
    assert scontrol.calls() == ["requeue 77"]

    # A job without spec.control (or no job at all) goes to the controller-wide driver.
    router.run(ActionRequest(id="o", key="o", action="restore", node=None, reason="r",
                             params={"job": "unknown"}))
    assert len(fallback_calls) == 1

    # One driver per job, shared by the routers; a new spec builds a new one.
    first = shared.get("trillion", controls["trillion"])
    assert JobControlRouter(None, controls.get, ManualClock(), shared)._driver_for(
        "trillion") is first
    controls["trillion"] = control_of(
        f"    kubernetes: {{namespace: ml, selector: {{app: t}}, host: '{api.url}'}}")
    assert shared.get("trillion", controls["trillion"]) is not first
    shared.close()


def test_router_reports_a_kubernetes_job_without_api_access(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    control = control_of("    kubernetes:\n      namespace: ml\n      selector: {app: t}\n"
                         f"      kubeconfig: {tmp_path / 'missing'}\n")
    router = JobControlRouter(None, lambda job: control, ManualClock())
    with pytest.raises(PermanentError, match="job trillion: cannot reach its launcher"):
        router.run(act("restore", nodes=["n2"]))
    assert router.reconcile(act("restore", nodes=["n2"])) is None
