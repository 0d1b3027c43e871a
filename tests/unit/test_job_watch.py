"""The DistributedJob watch against a recording API server: list, watch, 410, status."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from sn_monitor.clock import ManualClock
from sn_monitor.controller.jobs.crd_watch import JobWatch, job_from_object
from sn_monitor.controller.jobs.spec import DistributedJob, job_to_dict
from sn_monitor.controller.jobs.views import JobStatus
from sn_monitor.controller.k8s.job_api import DistributedJobApi
from sn_monitor.controller.k8s.settings import KubernetesSettings
from sn_monitor.controller.k8s.watch import Gone, WatchError, parse_event, split_lines
from tests.conftest import ROOT
from tests.drivers.k8s_watch_server import FakeDistributedJobAPI
from tests.drivers.servers import wait_until

SEED = yaml.safe_load((ROOT / "deploy" / "jobs" / "minimal.yaml").read_text())


class FakeJobs:
    """The orchestrator's job API, in memory: JobStatus rows the test can change."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[str, JobStatus] = {}
        self.added: list[tuple[str, str]] = []
        self.removed: list[str] = []

    def add_job(self, job: DistributedJob, source: str) -> JobStatus:
        with self.lock:
            self.added.append((job.name, source))
            old = self.rows.get(job.name)
            row = _status(job, source) if old is None else dataclasses.replace(
                old, spec=job_to_dict(job), replicas=job.spec.replicas, source=source)
            self.rows[job.name] = row
            return row

    def remove_job(self, name: str) -> bool:
        with self.lock:
            self.removed.append(name)
            return self.rows.pop(name, None) is not None

    def jobs(self) -> list[JobStatus]:
        with self.lock:
            return list(self.rows.values())

    def job(self, name: str) -> JobStatus | None:
        with self.lock:
            return self.rows.get(name)

    def set(self, name: str, **changes: Any) -> None:
        with self.lock:
            self.rows[name] = dataclasses.replace(self.rows[name], **changes)


def _status(job: DistributedJob, source: str) -> JobStatus:
    """A new job as the orchestrator shows it: no rank has reported yet."""
    return JobStatus(
        name=job.name, source=source, state="pending",
        state_reason=f"waiting for ranks 0/{job.spec.replicas}", generation=1,
        failures=0, max_failures=job.spec.max_failures, strategy=job.spec.recovery_strategy,
        replicas=job.spec.replicas, min_replicas=job.spec.min_replicas,
        nodes=(), spares=(), failed_nodes=(),
        checkpoint=None, checkpoint_request=None, recovery=None, world_size=0,
        ranks_reporting=0, last_step=None, median_step_seconds=None,
        recent_step_seconds=None, effective_training_ratio=None,
        checkpoint_interval_seconds=900.0, checkpoint_interval_recommended_seconds=None,
        checkpoint_save_seconds=None, mtbf_seconds=None, created_at=0.0, updated_at=0.0,
        spec=job_to_dict(job))


@pytest.fixture
def server() -> Iterator[FakeDistributedJobAPI]:
    with FakeDistributedJobAPI() as api:
        yield api


@pytest.fixture
def jobs() -> FakeJobs:
    return FakeJobs()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def watch(server: FakeDistributedJobAPI, jobs: FakeJobs,
          clock: ManualClock) -> Iterator[JobWatch]:
    api = DistributedJobApi(KubernetesSettings(host=server.url, timeout=2.0), "training")
    job_watch = JobWatch(api, jobs, clock, status_interval=5.0, backoff=0.01,
                         max_backoff=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=job_watch.run, args=(stop,), daemon=True)
    thread.start()
    yield job_watch
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive(), "the watch did not stop"


def test_the_seed_file_creates_a_job_and_its_status(server, jobs, watch):
    assert SEED["apiVersion"] == "training.ai/v1"
    server.apply(SEED)
    assert wait_until(lambda: jobs.job("trillion-model") is not None)
    assert jobs.added == [("trillion-model", "kubernetes:training/trillion-model")]
    row = jobs.job("trillion-model")
    assert row.replicas == 128
    assert row.spec["spec"]["recoveryStrategy"] == "elastic"
    assert row.spec["spec"]["maxFailures"] == 40
    assert wait_until(lambda: server.status_writes)
    write = server.status_writes[0]
    assert write.method == "PATCH"
    assert write.content_type == "application/merge-patch+json"
    assert (write.namespace, write.name) == ("training", "trillion-model")
    status = write.body["status"]
    assert (status["state"], status["reason"]) == ("pending", "waiting for ranks 0/128")
    assert "ettr" not in status  # none until a rank reports
    assert status["generation"] == 1
    assert status["nodes"] == 0
    assert status["failures"] == 0
    assert status["observedGeneration"] == 1
    conditions = {c["type"]: c for c in status["conditions"]}
    accepted = conditions["Accepted"]
    assert accepted["status"] == "True"
    assert accepted["lastTransitionTime"].endswith("Z")
    assert (conditions["Running"]["status"], conditions["Running"]["reason"],
            conditions["Running"]["message"]) == ("False", "Pending", "waiting for ranks 0/128")
    # the watch and list asked with a resourceVersion and for bookmarks
    assert server.wait_watches(1)
    watches = server.calls("GET", watch=True)
    assert watches[0]["resourceVersion"][0] in {"100", "101"}  # the list's
    assert watches[0]["allowWatchBookmarks"] == ["true"]


def test_a_modified_spec_updates_the_job_and_a_deleted_object_removes_it(
        server, jobs, watch):
    server.apply(SEED)
    assert wait_until(lambda: jobs.job("trillion-model") is not None)
    changed = {**SEED, "spec": {**SEED["spec"], "replicas": 96}}
    server.apply(changed)
    assert wait_until(lambda: jobs.job("trillion-model").replicas == 96)
    assert len(jobs.added) == 2
    server.delete("trillion-model")
    assert wait_until(lambda: jobs.job("trillion-model") is None)
    assert jobs.removed == ["trillion-model"]


def test_an_unchanged_status_is_not_written_again_and_changes_are_throttled(
        server, jobs, watch, clock):
    server.apply(SEED)
    assert wait_until(lambda: len(server.status_writes) == 1)
    # our own write comes back as MODIFIED (same spec): no new job, no new write
    server.bookmark()
    watch.write_statuses()
    assert len(jobs.added) == 1
    assert len(server.status_writes) == 1
    jobs.set("trillion-model", state="recovering", state_reason="node-3 failed",
             generation=2, failures=1, effective_training_ratio=0.91234,
             checkpoint={"step": 1200, "path": "/ckpt/step-1200"})
    watch.write_statuses()
    assert len(server.status_writes) == 1  # within status_interval: throttled
    clock.advance(5.0)
    watch.write_statuses()
    assert len(server.status_writes) == 2
    status = server.status_writes[1].body["status"]
    assert status["state"] == "recovering"
    assert status["generation"] == 2
    assert status["failures"] == 1
    assert status["ettr"] == 0.912
    assert status["lastCheckpoint"] == {"step": 1200, "path": "/ckpt/step-1200"}
    running = {c["type"]: c for c in status["conditions"]}["Running"]
    assert (running["status"], running["reason"]) == ("False", "Recovering")
    clock.advance(5.0)
    watch.write_statuses()
    assert len(server.status_writes) == 2  # nothing changed


def test_a_410_gone_relists_and_converges(server, jobs, watch):
    server.apply(SEED)
    assert wait_until(lambda: jobs.job("trillion-model") is not None)
    assert server.wait_watches(1)
    lists_before = watch.lists
    # while the watch is broken off, the object is deleted and another one created,
    # and the history is compacted: the next watch from the old version gets a 410
    server.compact()
    other = {**SEED, "metadata": {"name": "other-model"}}
    with server.cond:
        server.objects.pop(("training", "trillion-model"))
    server.apply(other)
    server.compact()
    server.break_watches()
    assert wait_until(lambda: jobs.job("other-model") is not None
                      and jobs.job("trillion-model") is None)
    assert watch.lists > lists_before
    assert jobs.removed == ["trillion-model"]


def test_jobs_from_files_or_the_api_are_not_touched(server, jobs, watch):
    seed = job_from_object(SEED)
    jobs.add_job(seed, "/etc/sn-monitor/jobs/trillion-model")
    server.apply(SEED)
    assert wait_until(lambda: server.status_writes)
    status = server.status_writes[0].body["status"]
    accepted = {c["type"]: c for c in status["conditions"]}["Accepted"]
    assert (accepted["status"], accepted["reason"]) == ("False", "NameTaken")
    assert jobs.job("trillion-model").source == "/etc/sn-monitor/jobs/trillion-model"
    server.delete("trillion-model")
    server.bookmark()
    assert server.wait_watches(1)
    assert jobs.job("trillion-model") is not None
    assert jobs.removed == []


def test_a_bad_object_gets_a_condition_naming_the_field(server, jobs, watch, caplog):
    bad = {**SEED, "spec": {**SEED["spec"], "recoveryStrategy": "pray"}}
    server.apply(bad)
    assert wait_until(lambda: server.status_writes)
    status = server.status_writes[0].body["status"]
    assert status["state"] == "Invalid"
    accepted = {c["type"]: c for c in status["conditions"]}["Accepted"]
    assert accepted["reason"] == "InvalidSpec"
    assert "spec.recoveryStrategy" in accepted["message"]
    assert jobs.job("trillion-model") is None
    assert "training/trillion-model" in caplog.text
    # fixed: the job is created and the condition flips
    server.apply(SEED)
    assert wait_until(lambda: jobs.job("trillion-model") is not None)


def test_an_unreachable_api_server_is_retried_with_backoff(jobs, clock, caplog):
    api = DistributedJobApi(KubernetesSettings(host="http://127.0.0.1:9", timeout=0.5),
                            "training")
    job_watch = JobWatch(api, jobs, clock, backoff=0.01, max_backoff=0.02)
    stop = threading.Event()
    thread = threading.Thread(target=job_watch.run, args=(stop,), daemon=True)
    thread.start()

    def retries() -> int:
        return sum("listing again in" in r.getMessage() for r in caplog.records)
    assert wait_until(lambda: retries() >= 3)  # failed, waited, tried again
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert job_watch.lists == 0


@pytest.mark.parametrize(("line", "error"), [
    (b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "old"}}', Gone),
    (b'{"type": "ERROR", "object": {"kind": "Status", "code": 500}}', WatchError),
    (b'not json', WatchError),
    (b'{"type": "SOMETHING", "object": {}}', WatchError),
])
def test_parse_event_errors(line, error):
    with pytest.raises(error):
        parse_event(line)


def test_parse_event_and_split_lines():
    event = parse_event(b'{"type": "BOOKMARK", "object": {"metadata": '
                        b'{"resourceVersion": "7"}}}')
    assert event.type == "BOOKMARK"
    assert event.resource_version == "7"
    assert list(split_lines([b'{"a"', b': 1}\n{"b": 2}\n', b"\n", b"{}"])) == [
        b'{"a": 1}', b'{"b": 2}', b"{}"]


def test_the_controller_setting_builds_the_watch(server):
    from sn_monitor.config import bind, parse_yaml
    from sn_monitor.controller.process.startup import build_job_watch
    from sn_monitor.controller.settings import ControllerSettings

    settings = bind(ControllerSettings, parse_yaml(
        f"kubernetes: {{watch_jobs: true, namespace: training, api: {{host: '{server.url}'}}}}\n",
        "controller.yaml"))

    class _Controller:
        jobs = FakeJobs()

    job_watch = build_job_watch(settings, _Controller(), ManualClock())  # type: ignore[arg-type]
    assert job_watch.api.list().resource_version == "100"


def test_the_seed_file_through_the_watch_is_a_job_of_the_real_controller(server, tmp_path):
    from tests.support.harness import make_harness

    h = make_harness(tmp_path, [])
    api = DistributedJobApi(KubernetesSettings(host=server.url, timeout=2.0), "training")
    job_watch = JobWatch(api, h.controller.jobs, h.clock, status_interval=5.0, backoff=0.01,
                         max_backoff=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=job_watch.run, args=(stop,), daemon=True)
    thread.start()
    try:
        server.apply(SEED)
        assert wait_until(lambda: h.controller.get_job("trillion-model") is not None)
        job = h.controller.get_job("trillion-model")
        assert job["source"] == "kubernetes:training/trillion-model"
        assert job["replicas"] == 128
        assert wait_until(lambda: server.status_writes)
        status = server.status_writes[0].body["status"]
        assert status["state"] == job["state"]
        assert status["observedGeneration"] == 1
        server.delete(SEED["metadata"]["name"])  # kubectl delete dj trillion-model
        assert wait_until(lambda: h.controller.get_job("trillion-model") is None)
    finally:
        stop.set()
        thread.join(timeout=5)
        h.controller.close()
        h.store.close()
    assert not thread.is_alive()
