"""The job orchestrator: scheduled and pre-emptive checkpoints, hangs, recoveries."""

from __future__ import annotations

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.jobs.settings import JobError, JobSettings, UnknownJob, UnknownRecovery
from sn_monitor.controller.storage.store import Store
from tests.support.jobs import (
    RecordingSubmit,
    checkpoint,
    make_job,
    node,
    orchestrator,
    train,
)

NODES = [node(i) for i in range(16)]


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state" / "controller.db")
    yield s
    s.close()


@pytest.fixture
def submit(store, clock):
    return RecordingSubmit(store, clock)


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    return d


@pytest.fixture
def orch(store, clock, submit):
    return orchestrator(store, clock, submit)


def _incident(store, clock, name, rule="fatal-xid", seen_ago=2.0):
    return store.open_incident(rule, name, severity="critical", message=f"{rule} on {name}",
                               observed_at=clock.time() - seen_ago, detected_at=clock.time())


def _with_checkpoints(ckpt, clock):
    """Complete 100 and 200, and a newer 300 whose data file is truncated."""
    checkpoint(ckpt, 100, clock)
    good = checkpoint(ckpt, 200, clock)
    checkpoint(ckpt, 300, clock, complete=False)
    return good


# --- jobs and membership -----------------------------------------------------------------


def test_add_list_remove_and_membership(orch, ckpt, store):
    status = orch.add_job(make_job(ckpt), "jobs/train.yaml")
    assert status.state == "pending"  # until a rank reports progress
    assert status.nodes == tuple(NODES)
    assert status.spares == (node(16), node(17))
    assert orch.jobs_of_node(node(3)) == ["train"]
    assert orch.jobs_of_node(node(16)) == []  # a spare is not running the job
    assert [j.name for j in orch.jobs()] == ["train"]
    assert store.get_job("train").source == "jobs/train.yaml"
    with pytest.raises(UnknownJob):
        orch.progress("nope", 0, node(0), 1, [(1, 1.0)])
    assert orch.remove_job("train")
    assert not orch.remove_job("train")
    assert orch.job("train") is None
    assert store.get_job("train") is None


def test_selector_picks_up_nodes_as_they_report(store, clock, submit, ckpt):
    labels: dict[str, dict[str, str]] = {}
    orch = orchestrator(store, clock, submit, labels)
    orch.add_job(make_job(ckpt, nodes=4, spares=1, selector={"supernode": "sn0"}), "api")
    assert orch.job("train").nodes == ()
    for i, sn in enumerate(["sn0", "sn0", "sn1", "sn0", "sn0"]):
        labels[node(i)] = {"supernode": sn}
        orch.note_node(node(i), labels[node(i)])
    # node-04 is the job's spare: matching the selector does not make it a member
    assert orch.job("train").nodes == (node(0), node(1), node(3))
    assert orch.jobs_of_node(node(2)) == []
    labels[node(1)] = {"supernode": "sn1"}
    orch.note_node(node(1), labels[node(1)])
    assert orch.jobs_of_node(node(1)) == []


def test_bad_progress_is_refused(orch, ckpt):
    orch.add_job(make_job(ckpt), "api")
    with pytest.raises(ValueError, match="rank"):
        orch.progress("train", 16, node(0), 16, [(1, 1.0)])
    with pytest.raises(ValueError, match="step"):
        orch.progress("train", 0, node(0), 16, [(-1, 1.0)])


# --- checkpoints -------------------------------------------------------------------------


def test_scheduled_checkpoint_every_interval(orch, clock, ckpt, submit):
    orch.add_job(make_job(ckpt, interval=60), "api")
    reply = train(orch, clock, "train", NODES, 1, 30)
    assert not reply.checkpoint_requested
    assert orch.tick() == []
    assert submit.of("checkpoint") == []
    train(orch, clock, "train", NODES, 31, 60)  # 60 s since the job was added
    orch.tick()
    [first] = submit.of("checkpoint")
    assert first.node is None
    assert first.params["job"] == "train"
    assert first.params["reason"] == "scheduled"
    reply = train(orch, clock, "train", NODES, 61, 61)
    assert reply.checkpoint_requested
    assert reply.checkpoint_id == first.params["checkpoint_id"]
    orch.tick()
    assert len(submit.of("checkpoint")) == 1  # requested once, not every tick
    path = checkpoint(ckpt, 61, clock)
    saved = orch.checkpoint_saved("train", 0, node(0), 61, str(path))
    assert saved.complete
    reply = train(orch, clock, "train", NODES, 62, 62)
    assert not reply.checkpoint_requested
    assert reply.to_dict() == {"checkpoint_requested": False, "checkpoint_id": None,
                               "restore": None}
    train(orch, clock, "train", NODES, 63, 119)
    orch.tick()
    assert len(submit.of("checkpoint")) == 1  # the checkpoint at 61 restarted the interval
    train(orch, clock, "train", NODES, 120, 122)
    orch.tick()
    second = submit.of("checkpoint")[1]
    assert second.params["checkpoint_id"] != first.params["checkpoint_id"]
    assert second.key != first.key


def test_an_incomplete_checkpoint_does_not_satisfy_a_request(orch, clock, ckpt):
    orch.add_job(make_job(ckpt, interval=10), "api")
    train(orch, clock, "train", NODES, 1, 10)
    orch.tick()
    path = checkpoint(ckpt, 10, clock, complete=False)
    assert not orch.checkpoint_saved("train", 0, node(0), 10, str(path)).complete
    assert orch.should_checkpoint("train") is not None
    assert orch.restore_point("train") is None


def test_preemptive_checkpoint_at_most_once_a_minute(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt), "api")
    train(orch, clock, "train", NODES, 1, 5)
    incident = _incident(store, clock, node(3), "pending-row-remap")
    [request] = orch.on_node_degrading(node(3), "pending-row-remap", incident)
    assert request.reason == "pre-emptive"
    [action] = submit.of("checkpoint")
    assert action.params["reason"] == "pre-emptive"
    assert action.incident_id == incident
    assert action.rule == "pending-row-remap"
    reply = train(orch, clock, "train", NODES, 6, 6)
    assert reply.checkpoint_requested
    assert reply.checkpoint_id == request.checkpoint_id
    clock.advance(30)
    assert orch.on_node_degrading(node(4), "ecc-rising", None) == [request]
    assert len(submit.of("checkpoint")) == 1
    clock.advance(31)
    [again] = orch.on_node_degrading(node(4), "ecc-rising", None)
    assert again.checkpoint_id != request.checkpoint_id
    assert len(submit.of("checkpoint")) == 2
    assert orch.on_node_degrading("elsewhere", "ecc-rising", None) == []


def test_restore_point_skips_a_newer_incomplete_checkpoint(orch, clock, ckpt):
    orch.add_job(make_job(ckpt), "api")
    good = _with_checkpoints(ckpt, clock)
    point = orch.restore_point("train")
    assert (point.step, point.path, point.generation) == (200, str(good), 0)
    assert point.to_dict() == {"step": 200, "path": str(good), "generation": 0}


# --- recovery ----------------------------------------------------------------------------


def test_fatal_fault_evicts_takes_a_spare_and_restores(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt, nodes=16, spares=2), "api")
    good = _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 310)
    incident = _incident(store, clock, node(5), seen_ago=2.0)
    fault_seen = clock.time() - 2.0
    [status] = orch.on_node_fault(node(5), "fatal", incident, alive=False)
    rid = status.id
    assert submit.keys("evict") == [f"recovery:{rid}:evict:{node(5)}"]
    assert submit.of("checkpoint") == []  # a dead rank cannot checkpoint
    [restore] = submit.of("restore")
    assert restore.key == f"recovery:{rid}:restore"
    assert restore.node is None
    expected_nodes = [*NODES[:5], node(16), *NODES[6:]]
    assert restore.params["nodes"] == expected_nodes
    assert restore.params["checkpoint"] == {"step": 200, "path": str(good)}
    assert restore.params["generation"] == 1
    assert status.state == "restoring"
    assert status.replacement_nodes == (node(16),)
    job = orch.job("train")
    assert job.state == "recovering"
    assert job.spares == (node(17),)
    assert job.failed_nodes == (node(5),)
    assert orch.jobs_of_node(node(5)) == []
    assert orch.jobs_of_node(node(16)) == ["train"]
    assert job.generation == 1

    # the surviving ranks learn where to restore from
    reply = orch.progress("train", 0, node(0), 16, [], None)
    assert reply.restore is not None
    assert reply.restore.to_dict() == {"step": 200, "path": str(good),
                                       "nodes": expected_nodes, "generation": 1}
    clock.advance(40)  # relaunch + checkpoint load
    assert orch.recovery(rid).state == "restoring"
    orch.progress("train", 5, node(16), 16, [(201, clock.time())], 1.0)
    done = orch.recovery(rid)
    assert done.state == "done"
    assert done.mttr_seconds == pytest.approx(clock.time() - fault_seen)
    assert orch.job("train").state == "running"
    assert orch.progress("train", 0, node(0), 16, [(201, clock.time())]).restore is None
    [duration] = orch.metrics().recoveries
    assert duration.id == rid
    assert duration.total == pytest.approx(done.mttr_seconds)
    assert duration.detection == pytest.approx(2.0)
    assert duration.reload == pytest.approx(40.0)
    assert (duration.detection + duration.eviction + duration.restart + duration.reload
            == pytest.approx(duration.total))
    # the same incident again (the controller settling again after a restart): no-op
    assert orch.on_node_fault(node(5), "fatal", incident, alive=False) == []
    assert len(submit.of("restore")) == 1
    assert orch.job("train").failures == 1


def test_lost_node_recovers_the_same_way(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt), "api")
    good = _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 50)
    incident = _incident(store, clock, node(9), "node-lost", seen_ago=10.0)
    [status] = orch.on_node_fault(node(9), "lost", incident, alive=False)
    assert status.kind == "lost"
    assert submit.keys("evict") == [f"recovery:{status.id}:evict:{node(9)}"]
    [restore] = submit.of("restore")
    assert restore.params["checkpoint"]["path"] == str(good)
    assert restore.params["nodes"][9] == node(16)
    clock.advance(20)
    orch.progress("train", 9, node(16), 16, [(200, clock.time())], 1.0)
    assert orch.recovery(status.id).mttr_seconds == pytest.approx(30.0)


def test_stale_progress_does_not_count_as_resumed(orch, clock, ckpt, store):
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 250)
    before = clock.time()
    [status] = orch.on_node_fault(node(5), "lost", _incident(store, clock, node(5)), False)
    clock.advance(5)
    # a batch from before the restore (a client retrying), and a node not in the new list
    orch.progress("train", 0, node(0), 16, [(250, before)])
    orch.progress("train", 5, node(5), 16, [(260, clock.time())])
    assert orch.recovery(status.id).state == "restoring"
    orch.progress("train", 0, node(0), 16, [(199, clock.time())])  # before the checkpoint
    assert orch.recovery(status.id).state == "restoring"
    orch.progress("train", 0, node(0), 16, [(200, clock.time())])
    assert orch.recovery(status.id).state == "done"


def test_alive_node_checkpoints_before_eviction(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 320)
    [status] = orch.on_node_fault(node(2), "fatal", _incident(store, clock, node(2)),
                                  alive=True)
    assert status.state == "checkpointing"
    [action] = submit.of("checkpoint")
    assert action.key == f"recovery:{status.id}:checkpoint"
    assert submit.of("evict") == []
    reply = train(orch, clock, "train", NODES, 321, 321)
    assert reply.checkpoint_requested
    path = checkpoint(ckpt, 321, clock)
    orch.checkpoint_saved("train", 0, node(0), 321, str(path))
    orch.tick()
    assert len(submit.of("evict")) == 1
    [restore] = submit.of("restore")
    assert restore.params["checkpoint"] == {"step": 321, "path": str(path)}


def test_checkpoint_wait_times_out(store, clock, submit, ckpt):
    orch = orchestrator(store, clock, submit, settings=JobSettings(checkpoint_wait=30))
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 20)
    [status] = orch.on_node_fault(node(2), "fatal", None, alive=True)
    train(orch, clock, "train", NODES, 21, 49)  # the job goes on; no checkpoint comes
    orch.tick()
    assert orch.recovery(status.id).state == "checkpointing"
    clock.advance(1)
    orch.tick()
    [restore] = submit.of("restore")
    assert restore.params["checkpoint"]["step"] == 200
    assert any(h["event"] == "checkpoint-timeout" for h in orch.recovery(status.id).history)


def test_a_job_that_stopped_at_the_fault_is_not_waited_for(store, clock, submit, ckpt):
    """A rank died with its GPU: no checkpoint will come, the latest one is used."""
    orch = orchestrator(store, clock, submit, settings=JobSettings(checkpoint_wait=120))
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 20)
    [status] = orch.on_node_fault(node(2), "fatal", None, alive=True)
    clock.advance(14)
    orch.tick()
    assert orch.recovery(status.id).state == "checkpointing"
    clock.advance(1)  # 15 s (at least three step times) and not one step since the fault
    orch.tick()
    assert any(h["event"] == "checkpoint-abandoned" for h in orch.recovery(status.id).history)
    [restore] = submit.of("restore")
    assert restore.params["checkpoint"]["step"] == 200


def test_hang_names_the_rank_that_stopped_first(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 50)
    train(orch, clock, "train", NODES, 51, 53, skip=frozenset({5}))  # rank 5 stops at 50
    clock.advance(100)
    assert orch.tick() == []  # 100 s < the 2-minute default
    clock.advance(21)
    [finding] = orch.tick()
    assert finding.job == "train"
    assert finding.ranks == (5,)
    assert finding.nodes == (node(5),)
    assert finding.step == 50
    assert finding.timeout_seconds == 120.0
    assert finding.rule == "job-hang"
    assert "rank(s) 5" in finding.message
    assert orch.tick() == []  # reported once per stall
    incident = store.open_incident("job-hang", node(5), "train", severity="critical",
                                   message=finding.message, observed_at=finding.stopped_at,
                                   detected_at=finding.detected_at)
    [status] = orch.on_hang(finding, incident)
    assert status.kind == "hang"
    assert status.failed_nodes == (node(5),)
    assert status.fault_seen == finding.stopped_at
    assert submit.of("checkpoint") == []  # a hung job cannot checkpoint
    assert submit.keys("evict") == [f"recovery:{status.id}:evict:{node(5)}"]
    assert len(submit.of("restore")) == 1


def test_a_hang_of_every_rank_together_restarts_in_place(orch, clock, ckpt, submit):
    orch.add_job(make_job(ckpt, hang=60), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 20)
    clock.advance(61)
    [finding] = orch.tick()
    assert finding.nodes == ()
    assert len(finding.ranks) == 16
    [status] = orch.on_hang(finding, None)
    assert submit.of("evict") == []
    [restore] = submit.of("restore")
    assert restore.params["nodes"] == NODES
    assert restore.params["generation"] == 1
    assert status.failed_nodes == ()


def test_no_hang_before_every_rank_reported(orch, clock, ckpt):
    orch.add_job(make_job(ckpt), "api")
    train(orch, clock, "train", NODES, 1, 10, skip=frozenset({15}))
    clock.advance(1000)
    assert orch.tick() == []


def test_elastic_shrinks_down_to_min_replicas_then_fails(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt, strategy="elastic", spares=0, min_replicas=14,
                          max_failures=10), "api")
    _with_checkpoints(ckpt, clock)
    nodes = list(NODES)
    for lost in (3, 4):
        train(orch, clock, "train", nodes, 1, 10)
        [status] = orch.on_node_fault(node(lost), "lost", None, alive=False)
        nodes.remove(node(lost))
        restore = submit.of("restore")[-1]
        assert restore.params["nodes"] == nodes
        assert status.replacement_nodes == ()
        clock.advance(5)
        orch.progress("train", 0, nodes[0], len(nodes), [(200, clock.time())])
        assert orch.recovery(status.id).state == "done"
    [status] = orch.on_node_fault(node(5), "lost", None, alive=False)
    assert status.state == "failed"
    assert "minReplicas" in status.error
    assert orch.job("train").state == "failed"
    [alert] = submit.of("alert")
    assert (alert.severity, alert.rule, alert.node) == ("critical", "job-failed", None)
    assert alert.params["job"] == "train"
    assert len(submit.of("restore")) == 2


def test_restart_without_spares_falls_back_to_elastic(orch, clock, ckpt, submit):
    orch.add_job(make_job(ckpt, spares=0, min_replicas=15), "api")
    _with_checkpoints(ckpt, clock)
    [status] = orch.on_node_fault(node(7), "lost", None, alive=False)
    assert status.state == "restoring"
    assert submit.of("restore")[0].params["nodes"] == [n for n in NODES if n != node(7)]
    assert any("continuing elastic" in h["message"] for h in status.history)


def test_restart_without_spares_below_min_replicas_fails(orch, clock, ckpt, submit):
    orch.add_job(make_job(ckpt, spares=0, min_replicas=16), "api")
    [status] = orch.on_node_fault(node(7), "lost", None, alive=False)
    assert status.state == "failed"
    assert submit.of("restore") == []
    assert submit.of("alert")[0].rule == "job-failed"


def test_manual_waits_for_approval(orch, clock, ckpt, submit):
    orch.add_job(make_job(ckpt, strategy="manual"), "api")
    _with_checkpoints(ckpt, clock)
    [status] = orch.on_node_fault(node(1), "fatal", None, alive=False)
    assert status.state == "awaiting_approval"
    assert len(submit.of("evict")) == 1  # the bad node is taken out regardless
    assert submit.of("restore") == []
    assert orch.job("train").state == "awaiting_approval"
    clock.advance(3600)
    orch.tick()
    assert submit.of("restore") == []
    assert orch.progress("train", 0, node(0), 16, []).restore is None
    approved = orch.approve_recovery(status.id, "alice")
    assert approved.state == "restoring"
    [restore] = submit.of("restore")
    assert restore.params["nodes"][1] == node(16)
    assert any(h["message"] == "approved by alice" for h in approved.history)
    with pytest.raises(JobError, match="not awaiting approval"):
        orch.approve_recovery(status.id, "bob")
    with pytest.raises(UnknownRecovery):
        orch.approve_recovery("nope", "bob")


def test_more_than_max_failures_fails_the_job(orch, clock, ckpt, submit):
    orch.add_job(make_job(ckpt, max_failures=1), "api")
    _with_checkpoints(ckpt, clock)
    [first] = orch.on_node_fault(node(1), "fatal", None, alive=False)
    clock.advance(10)
    orch.progress("train", 1, node(16), 16, [(200, clock.time())])
    assert orch.recovery(first.id).state == "done"
    [second] = orch.on_node_fault(node(2), "fatal", None, alive=False)
    assert second.state == "failed"
    assert "maxFailures" in second.error
    job = orch.job("train")
    assert (job.state, job.failures) == ("failed", 2)
    assert len(submit.of("restore")) == 1
    assert submit.keys("evict")[-1] == f"recovery:{second.id}:evict:{node(2)}"
    [alert] = submit.of("alert")
    assert (alert.severity, alert.rule) == ("critical", "job-failed")
    # no automatic recovery any more; the node is still taken out
    assert orch.on_node_fault(node(3), "fatal", 77, alive=False) == []
    assert submit.keys("evict")[-1] == f"job:train:evict:{node(3)}:77"
    clock.advance(10_000)
    assert orch.tick() == []
    assert submit.of("checkpoint") == []


def test_two_faults_join_one_recovery(orch, clock, ckpt, submit):
    submit.states["evict"] = "pending"
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    [a] = orch.on_node_fault(node(5), "fatal", None, alive=False)
    [b] = orch.on_node_fault(node(6), "lost", None, alive=False)
    assert a.id == b.id
    assert b.failed_nodes == (node(5), node(6))
    assert orch.job("train").failures == 1
    for key in submit.keys("evict"):
        submit.finish(key)
    orch.tick()
    [restore] = submit.of("restore")
    assert restore.params["nodes"] == [*NODES[:5], node(16), node(17), *NODES[7:]]
    assert orch.job("train").spares == ()


def test_a_spare_failing_before_resume_is_replaced(orch, clock, ckpt, submit):
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    [status] = orch.on_node_fault(node(5), "fatal", None, alive=False)
    assert submit.of("restore")[0].params["nodes"][5] == node(16)
    [again] = orch.on_node_fault(node(16), "lost", None, alive=False)
    assert again.id == status.id
    second = submit.of("restore")[1]
    assert second.key == f"recovery:{status.id}:restore:2"
    assert second.params["nodes"][5] == node(17)
    assert second.params["generation"] == 2
    assert orch.progress("train", 0, node(0), 16, []).restore.generation == 2


def test_a_failing_restore_is_retried_then_the_job_fails(store, clock, submit, ckpt):
    orch = orchestrator(store, clock, submit, settings=JobSettings(step_retries=2))
    submit.states["restore"] = "failed"
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    [status] = orch.on_node_fault(node(5), "fatal", None, alive=False)
    assert submit.keys("restore") == [f"recovery:{status.id}:restore",
                                      f"recovery:{status.id}:restore:2",
                                      f"recovery:{status.id}:restore:3"]
    assert status.state == "failed"
    assert orch.job("train").state == "failed"
    assert submit.of("alert")[0].key == f"recovery:{status.id}:alert"


def test_no_progress_after_the_restore_retries_it(store, clock, submit, ckpt):
    orch = orchestrator(store, clock, submit, settings=JobSettings(restore_timeout=300))
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    [status] = orch.on_node_fault(node(5), "fatal", None, alive=False)
    clock.advance(299)
    orch.tick()
    assert len(submit.of("restore")) == 1
    clock.advance(1)
    orch.tick()
    retry = submit.of("restore")[1]
    assert retry.params["generation"] == 2
    clock.advance(3)
    orch.progress("train", 0, node(0), 16, [(200, clock.time())])
    assert orch.recovery(status.id).state == "done"
    assert orch.job("train").generation == 2


def test_a_refused_eviction_fails_the_recovery_and_is_never_asked_again(store, clock, submit,
                                                                         ckpt):
    orch = orchestrator(store, clock, submit, settings=JobSettings(step_retries=1))
    submit.states["evict"] = "refused"
    orch.add_job(make_job(ckpt), "api")
    [status] = orch.on_node_fault(node(5), "fatal", None, alive=False)
    assert submit.keys("evict") == [f"recovery:{status.id}:evict:{node(5)}"]
    assert status.state == "failed"
    assert "evicting node-05: refused" in status.error
    orch.tick()
    assert len(submit.keys("evict")) == 1


def test_a_failed_eviction_can_be_tolerated(store, clock, submit, ckpt):
    settings = JobSettings(step_retries=0, require_eviction=False)
    orch = orchestrator(store, clock, submit, settings=settings)
    submit.states["evict"] = "failed"
    orch.add_job(make_job(ckpt), "api")
    [status] = orch.on_node_fault(node(5), "lost", None, alive=False)
    assert status.state == "restoring"


def test_return_to_pool(orch, clock, ckpt):
    orch.add_job(make_job(ckpt, spares=0, min_replicas=1), "api")
    orch.on_node_fault(node(5), "lost", None, alive=False)
    job = orch.job("train")
    assert node(5) in job.failed_nodes
    assert node(5) not in job.spares
    orch.progress("train", 0, node(0), 15, [(1, clock.time() + 1)])
    job = orch.return_to_pool("train", node(5))
    assert job.spares == (node(5),)
    assert node(5) not in job.failed_nodes
    assert orch.jobs_of_node(node(5)) == []
    with pytest.raises(JobError):
        orch.return_to_pool("train", node(0))


def test_a_failing_spare_leaves_the_pool(orch, ckpt):
    orch.add_job(make_job(ckpt), "api")
    assert orch.on_node_fault(node(16), "lost", None, alive=False) == []
    job = orch.job("train")
    assert job.spares == (node(17),)
    assert job.failures == 0


def test_a_dry_run_restore_is_not_shown_to_the_ranks(orch, clock, ckpt, submit):
    submit.states["restore"] = "dry_run"
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    [status] = orch.on_node_fault(node(5), "fatal", None, alive=False)
    assert status.state == "cancelled"
    assert "dry run" in status.error
    assert orch.progress("train", 0, node(0), 16, []).restore is None
    assert orch.job("train").state == "pending"  # no rank has reported a step yet
    assert orch.metrics().recoveries == ()


def test_an_open_breaker_holds_the_eviction_in_one_record_then_it_goes_on(
        orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt, nodes=16, spares=2), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 310)
    submit.breaker_open = True
    [status] = orch.on_node_fault(node(5), "fatal", _incident(store, clock, node(5)),
                                  alive=False)
    key = f"recovery:{status.id}:evict:{node(5)}"
    assert store.get_action_by_key(key).state == "held"
    for _ in range(10):  # far more ticks than step_retries, and no timeout: still held
        clock.advance(60)
        orch.tick()
    assert submit.created.count(key) == 1
    assert len(store.list_actions(action="evict")) == 1
    assert orch.job("train").state == "recovering"
    assert orch.jobs_of_node(node(5)) == ["train"]  # not evicted yet: still in the job
    assert submit.of("restore") == []
    submit.breaker_open = False  # the breaker closed
    clock.advance(1)
    orch.tick()
    assert store.get_action_by_key(key).state == "succeeded"
    assert orch.jobs_of_node(node(5)) == []
    [restore] = submit.of("restore")
    assert restore.params["failed_nodes"] == [node(5)]
    # the pool left after the spare was taken, for the launcher to pre-warm
    left = list(orch.job("train").spares)
    assert len(left) == 1
    assert left[0] not in restore.params["nodes"]
    assert restore.params["spares"] == left


def _lost(store, clock, name):
    return _incident(store, clock, name, rule="node-lost", seen_ago=10.0)


def test_a_partition_that_heals_cancels_the_held_recovery(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt, nodes=16, spares=2), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 300)
    submit.breaker_open = True
    lost = [node(i) for i in range(6)]
    incidents = {n: _lost(store, clock, n) for n in lost}
    statuses = [s for n in lost for s in orch.on_node_fault(n, "lost", incidents[n], False)]
    assert len({s.id for s in statuses}) == 1  # every fault joined the one recovery
    rid = statuses[0].id
    assert [store.get_action_by_key(f"recovery:{rid}:evict:{n}").state for n in lost] == \
        ["held"] * 6
    train(orch, clock, "train", NODES, 301, 320)  # the ranks train on meanwhile
    for n in lost:  # every node is back: its node-lost incident closes
        store.close_incident("node-lost", n, "", clock.time())
        submit.healthy.add(n)
    orch.tick()
    done = orch.recovery(rid)
    assert done.state == "cancelled"
    assert set(done.evictions.values()) == {"healed"}
    assert all(store.get_action_by_key(f"recovery:{rid}:evict:{n}").state == "cancelled"
               for n in lost)
    job = orch.job("train")
    assert (job.state, job.nodes, job.failed_nodes) == ("running", tuple(NODES), ())
    assert job.spares == (node(16), node(17))
    assert job.failures == 0
    assert submit.of("restore") == []


def test_a_node_back_while_others_stay_lost_leaves_the_others_to_the_recovery(
        orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt, nodes=16, spares=2), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 300)
    submit.breaker_open = True
    a, b = _lost(store, clock, node(2)), _lost(store, clock, node(3))
    [status] = orch.on_node_fault(node(2), "lost", a, False)
    orch.on_node_fault(node(3), "lost", b, False)
    store.close_incident("node-lost", node(2), "", clock.time())
    submit.healthy.add(node(2))
    orch.tick()
    assert orch.recovery(status.id).evictions == {node(2): "healed", node(3): "pending"}
    submit.breaker_open = False
    orch.tick()
    done = orch.recovery(status.id)
    assert done.state == "restoring"
    [restore] = submit.of("restore")
    assert restore.params["failed_nodes"] == [node(3)]
    assert restore.params["nodes"][2] == node(2)  # it stayed
    assert restore.params["nodes"][3] == node(16)


def test_healed_nodes_whose_ranks_died_restart_in_place(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt, nodes=16, spares=2), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 300)
    submit.breaker_open = True
    incident = _lost(store, clock, node(4))
    [status] = orch.on_node_fault(node(4), "lost", incident, False)
    clock.advance(60)  # no progress since the fault: the ranks died with it
    store.close_incident("node-lost", node(4), "", clock.time())
    submit.healthy.add(node(4))
    submit.breaker_open = False
    orch.tick()
    rec = orch.recovery(status.id)
    assert rec.state == "restoring"
    [restore] = submit.of("restore")
    assert restore.params["nodes"] == NODES  # the same nodes
    assert orch.job("train").spares == (node(16), node(17))


def test_every_fault_of_one_node_is_one_recovery_and_one_eviction(orch, clock, ckpt, submit,
                                                                  store):
    submit.states["evict"] = "pending"
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    train(orch, clock, "train", NODES, 1, 300)
    faults = [_incident(store, clock, node(7), rule) for rule in
              ("ecc-uncorrectable", "row-remap-failed", "fatal-xid")]
    ids = {s.id for f in faults for s in orch.on_node_fault(node(7), "fatal", f, False)}
    assert len(ids) == 1
    assert len(store.list_actions(action="evict")) == 1
    (rid,) = ids
    assert orch.recovery(rid).incident_ids == tuple(faults)
    submit.finish(f"recovery:{rid}:evict:{node(7)}")
    orch.tick()
    [restore] = submit.of("restore")
    assert restore.params["nodes"][7] == node(16)


def test_an_eviction_that_already_ran_counts_as_done(orch, clock, ckpt, submit, store):
    orch.add_job(make_job(ckpt), "api")
    _with_checkpoints(ckpt, clock)
    submit.evicted.add(node(9))
    [status] = orch.on_node_fault(node(9), "fatal", _incident(store, clock, node(9)), False)
    assert submit.of("evict") == []
    assert status.evictions == {node(9): "done"}
    assert status.state == "restoring"
    assert orch.jobs_of_node(node(9)) == []
