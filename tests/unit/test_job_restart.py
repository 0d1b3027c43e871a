"""A controller restart in the middle of a recovery: it carries on, no step runs twice."""

from __future__ import annotations

from collections import Counter

import pytest

from sn_monitor.clock import ManualClock
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


class Crash(Exception):
    """The controller dies right after an action was recorded."""


class CrashingSubmit(RecordingSubmit):
    def __init__(self, store, clock):
        super().__init__(store, clock)
        self.crash_on: str | None = None

    def submit(self, request):
        record = super().submit(request)
        if request.action == self.crash_on:
            self.crash_on = None
            raise Crash(request.key)
        return record


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def path(tmp_path):
    return tmp_path / "controller.db"


@pytest.fixture
def ckpt(tmp_path, clock):
    d = tmp_path / "ckpt"
    d.mkdir()
    checkpoint(d, 100, clock)
    checkpoint(d, 200, clock)
    checkpoint(d, 300, clock, complete=False)
    return d


def _no_key_twice(submit):
    calls = Counter(submit.keys())
    assert [k for k, n in calls.items() if n > 1] == []
    assert len(submit.created) == len(set(submit.created))


def test_restart_mid_eviction_and_mid_restore(path, clock, ckpt):
    store = Store(path)
    submit = RecordingSubmit(store, clock)
    submit.states["evict"] = "pending"
    orch = orchestrator(store, clock, submit)
    orch.add_job(make_job(ckpt), "api")
    train(orch, clock, "train", NODES, 1, 30)
    seen = clock.time()
    [status] = orch.on_node_fault(node(5), "fatal", None, alive=False)
    assert status.state == "evicting"
    store.close()

    # restart 1: still evicting; the eviction is not submitted again
    clock.advance(5)
    store = Store(path)
    submit.store = store
    orch = orchestrator(store, clock, submit)
    assert orch.job("train").state == "recovering"
    assert orch.job("train").recovery == status.id
    orch.tick()
    assert len(submit.of("evict")) == 1
    submit.finish(f"recovery:{status.id}:evict:{node(5)}")
    orch.tick()
    [restore] = submit.of("restore")
    assert restore.params["checkpoint"]["step"] == 200
    store.close()

    # restart 2: restore sent; the ranks still get it, it is not sent again
    clock.advance(5)
    store = Store(path)
    submit.store = store
    orch = orchestrator(store, clock, submit)
    orch.tick()
    orch.tick()
    assert len(submit.of("restore")) == 1
    job = orch.job("train")
    assert job.spares == (node(17),)
    assert job.generation == 1
    assert orch.jobs_of_node(node(16)) == ["train"]
    reply = orch.progress("train", 0, node(0), 16, [])
    assert reply.restore.step == 200
    assert reply.restore.generation == 1
    clock.advance(10)
    orch.progress("train", 5, node(16), 16, [(200, clock.time())])
    done = orch.recovery(status.id)
    assert done.state == "done"
    assert done.mttr_seconds == pytest.approx(clock.time() - seen)
    assert [r.id for r in orch.metrics().recoveries] == [status.id]
    _no_key_twice(submit)
    store.close()

    # restart 3: the finished recovery is history, counted once
    store = Store(path)
    orch = orchestrator(store, clock, RecordingSubmit(store, clock))
    assert [r.id for r in orch.metrics().recoveries] == [status.id]
    assert orch.job("train").state == "running"
    assert orch.job("train").failures == 1
    store.close()


@pytest.mark.parametrize("crash_on", ["evict", "restore"])
def test_a_crash_right_after_recording_an_action_does_not_repeat_it(path, clock, ckpt,
                                                                   crash_on):
    store = Store(path)
    submit = CrashingSubmit(store, clock)
    orch = orchestrator(store, clock, submit)
    orch.add_job(make_job(ckpt), "api")
    submit.crash_on = crash_on
    with pytest.raises(Crash):
        orch.on_node_fault(node(5), "fatal", None, alive=False)
    store.close()

    store = Store(path)
    submit.store = store
    orch = orchestrator(store, clock, submit)
    orch.tick()
    [restore] = [r for r in store.list_actions(action="restore")]
    assert restore.params["nodes"][5] == node(16)
    assert len(store.list_actions(action="evict")) == 1
    assert len(submit.created) == len(set(submit.created))
    [status] = orch.recoveries("train")
    assert status.state == "restoring"
    assert orch.job("train").spares == (node(17),)
    store.close()


def test_approval_after_a_restart(path, clock, ckpt):
    store = Store(path)
    submit = RecordingSubmit(store, clock)
    orch = orchestrator(store, clock, submit)
    orch.add_job(make_job(ckpt, strategy="manual"), "api")
    [status] = orch.on_node_fault(node(3), "lost", None, alive=False)
    assert status.state == "awaiting_approval"
    store.close()
    store = Store(path)
    submit.store = store
    orch = orchestrator(store, clock, submit)
    orch.tick()
    assert submit.of("restore") == []
    assert orch.approve_recovery(status.id, "alice").state == "restoring"
    assert len(submit.of("restore")) == 1
    _no_key_twice(submit)
    store.close()


def test_a_checkpoint_request_survives_a_restart(path, clock, ckpt):
    store = Store(path)
    submit = RecordingSubmit(store, clock)
    orch = orchestrator(store, clock, submit)
    orch.add_job(make_job(ckpt, interval=60), "api")
    train(orch, clock, "train", NODES, 1, 60)
    orch.tick()
    [request] = submit.of("checkpoint")
    store.close()
    store = Store(path)
    submit.store = store
    orch = orchestrator(store, clock, submit)
    orch.tick()
    reply = orch.progress("train", 0, node(0), 16, [(61, clock.time())])
    assert reply.checkpoint_id == request.params["checkpoint_id"]
    assert len(submit.of("checkpoint")) == 1
    store.close()
