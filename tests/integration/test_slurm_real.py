"""The Slurm drivers against a real slurmctld (tests/slurm.py: munged, slurmctld and three
slurmds on loopback).

The drivers are built as the controller builds them: the node driver from the
``drivers: {slurm: ...}`` settings (``build_drivers``), the job control from a job's
``spec.control.slurm`` (``job_control_driver``). They find the cluster as a deployment
does, through ``SLURM_CONF``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sn_monitor.clock import SystemClock
from sn_monitor.config import bind, parse_yaml
from sn_monitor.controller.actions.base import Driver, PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.job_control import JobControl
from sn_monitor.controller.actions.drivers.slurm import SlurmDriver, parse_show_node
from sn_monitor.controller.actions.routing import (
    DriverSettings,
    build_drivers,
    job_control_driver,
)
from sn_monitor.controller.audit import ActionRequest
from tests.slurm import SlurmCluster

pytestmark = pytest.mark.integration

REASON = 'GPU 3 XID 79; "quoted" $(rm -rf /)'
#: exec: no child for proctrack/linuxproc to miss when it kills the job at a requeue.
SLEEP_JOB = ("#!/bin/bash\necho start $SLURM_JOB_ID restarts=${SLURM_RESTART_COUNT:-0}\n"
             "exec sleep 120\n")


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The session's cluster, found through ``SLURM_CONF``; reset after the test."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    try:
        yield slurm_cluster
    finally:
        if not slurm_cluster.controller_running():
            slurm_cluster.start_controller()
        slurm_cluster.reset()


def node_driver(timeout: str = "10s") -> SlurmDriver:
    settings = bind(DriverSettings, parse_yaml(f"slurm: {{timeout: {timeout}}}\n", "drivers"))
    drivers = build_drivers(settings, {}, SystemClock())
    driver = drivers.by_action["cordon"]
    assert isinstance(driver, SlurmDriver)
    assert drivers.by_action["uncordon"] is driver
    return driver


def job_control(control: str) -> Driver:
    return job_control_driver(bind(JobControl, parse_yaml(control, "control")), SystemClock())


def act(action: str, node: str | None = "n1", reason: str = REASON) -> ActionRequest:
    return ActionRequest(id="a", key=f"k-{action}", action=action,  # type: ignore[arg-type]
                         node=node, reason=reason)


def reason_of(text: str) -> str:
    reason = parse_show_node(text).reason
    assert reason is not None
    return reason


# ---- the node driver: drain, resume -------------------------------------------------------


def test_cordon_drains_with_our_reason_and_uncordon_resumes(slurm: SlurmCluster) -> None:
    driver = node_driver()
    outcome = driver.run(act("cordon"))
    shown = slurm.show_node("n1")
    assert slurm.node_state("n1") == "IDLE+DRAIN"
    # Slurm keeps the text as given (quotes, $(...): no shell ran) and appends [user@time]
    assert f"Reason=sn-monitor: {REASON} [root@" in shown
    assert reason_of(shown) == outcome.details["reason"] == f"sn-monitor: {REASON}"
    assert driver.reconcile(act("cordon")) is True
    assert driver.reconcile(act("uncordon")) is False

    # draining again is the same drain
    driver.run(act("evict"))
    assert slurm.node_state("n1") == "IDLE+DRAIN"

    outcome = driver.run(act("uncordon"))
    assert outcome.details["changed"] is True
    # RESUME: IDLE, marked NOT_RESPONDING until slurmctld's next ping of the slurmd
    assert slurm.node_state("n1") in ("IDLE", "IDLE+NOT_RESPONDING")
    assert "Reason=" not in slurm.show_node("n1")
    assert driver.reconcile(act("uncordon")) is True
    assert driver.run(act("uncordon")).details["changed"] is False


def test_uncordon_leaves_someone_elses_drain(slurm: SlurmCluster) -> None:
    slurm.run("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=bad DIMM, ticket 4711")
    driver = node_driver()
    with pytest.raises(PermanentError, match=r"drained by someone else.*bad DIMM, ticket 4711"):
        driver.run(act("uncordon", "n2"))
    assert slurm.node_state("n2") == "IDLE+DRAIN"
    assert reason_of(slurm.show_node("n2")) == "bad DIMM, ticket 4711"
    # our cordon of that node is not "done" until the reason is ours
    assert driver.reconcile(act("cordon", "n2")) is False


def test_drain_of_a_busy_node_lets_its_job_run(slurm: SlurmCluster) -> None:
    job = slurm.sbatch(SLEEP_JOB, "--nodelist=n3")
    slurm.wait_job(job, "RUNNING")
    driver = node_driver()
    driver.run(act("cordon", "n3"))
    state = slurm.node_state("n3")
    assert state in ("ALLOCATED+DRAIN", "MIXED+DRAIN"), state
    shown = driver.show("n3")
    assert shown.drained
    assert shown.ours
    assert slurm.job(job)["JobState"] == "RUNNING"
    driver.run(act("uncordon", "n3"))
    assert slurm.node_state("n3").split("+")[0] in ("ALLOCATED", "MIXED")
    assert "DRAIN" not in slurm.node_state("n3")


def test_unknown_node_is_a_permanent_error(slurm: SlurmCluster) -> None:
    driver = node_driver()
    # update: "slurm_update error: Invalid node name specified" on stderr, exit 1
    with pytest.raises(PermanentError, match="Invalid node name"):
        driver.run(act("cordon", "n9"))
    # show node: "Node n9 not found" on stdout, exit 1
    with pytest.raises(PermanentError, match="Node n9 not found"):
        driver.run(act("uncordon", "n9"))


def test_a_down_controller_is_a_temporary_error(slurm: SlurmCluster) -> None:
    slurm.stop_controller()
    driver = node_driver()
    with pytest.raises(TemporaryError, match="Unable to contact slurm controller"):
        driver.run(act("cordon"))
    assert driver.reconcile(act("cordon")) is None  # scontrol show node: the same error
    # scontrol requeue says something else, still temporary
    with pytest.raises(TemporaryError, match="Unexpected message received"):
        job_control("slurm: {jobId: '1'}\n").run(act("restore", None))
    slurm.start_controller()
    driver.run(act("cordon"))
    shown = driver.show("n1")
    assert shown.drained
    assert shown.ours


# ---- the job control: requeue ---------------------------------------------------------------


def test_requeue_of_a_batch_job_runs_it_again(slurm: SlurmCluster) -> None:
    job = slurm.sbatch(SLEEP_JOB, "--nodes=1")
    slurm.wait_job(job, "RUNNING")
    control = job_control(f"slurm: {{jobId: '{job}'}}\n")
    outcome = control.run(act("restore", None))
    assert outcome.details["requeued"] == [job]
    # Slurm kills the job (COMPLETING) and puts it back in the queue; a second requeue
    # meanwhile, or later, answers "Job is pending execution": nothing to do
    again = control.run(act("failover", None))
    fields = slurm.wait_job(job, "PENDING")
    assert fields["Restarts"] == "1"
    assert control.reconcile(act("restore", None)) is True
    assert again.details == {"requeued": [], "pending": [job], "changed": False, "via": "slurm"}
    # Slurm holds a requeued job back (BeginTime) for cred_expire (tests/slurm.py: 5 s, by
    # default 120): slurmd refuses the job's revoked credential until then
    fields = slurm.wait_job(job, "RUNNING")
    assert fields["Restarts"] == "1"
    deadline = time.monotonic() + 10  # RUNNING comes before the script's first line
    while f"start {job} restarts=1" not in slurm.job_output(job):
        assert time.monotonic() < deadline, slurm.job_output(job)
        time.sleep(0.1)
    assert f"start {job} restarts=0" in slurm.job_output(job)


def test_requeue_of_a_multi_node_job_by_name(slurm: SlurmCluster) -> None:
    job = slurm.sbatch(SLEEP_JOB, "--nodes=2", "--job-name=trillion")
    first = slurm.wait_job(job, "RUNNING")
    assert first["NumNodes"] == "2"
    # the failed node is drained first (the orchestrator's evict), then the job requeued
    failed = sorted(expand(first["NodeList"]))[0]
    node_driver().run(act("evict", failed))
    control = job_control("slurm: {jobName: trillion, user: root}\n")
    outcome = control.run(act("failover", None))
    assert outcome.details["requeued"] == [job]
    slurm.wait_job(job, "PENDING")
    assert control.reconcile(act("failover", None)) is True
    again = slurm.wait_job(job, "RUNNING")
    assert again["Restarts"] == "1"
    assert again["NumNodes"] == "2"
    assert failed not in expand(again["NodeList"])


def test_requeue_errors(slurm: SlurmCluster) -> None:
    with pytest.raises(PermanentError, match="Invalid job id"):
        job_control("slurm: {jobId: '999999'}\n").run(act("restore", None))
    with pytest.raises(PermanentError, match="no Slurm job named 'nothing'"):
        job_control("slurm: {jobName: nothing}\n").run(act("restore", None))
    pinned = slurm.sbatch(SLEEP_JOB, "--no-requeue")
    slurm.wait_job(pinned, "RUNNING")
    with pytest.raises(PermanentError, match="presently disabled"):
        job_control(f"slurm: {{jobId: '{pinned}'}}\n").run(act("restore", None))
    # a finished job that slurmctld still remembers (MinJobAge) is requeued: it runs again
    failed = slurm.sbatch("#!/bin/bash\nexit 3\n")
    slurm.wait_job(failed, "FAILED")
    job_control(f"slurm: {{jobId: '{failed}'}}\n").run(act("restore", None))
    assert slurm.job(failed)["JobState"] == "PENDING"


def expand(nodelist: str) -> set[str]:
    """``n[1-2]`` / ``n1,n3`` -> node names (our clusters name nodes n1..n9)."""
    names: set[str] = set()
    if "[" not in nodelist:
        return set(nodelist.split(","))
    prefix, _, rest = nodelist.partition("[")
    for part in rest.rstrip("]").split(","):
        low, _, high = part.partition("-")
        for i in range(int(low), int(high or low) + 1):
            names.add(f"{prefix}{i}")
    return names
