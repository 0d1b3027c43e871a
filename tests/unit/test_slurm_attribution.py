"""Slurm as an attribution source: the job of a process (cgroup, environ), a job's fields
through squeue (cached), and the GPUs Slurm allocated on this node.

Pure parsers on fixture text; the readers on a procfs tree under tmp_path; squeue and
scontrol replaced by a runner that answers from a table (no program runs). The real Slurm is in
tests/integration/test_slurm_attribution.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pytest

from sn_monitor.agent.workloads.model import DeviceAllocation, SourceUnavailable, Workload
from sn_monitor.agent.workloads.refreshed import RefreshedSource
from sn_monitor.agent.workloads.slurm.allocations import SlurmAllocations
from sn_monitor.agent.workloads.slurm.commands import SlurmCommands
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
    JobRecord,
    expand_hostlist,
    gpu_indices,
    node_gpus,
    parse_indices,
    parse_queue,
)
from sn_monitor.clock import ManualClock
from sn_monitor.program import Finished, ProgramTimeout
from tests.conftest import FIXTURES

UID = os.getuid()  # the owner of the process directories the tests make
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
    assert job == ProcessJob(job_id="4242", found_in="cgroup", uid=UID, step="0", user="alice",
                             partition="gpu", name="train", gres_gpus=(1,))
    assert job.workload() == Workload(slurm_job="4242", user="alice", partition="gpu",
                                      job="train")


def test_the_cgroup_wins_over_an_environ_inherited_from_another_job(tmp_path: Path) -> None:
    make_process(tmp_path, 10, V1_LINES, environ(SLURM_JOB_ID="1", SLURM_JOB_USER="mallory"))
    assert job_of_process(tmp_path, 10) == ProcessJob(job_id="4242", found_in="cgroup",
                                                      uid=UID, step="0")


def test_without_a_slurm_cgroup_the_environ_names_the_job(tmp_path: Path) -> None:
    make_process(tmp_path, 11, "0::/\n", environ(SLURM_JOB_ID="5", SLURM_JOB_USER="bob",
                                                 SLURM_JOB_PARTITION="debug"))
    assert job_of_process(tmp_path, 11) == ProcessJob(job_id="5", found_in="environ",
                                                      uid=UID, user="bob", partition="debug")


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
                                                      uid=UID, step="0")


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
                                                      uid=UID, step="0")


# ---- squeue and scontrol -d records --------------------------------------------------------


QUEUE_G1 = "1|1000|alice|gpu|RUNNING|my job\n2|1001|bob|debug|RUNNING|bash\n"


def detail(job_id: str) -> str:
    """The fixture's ``scontrol show job -d -o <id>`` line of that job."""
    return next(line for line in SHOW_JOBS.splitlines() if line.startswith(f"JobId={job_id} "))


def test_queue_records_take_the_name_last_whatever_it_holds() -> None:
    assert parse_queue("7|1000|alice|gpu|RUNNING|a | b|c\n8|x|(null)||PENDING|\n") == [
        JobRecord("7", 1000, "alice", "gpu", "RUNNING", "a | b|c"),
        JobRecord("8", None, None, None, "PENDING", None)]


def test_queue_lines_that_are_no_record_or_a_repeated_id_are_left_out() -> None:
    # a job name with a line break whose second line looks like a record of job 7
    text = "7|1000|alice|gpu|RUNNING|first line\n7|0|root|prod|RUNNING|x\nnot|a record\n" \
           "9|1001|bob|gpu|RUNNING|ok\n"
    assert parse_queue(text) == [JobRecord("9", 1001, "bob", "gpu", "RUNNING", "ok")]


def test_a_jobs_gpus_on_a_node() -> None:
    alice = JobRecord("1", 1000, "alice", "gpu", "RUNNING", "my job")
    bob = JobRecord("2", 1001, "bob", "debug", "RUNNING", "bash")
    assert node_gpus(detail("1"), alice, "g1") == (0,)
    assert node_gpus(detail("1"), alice, "g2") == ()
    assert node_gpus(detail("2"), bob, "g2") == (1, 3)
    assert node_gpus(detail("2"), bob, "g3") == (7,)


def test_a_job_name_or_command_that_mimics_slurms_fields_takes_no_gpus() -> None:
    carol = JobRecord("5", 1002, "carol", "gpu", "RUNNING",
                      "x UserId=evil(7) Nodes=g1 GRES=gpu:9(IDX:5)")
    assert node_gpus(detail("5"), carol, "g4") == (0,)
    assert node_gpus(detail("5"), carol, "g1") == ()  # neither the name's nor the Command's
    # a line that is not the job squeue listed (another name, user or id): nothing
    assert node_gpus(detail("5"), JobRecord("5", 7, "evil", "gpu", "RUNNING", "x"), "g4") == ()
    assert node_gpus(detail("1"), JobRecord("1", 1000, "mallory", "gpu", "RUNNING", "my job"),
                     "g1") == ()
    assert node_gpus("", JobRecord("1", 1000, "alice", "gpu", "RUNNING", "my job"), "g1") == ()


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


# ---- the allocation source -----------------------------------------------------------------


def alloc(minor: int, job: str, user: str, partition: str, name: str) -> DeviceAllocation:
    return DeviceAllocation(device=f"minor:{minor}", resource="gres/gpu", source="slurm",
                            workload=Workload(slurm_job=job, user=user, partition=partition,
                                              job=name))


class ScriptedRunner:
    """Answers Slurm's commands from a table; counts the calls; an unknown one is an error."""

    def __init__(self, answers: dict[str, Finished | Exception]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str], *, timeout: float) -> Finished:
        command = " ".join(argv)
        self.calls.append(command)
        answer = self.answers[command]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(stdout: str) -> Finished:
    return Finished(0, stdout, "")


QUEUE_ON_G1 = ("squeue --noheader --all --nodelist=g1 "
               "--states=RUNNING,SUSPENDED,CONFIGURING,COMPLETING --format=%A|%U|%u|%P|%T|%j")


def g1_answers() -> dict[str, Finished | Exception]:
    return {QUEUE_ON_G1: ok(QUEUE_G1),
            "scontrol show job -d -o 1": ok(detail("1") + "\n"),
            "scontrol show job -d -o 2": ok(detail("2") + "\n")}


def test_the_source_lists_the_nodes_jobs_and_their_gpus_at_each_ask() -> None:
    runner = ScriptedRunner(g1_answers())
    source = SlurmAllocations(SlurmCommands(run=runner), node="g1")
    assert source.name == "slurm"
    assert source.allocations() == (
        alloc(0, "1", "alice", "gpu", "my job"), alloc(1, "2", "bob", "debug", "bash"),
        alloc(3, "2", "bob", "debug", "bash"))
    assert len(runner.calls) == 3
    runner.answers[QUEUE_ON_G1] = ok("")
    assert source.allocations() == ()
    assert runner.calls[3:] == [QUEUE_ON_G1]  # no job on the node: no scontrol


def test_each_listing_tells_the_directory_the_nodes_jobs() -> None:
    """A process of a job the source has listed is completed without a squeue of its own."""
    runner = ScriptedRunner(g1_answers())
    clock = ManualClock()
    directory = JobDirectory(SlurmCommands(run=runner), clock)
    SlurmAllocations(SlurmCommands(run=runner), node="g1", directory=directory).allocations()
    asked = len(runner.calls)
    record = directory.lookup("2")
    assert record is not None
    assert (record.user, record.partition) == ("bob", "debug")
    assert len(runner.calls) == asked


def test_a_job_gone_between_squeue_and_scontrol_has_no_gpus() -> None:
    answers = g1_answers()
    answers["scontrol show job -d -o 2"] = Finished(
        1, "", "slurm_load_jobs error: Invalid job id specified")
    source = SlurmAllocations(SlurmCommands(run=ScriptedRunner(answers)), node="g1")
    assert source.allocations() == (alloc(0, "1", "alice", "gpu", "my job"),)


@pytest.mark.parametrize(("answer", "why"), [
    (ProgramTimeout("slow"), "ran past 5s"),
    (FileNotFoundError(2, "No such file or directory"), "cannot run squeue"),
    (Finished(1, "", "squeue: error: Unable to contact slurm controller (connect failure)"),
     "exited 1: squeue: error: Unable to contact slurm controller"),
    (Finished(1, "", "squeue: error: Invalid node name g1"), "Invalid node name g1"),
])
def test_a_slurmctld_that_cannot_answer_is_source_unavailable_until_the_next_refresh(
        answer: Exception | Finished, why: str) -> None:
    runner = ScriptedRunner({QUEUE_ON_G1: answer})
    source = RefreshedSource(SlurmAllocations(SlurmCommands(run=runner), node="g1"), 30,
                             threaded=False)
    source.refresh()
    with pytest.raises(SourceUnavailable, match=why) as raised:
        source.allocations()
    assert raised.value.source == "slurm"
    with pytest.raises(SourceUnavailable, match=why):
        source.allocations()
    assert len(runner.calls) == 1  # the sample reads the last answer; it asks nothing
    runner.answers.update(g1_answers())
    source.refresh()
    assert len(source.allocations()) == 3


def test_the_node_defaults_to_the_short_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "gpu07.cluster.example")
    source = SlurmAllocations(SlurmCommands(run=ScriptedRunner({})))
    assert source.node == "gpu07"


# ---- a job id to its fields ------------------------------------------------------------------


ALICE_1 = "1|1000|alice|gpu|RUNNING|my job\n"
SQUEUE_1 = "squeue --noheader --all --states=all --jobs=1 --format=%A|%U|%u|%P|%T|%j"


def test_a_job_is_looked_up_once_per_ttl() -> None:
    runner = ScriptedRunner({SQUEUE_1: ok(ALICE_1)})
    clock = ManualClock()
    directory = JobDirectory(SlurmCommands(run=runner), clock, ttl=300)
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


def test_slurms_word_wins_over_the_environment() -> None:
    directory = JobDirectory(SlurmCommands(run=ScriptedRunner({SQUEUE_1: ok(ALICE_1)})),
                             ManualClock())
    job = ProcessJob(job_id="1", found_in="environ", uid=1000, user="a", partition="p",
                     name="n")
    assert directory.complete(job) == ProcessJob(job_id="1", found_in="environ", uid=1000,
                                                 user="alice", partition="gpu", name="my job")


@pytest.mark.parametrize(("found_in", "uid", "believed"), [
    ("environ", 1001, False),  # bob's process with SLURM_JOB_ID of alice's job
    ("environ", 1000, True),  # alice's own
    ("environ", 0, True),  # root's
    ("environ", None, True),  # owner unknown (the process is gone): nothing to hold against
    ("cgroup", 1001, True),  # slurmstepd put it there
])
def test_a_job_claimed_by_another_users_environment_is_not_that_jobs(
        found_in: Literal["cgroup", "environ"], uid: int | None, believed: bool) -> None:
    directory = JobDirectory(SlurmCommands(run=ScriptedRunner({SQUEUE_1: ok(ALICE_1)})),
                             ManualClock())
    completed = directory.complete(ProcessJob(job_id="1", found_in=found_in, uid=uid))
    assert (completed is not None) == believed
    if completed is not None:
        assert completed.user == "alice"


def test_a_failing_lookup_keeps_the_job_id_and_is_retried_later() -> None:
    runner = ScriptedRunner({SQUEUE_1: ProgramTimeout("slow")})
    clock = ManualClock()
    directory = JobDirectory(SlurmCommands(run=runner), clock, retry_after=30)
    job = ProcessJob(job_id="1", found_in="cgroup")
    assert directory.complete(job) == job
    clock.advance(29)
    assert directory.complete(job) == job
    assert len(runner.calls) == 1
    runner.answers[SQUEUE_1] = ok(ALICE_1)
    clock.advance(1)
    completed = directory.complete(job)
    assert completed is not None
    assert completed.user == "alice"


def test_a_job_slurm_forgot_is_none_not_a_failure() -> None:
    runner = ScriptedRunner({
        "squeue --noheader --all --states=all --jobs=9 --format=%A|%U|%u|%P|%T|%j":
            Finished(1, "", "slurm_load_jobs error: Invalid job id specified")})
    directory = JobDirectory(SlurmCommands(run=runner), ManualClock())
    assert directory.lookup("9") is None
    assert directory.lookup("not-a-number") is None
    assert len(runner.calls) == 1
