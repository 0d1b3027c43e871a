"""Slurm as an attribution source: the job of a process (cgroup, environ), a job's fields
through scontrol (cached), and the GPUs Slurm allocated on this node.

Pure parsers on fixture text; the readers on a procfs tree under tmp_path; scontrol
replaced by a runner that answers from a table (no program runs). The real Slurm is in
tests/integration/test_slurm_attribution.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from sn_monitor.agent.workloads.model import DeviceAllocation, SourceUnavailable, Workload
from sn_monitor.agent.workloads.slurm.allocations import SlurmAllocations, allocations_on
from sn_monitor.agent.workloads.slurm.directory import JobDirectory
from sn_monitor.agent.workloads.slurm.processes import (
    ProcessJob,
    SlurmEnviron,
    SlurmStep,
    job_of_process,
    parse_cgroup_job,
    parse_environ,
)
from sn_monitor.agent.workloads.slurm.records import (
    expand_hostlist,
    gpu_indices,
    parse_fields,
    parse_indices,
    parse_jobs,
)
from sn_monitor.agent.workloads.slurm.scontrol import Scontrol
from sn_monitor.clock import ManualClock
from sn_monitor.program import Finished, ProgramTimeout
from tests.conftest import FIXTURES

SHOW_JOBS = (FIXTURES / "slurm" / "show_job_detail.txt").read_text()
V1_LINES = "\n".join(f"{n}:{c}:/slurm/uid_1000/job_4242/step_0/task_1"
                     for n, c in [(12, "devices"), (4, "memory"), (3, "cpuset")])


# ---- the job of a process: its cgroup ------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    # cgroup v1 (proctrack/cgroup, task/cgroup): every hierarchy names the job
    (V1_LINES, SlurmStep("4242", "0")),
    ("7:freezer:/slurm/uid_0/job_17/step_batch\n", SlurmStep("17", "batch")),
    ("7:freezer:/slurm/uid_0/job_17/step_extern/task_0\n", SlurmStep("17", "extern")),
    ("7:freezer:/slurm/uid_0/job_17\n", SlurmStep("17")),
    # a slurmd started with -N <node> (several slurmds on one host)
    ("5:devices:/slurm_gpu07/uid_1000/job_9/step_3/task_0\n", SlurmStep("9", "3")),
    # cgroup v2: the slurmstepd scope, and <node>_slurmstepd.scope with -N
    ("0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n", SlurmStep("123", "0")),
    ("0::/system.slice/gpu07_slurmstepd.scope/job_5/step_interactive/user/task_0\n",
     SlurmStep("5", "interactive")),
    ("0::/system.slice/slurmstepd.scope/job_8/step_batch/slurm\n", SlurmStep("8", "batch")),
    # v2 preferred to a leftover v1 line
    ("1:name=systemd:/slurm/uid_0/job_1/step_0\n0::/system.slice/slurmstepd.scope/job_2/"
     "step_0/user/task_0\n", SlurmStep("2", "0")),
    # not Slurm: the daemon itself, containers, a user session, nothing
    ("0::/system.slice/slurmd.service\n", None),
    ("0::/system.slice/slurmstepd.scope/system\n", None),
    ("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope\n", None),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("0::/myslurm/job_3/step_0\n", None),
    ("0::/\n", None),
    ("", None),
    ("garbage without colons\n", None),
])
def test_cgroup_names_the_job_and_step(text: str, expected: SlurmStep | None) -> None:
    assert parse_cgroup_job(text) == expected


# ---- the job of a process: its environment ------------------------------------------------


def environ(**variables: str) -> bytes:
    return b"\0".join(f"{k}={v}".encode() for k, v in variables.items()) + b"\0"


def test_environ_gives_job_user_partition_name_and_gpus() -> None:
    data = environ(HOME="/home/alice", SLURM_JOB_ID="77", SLURM_JOB_USER="alice",
                   SLURM_JOB_PARTITION="gpu", SLURM_JOB_NAME="my job", SLURM_STEP_ID="2",
                   SLURM_JOB_GPUS="0,1,2,3", SLURM_STEP_GPUS="2,3",
                   CUDA_VISIBLE_DEVICES="0,1")
    assert parse_environ(data) == SlurmEnviron(
        job_id="77", step="2", user="alice", partition="gpu", name="my job",
        gres_gpus=(2, 3), cuda_visible_devices=("0", "1"))


def test_environ_of_a_batch_step_has_the_jobs_gpus() -> None:
    data = environ(SLURM_JOBID="8", SLURM_JOB_GPUS="1", CUDA_VISIBLE_DEVICES="GPU-abc")
    assert parse_environ(data) == SlurmEnviron(job_id="8", gres_gpus=(1,),
                                               cuda_visible_devices=("GPU-abc",))


@pytest.mark.parametrize("data", [
    b"", b"\0", environ(HOME="/root", PATH="/bin"), environ(SLURM_JOB_ID=""),
    environ(SLURM_JOB_ID="12; rm -rf /"), b"SLURM_JOB_ID", b"\xff\xfe=\x00",
])
def test_environ_without_a_slurm_job_is_none(data: bytes) -> None:
    assert parse_environ(data) is None


def test_environ_gpus_that_are_not_indices_are_left_out() -> None:
    parsed = parse_environ(environ(SLURM_JOB_ID="8", SLURM_JOB_GPUS="N/A"))
    assert parsed is not None
    assert parsed.gres_gpus == ()


# ---- reading /proc/<pid> ------------------------------------------------------------------


def make_process(procfs: Path, pid: int, cgroup: str | None, env: bytes | None) -> Path:
    directory = procfs / str(pid)
    directory.mkdir(parents=True)
    if cgroup is not None:
        (directory / "cgroup").write_text(cgroup)
    if env is not None:
        (directory / "environ").write_bytes(env)
    return directory


def test_a_process_in_a_slurm_cgroup_takes_its_fields_from_its_environ(tmp_path: Path) -> None:
    make_process(tmp_path, 10, V1_LINES, environ(SLURM_JOB_ID="4242", SLURM_JOB_USER="alice",
                                                 SLURM_JOB_PARTITION="gpu",
                                                 SLURM_JOB_NAME="train", SLURM_STEP_GPUS="1"))
    job = job_of_process(tmp_path, 10)
    assert job == ProcessJob(job_id="4242", found_in="cgroup", step="0", user="alice",
                             partition="gpu", name="train", gres_gpus=(1,))
    assert job.workload() == Workload(slurm_job="4242", user="alice", partition="gpu",
                                      job="train")


def test_the_cgroup_wins_over_an_environ_inherited_from_another_job(tmp_path: Path) -> None:
    make_process(tmp_path, 10, V1_LINES, environ(SLURM_JOB_ID="1", SLURM_JOB_USER="mallory"))
    assert job_of_process(tmp_path, 10) == ProcessJob(job_id="4242", found_in="cgroup",
                                                      step="0")


def test_without_a_slurm_cgroup_the_environ_names_the_job(tmp_path: Path) -> None:
    make_process(tmp_path, 11, "0::/\n", environ(SLURM_JOB_ID="5", SLURM_JOB_USER="bob",
                                                 SLURM_JOB_PARTITION="debug"))
    assert job_of_process(tmp_path, 11) == ProcessJob(job_id="5", found_in="environ",
                                                      user="bob", partition="debug")


@pytest.mark.parametrize(("cgroup", "env"), [
    ("0::/user.slice\n", environ(HOME="/root")),  # not a Slurm process
    (None, None),  # both files gone
    ("0::/\n", None),
])
def test_a_process_outside_slurm_has_no_job(tmp_path: Path, cgroup: str | None,
                                            env: bytes | None) -> None:
    make_process(tmp_path, 12, cgroup, env)
    assert job_of_process(tmp_path, 12) is None


def test_a_vanished_pid_is_unknown(tmp_path: Path) -> None:
    assert job_of_process(tmp_path, 99) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_denied_environ_leaves_the_cgroups_job_without_its_fields(tmp_path: Path) -> None:
    directory = make_process(tmp_path, 13, V1_LINES, environ(SLURM_JOB_ID="4242"))
    (directory / "environ").chmod(0)
    assert job_of_process(tmp_path, 13) == ProcessJob(job_id="4242", found_in="cgroup",
                                                      step="0")


def test_a_denied_environ_is_unknown_not_an_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    make_process(tmp_path, 13, V1_LINES, environ(SLURM_JOB_ID="4242", SLURM_JOB_USER="x"))
    real = Path.read_bytes

    def denied(path: Path) -> bytes:
        if path.name == "environ":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert job_of_process(tmp_path, 13) == ProcessJob(job_id="4242", found_in="cgroup",
                                                      step="0")


# ---- scontrol -o records --------------------------------------------------------------------


def test_fields_keep_spaces_in_values_and_repeated_keys() -> None:
    fields = parse_fields("JobId=1 JobName=my job UserId=a(1) TRES=cpu=1,node=1 "
                          "Nodes=g1 GRES=gpu:1(IDX:0)   Nodes=g2 GRES=gpu:1(IDX:1) "
                          "AllocNode:Sid=h:1 Command=/x.sh --lr=0.1")
    assert fields == [("JobId", "1"), ("JobName", "my job"), ("UserId", "a(1)"),
                      ("TRES", "cpu=1,node=1"), ("Nodes", "g1"), ("GRES", "gpu:1(IDX:0)"),
                      ("Nodes", "g2"), ("GRES", "gpu:1(IDX:1)"), ("AllocNode:Sid", "h:1"),
                      ("Command", "/x.sh --lr=0.1")]


@pytest.mark.parametrize(("text", "expected"), [
    ("0", (0,)), ("0-3", (0, 1, 2, 3)), ("1,3", (1, 3)), ("0-1,5,7-8", (0, 1, 5, 7, 8)),
    ("", ()), ("N/A", ()), ("1,x", ()), ("3-", ()),
])
def test_index_lists(text: str, expected: tuple[int, ...]) -> None:
    assert parse_indices(text) == expected


@pytest.mark.parametrize(("gres", "expected"), [
    ("gpu:2(IDX:0-1)", (0, 1)),
    ("gpu:a100:2(IDX:1,3)", (1, 3)),
    ("gpu:a100:1(IDX:0),gpu:v100:1(IDX:4)", (0, 4)),
    ("nic:1(IDX:0),gpu:1(IDX:2)", (2,)),
    ("gpu:0(IDX:N/A)", ()),
    ("(null)", ()),
    ("", ()),
])
def test_gpu_indices_of_a_node_group(gres: str, expected: tuple[int, ...]) -> None:
    assert gpu_indices(gres) == expected


@pytest.mark.parametrize(("expression", "expected"), [
    ("g1", ["g1"]),
    ("g[1-3]", ["g1", "g2", "g3"]),
    ("n[08-10],x", ["n08", "n09", "n10", "x"]),
    ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
    ("a[1,x-y]", ["a[1,x-y]"]),
    ("", []),
])
def test_hostlists(expression: str, expected: list[str]) -> None:
    assert expand_hostlist(expression) == expected


def test_show_job_detail_records() -> None:
    records = {r.job_id: r for r in parse_jobs(SHOW_JOBS)}
    assert set(records) == {"1", "2", "3", "4"}
    assert (records["1"].user, records["1"].partition, records["1"].name,
            records["1"].state) == ("alice", "gpu", "my job", "RUNNING")
    assert records["1"].gpus == {"g1": (0,)}
    assert records["2"].gpus == {"g1": (1, 3), "g2": (1, 3), "g3": (7,)}
    assert records["4"].gpus == {}
    assert not records["4"].holds_devices
    assert not records["3"].holds_devices


# ---- the allocation source -----------------------------------------------------------------


def alloc(minor: int, job: str, user: str, partition: str, name: str) -> DeviceAllocation:
    return DeviceAllocation(device=f"minor:{minor}", resource="gres/gpu", source="slurm",
                            workload=Workload(slurm_job=job, user=user, partition=partition,
                                              job=name))


def test_allocations_on_a_node_are_its_gpus_held_by_running_jobs() -> None:
    records = parse_jobs(SHOW_JOBS)
    assert allocations_on(records, "g1") == (
        alloc(0, "1", "alice", "gpu", "my job"), alloc(1, "2", "bob", "debug", "bash"),
        alloc(3, "2", "bob", "debug", "bash"))
    assert allocations_on(records, "g3") == (alloc(7, "2", "bob", "debug", "bash"),)
    assert allocations_on(records, "g9") == ()


class ScriptedRunner:
    """Answers ``scontrol`` from a table; counts the calls; a missing answer is an error."""

    def __init__(self, answers: dict[str, Finished | Exception]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float) -> Finished:
        self.calls.append(list(argv))
        answer = self.answers[" ".join(argv[1:])]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(stdout: str) -> Finished:
    return Finished(0, stdout, "")


def test_the_source_serves_one_load_for_refresh_seconds() -> None:
    runner = ScriptedRunner({"show job -d -o": ok(SHOW_JOBS)})
    clock = ManualClock()
    source = SlurmAllocations(Scontrol(run=runner), clock, node="g3", refresh=30)
    assert source.name == "slurm"
    assert source.allocations() == (alloc(7, "2", "bob", "debug", "bash"),)
    clock.advance(29)
    source.allocations()
    assert len(runner.calls) == 1
    runner.answers["show job -d -o"] = ok("")
    clock.advance(1)
    assert source.allocations() == ()
    assert runner.calls == [["scontrol", "show", "job", "-d", "-o"]] * 2


@pytest.mark.parametrize(("answer", "why"), [
    (ProgramTimeout("slow"), "ran past 5s"),
    (FileNotFoundError(2, "No such file or directory"), "cannot run scontrol"),
    (Finished(1, "", "scontrol: error: Unable to contact slurm controller (connect failure)"),
     "exited 1: scontrol: error: Unable to contact slurm controller"),
])
def test_a_slurmctld_that_cannot_answer_is_source_unavailable_until_the_next_refresh(
        answer: Exception | Finished, why: str) -> None:
    runner = ScriptedRunner({"show job -d -o": answer})
    clock = ManualClock()
    source = SlurmAllocations(Scontrol(run=runner), clock, node="g1", refresh=30)
    with pytest.raises(SourceUnavailable, match=why) as raised:
        source.allocations()
    assert raised.value.source == "slurm"
    clock.advance(10)
    with pytest.raises(SourceUnavailable, match=why):
        source.allocations()
    assert len(runner.calls) == 1  # not asked again within refresh
    runner.answers["show job -d -o"] = ok(SHOW_JOBS)
    clock.advance(20)
    assert len(source.allocations()) == 3


def test_the_node_defaults_to_the_short_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "gpu07.cluster.example")
    source = SlurmAllocations(Scontrol(run=ScriptedRunner({})), ManualClock())
    assert source.node == "gpu07"


# ---- a job id to its fields ------------------------------------------------------------------


JOB_1 = SHOW_JOBS.splitlines()[0]


def test_a_job_is_looked_up_once_per_ttl() -> None:
    runner = ScriptedRunner({"show job -o 1": ok(JOB_1 + "\n")})
    clock = ManualClock()
    directory = JobDirectory(Scontrol(run=runner), clock, ttl=300)
    job = ProcessJob(job_id="1", found_in="cgroup", step="0")
    completed = directory.complete(job)
    assert completed == ProcessJob(job_id="1", found_in="cgroup", step="0", user="alice",
                                   partition="gpu", name="my job")
    clock.advance(299)
    assert directory.complete(job) == completed
    assert len(runner.calls) == 1
    clock.advance(1)
    directory.complete(job)
    assert len(runner.calls) == 2


def test_a_process_that_said_everything_costs_no_lookup() -> None:
    directory = JobDirectory(Scontrol(run=ScriptedRunner({})), ManualClock())
    job = ProcessJob(job_id="1", found_in="environ", user="a", partition="p", name="n")
    assert directory.complete(job) is job


def test_a_failing_lookup_keeps_the_job_id_and_is_retried_later() -> None:
    runner = ScriptedRunner({"show job -o 1": ProgramTimeout("slow")})
    clock = ManualClock()
    directory = JobDirectory(Scontrol(run=runner), clock, retry_after=30)
    job = ProcessJob(job_id="1", found_in="cgroup")
    assert directory.complete(job) == job
    clock.advance(29)
    assert directory.complete(job) == job
    assert len(runner.calls) == 1
    runner.answers["show job -o 1"] = ok(JOB_1)
    clock.advance(1)
    assert directory.complete(job).user == "alice"


def test_a_job_slurm_forgot_is_none_not_a_failure() -> None:
    runner = ScriptedRunner({"show job -o 9": Finished(
        1, "", "slurm_load_jobs error: Invalid job id specified")})
    directory = JobDirectory(Scontrol(run=runner), ManualClock())
    assert directory.lookup("9") is None
    assert directory.lookup("not-a-number") is None
    assert len(runner.calls) == 1
