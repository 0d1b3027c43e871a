"""Slurm attribution against a real Slurm: one node ``g1`` with two GPUs (tests/slurm.py
with ``gpus=2``: ``GresTypes=gpu``, gres.conf ``AutoDetect=off`` over two character
devices the cluster makes, minors 0 and 1).

This slurmd tracks processes without cgroups (``proctrack/linuxproc``, ``task/none``):
the processes are attributed through their environment (``/proc/<pid>/environ``), the
fallback; the cgroup paths are covered on fixture text in
tests/unit/test_slurm_attribution.py. A job id alone (what a cgroup gives) is completed
through the real ``squeue``, and the allocations, busy and idle, come from the real
``squeue`` and ``scontrol show job -d -o``. Every wait is bounded.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.agent.registry import COLLECTORS
from sn_monitor.agent.settings import (
    AgentSettings,
    AttributionSettings,
    PathSettings,
    SlurmAttributionSettings,
)
from sn_monitor.agent.snapshot import GpuWorkload
from sn_monitor.agent.workloads.model import DeviceAllocation, SourceUnavailable, Workload
from sn_monitor.agent.workloads.slurm.allocations import SlurmAllocations
from sn_monitor.agent.workloads.slurm.commands import SlurmCommands
from sn_monitor.agent.workloads.slurm.directory import JobDirectory
from sn_monitor.agent.workloads.slurm.processes import (
    ProcessJob,
    job_of_process,
    parse_cgroup_job,
)
from sn_monitor.clock import SystemClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import make_gpus
from tests.conftest import start_slurm
from tests.drivers.servers import wait_until
from tests.slurm import SlurmCluster

pytestmark = pytest.mark.integration

PROC = Path("/proc")
NODE = "g1"
NOBODY = 65534
#: exec: the pid written is the process that runs for the job's life.
TASK = "echo $$ > {pidfile}; exec sleep 120"


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[SlurmCluster]:
    cluster = start_slurm(nodes=(NODE,), gpus=2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(gpu_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The module's cluster, found by ``scontrol`` through ``SLURM_CONF``; reset after."""
    monkeypatch.setenv("SLURM_CONF", str(gpu_cluster.conf))
    try:
        yield gpu_cluster
    finally:
        if not gpu_cluster.controller_running():
            gpu_cluster.start_controller()
        gpu_cluster.reset()


def pid_in(pidfile: Path) -> int:
    assert wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30), \
        f"no pid in {pidfile}"
    return int(pidfile.read_text())


def source() -> SlurmAllocations:
    return SlurmAllocations(SlurmCommands(), node=NODE)


def test_a_batch_job_and_an_srun_step_are_attributed_by_pid(slurm: SlurmCluster,
                                                              tmp_path: Path) -> None:
    batch_pidfile = tmp_path / "batch.pid"
    batch = slurm.sbatch(f"#!/bin/bash\n{TASK.format(pidfile=batch_pidfile)}\n",
                         "--gres=gpu:1", "--job-name=train batch")
    slurm.wait_job(batch, "RUNNING")
    batch_pid = pid_in(batch_pidfile)

    step_pidfile = tmp_path / "step.pid"
    srun = subprocess.Popen(
        [slurm.programs.srun, "--gres=gpu:1", "--job-name=interactive",
         "bash", "-c", TASK.format(pidfile=step_pidfile)],
        env=slurm.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        step_pid = pid_in(step_pidfile)
        step = slurm.run("squeue", "--noheader", "--name=interactive", "--format=%i").stdout
        step_job = step.strip()

        # no Slurm cgroup here (proctrack/linuxproc): the environment names the job
        assert parse_cgroup_job((PROC / str(batch_pid) / "cgroup").read_text()) is None
        assert job_of_process(PROC, batch_pid) == ProcessJob(
            job_id=batch, found_in="environ", uid=0, user="root", partition="test",
            name="train batch", gres_gpus=(0,))
        assert job_of_process(PROC, step_pid) == ProcessJob(
            job_id=step_job, found_in="environ", uid=0, step="0", user="root", partition="test",
            name="interactive", gres_gpus=(1,))

        # each process's GPU is the one Slurm allocated to its job
        assert source().allocations() == (allocation(0, batch, "train batch"),
                                          allocation(1, step_job, "interactive"))
    finally:
        srun.terminate()
        srun.wait(30)


def test_a_job_id_alone_is_completed_through_squeue(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("#!/bin/bash\nexec sleep 120\n", "--job-name=from cgroup")
    slurm.wait_job(job, "RUNNING")
    directory = JobDirectory(SlurmCommands(), SystemClock())
    assert directory.complete(ProcessJob(job_id=job, found_in="cgroup", step="0")) == \
        ProcessJob(job_id=job, found_in="cgroup", step="0", user="root", partition="test",
                   name="from cgroup")
    assert directory.lookup("999999") is None  # a job Slurm does not know: no error


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user (needs root)")
def test_another_users_process_claiming_a_job_by_its_environment_is_not_its(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.sbatch("#!/bin/bash\nexec sleep 120\n", "--job-name=roots")
    slurm.wait_job(job, "RUNNING")
    forged = subprocess.Popen(["sleep", "120"], user=NOBODY, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job,
                                   "SLURM_JOB_USER": "root"})
    try:
        comm = PROC / str(forged.pid) / "comm"
        assert wait_until(lambda: comm.read_text().strip() == "sleep", timeout=30)  # exec'd
        claim = job_of_process(PROC, forged.pid)
        assert claim == ProcessJob(job_id=job, found_in="environ", uid=NOBODY, user="root")
        assert JobDirectory(SlurmCommands(), SystemClock()).complete(claim) is None
    finally:
        forged.kill()
        forged.wait(30)


def test_allocated_gpus_without_a_process_show_as_the_jobs(slurm: SlurmCluster) -> None:
    assert source().allocations() == ()
    idle = slurm.sbatch("#!/bin/bash\nexec sleep 120\n", "--gres=gpu:2", "--job-name=idle")
    slurm.wait_job(idle, "RUNNING")
    assert source().allocations() == (allocation(0, idle, "idle"), allocation(1, idle, "idle"))


def test_a_job_name_that_mimics_slurms_fields_is_only_a_name(slurm: SlurmCluster) -> None:
    name = "x UserId=evil(7) Nodes=g1 CPU_IDs=0 Mem=0 GRES=gpu:9(IDX:0-1) | z"
    job = slurm.sbatch("#!/bin/bash\nexec sleep 120\n", "--gres=gpu:1", f"--job-name={name}")
    slurm.wait_job(job, "RUNNING")
    assert source().allocations() == (allocation(0, job, name),)


def test_a_stopped_slurmctld_makes_the_source_unavailable(slurm: SlurmCluster) -> None:
    slurm.stop_controller()
    with pytest.raises(SourceUnavailable, match="Unable to contact slurm controller"):
        SlurmAllocations(SlurmCommands(timeout=30), node=NODE).allocations()
    job = ProcessJob(job_id="1", found_in="cgroup")
    assert JobDirectory(SlurmCommands(timeout=30), SystemClock()).complete(job) == job


def allocation(minor: int, job: str, name: str) -> DeviceAllocation:
    return DeviceAllocation(device=f"minor:{minor}", resource="gres/gpu", source="slurm",
                            workload=Workload(slurm_job=job, user="root", partition="test",
                                              job=name))


def test_the_gpu_collector_shows_each_gpu_s_slurm_job_busy_or_idle(slurm: SlurmCluster,
                                                                    tmp_path: Path) -> None:
    """The agent's path: three fake-NVML GPUs (minors 0-2); GPU 0 held by the batch job's
    process, GPU 1 by nothing but allocated to an idle job; GPU 2 neither. The process's
    job comes through SlurmProcessJobs (environ, then squeue), the idle GPU's through the
    slurm allocation source (asked on its own thread), wired as the agent's registry does."""
    pidfile = tmp_path / "batch.pid"
    batch = slurm.sbatch(f"#!/bin/bash\n{TASK.format(pidfile=pidfile)}\n",
                         "--gres=gpu:1", "--job-name=busy")
    slurm.wait_job(batch, "RUNNING")
    pid = pid_in(pidfile)
    idle = slurm.sbatch("#!/bin/bash\nexec sleep 120\n", "--gres=gpu:1", "--job-name=idle")
    slurm.wait_job(idle, "RUNNING")
    gpus = make_gpus(3)
    gpus[0].set_processes([(pid, 2**30)])
    fake_nvml.configure(gpus)
    try:
        settings = AgentSettings(
            node=NODE, paths=PathSettings(procfs=str(PROC)),
            attribution=AttributionSettings(slurm=SlurmAttributionSettings(
                enabled=True, node=NODE)))
        collector = COLLECTORS["nvml"](settings, fake_nvml, SystemClock())
        try:
            busy, held, free = collector.collect().gpus
        finally:
            collector.close()
    finally:
        fake_nvml.reset()
    process = busy.processes[0] if busy.processes else None
    assert process is not None
    assert (process.pid, process.slurm_job, process.user, process.partition,
            process.workload_job) == (pid, batch, "root", "test", "busy")
    assert busy.workloads == (GpuWorkload(slurm_job=batch, user="root", partition="test",
                                          workload_job="busy"),)
    assert held.workloads == (GpuWorkload(slurm_job=idle, user="root", partition="test",
                                          workload_job="idle"),)
    assert held.processes == ()  # held, and idle: what the platform team looks for
    assert free.workloads == ()
