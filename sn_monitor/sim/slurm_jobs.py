"""The simulated supernode's Slurm jobs: who holds which GPUs, as Slurm's commands say.

The demo's supernode runs two Slurm jobs: the training job (``demo``, busy) on every GPU
of the job's nodes, and a ``notebook`` that holds half the GPUs of the last spare and
leaves them idle (:meth:`SimJob.idle`: the supernode holds their load at 0). The agents
learn them as on a real node, from ``squeue`` and ``scontrol show job -d -o``
(:mod:`sn_monitor.agent.workloads.slurm`): :func:`write_commands` writes both programs,
their answers fixed when written, into a directory the agents find first on ``PATH``.
The simulated fleet (:mod:`sn_monitor.sim.fleet`) reports the same jobs directly
(:func:`workload_report`), without the commands.

The jobs are fixed for the whole run: a rank moved onto a spare by a failover is not
followed by its Slurm job (the demo's launcher is not Slurm).
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sn_monitor.model import GpuWorkloadReport

#: A job as ``squeue --format=%A|%U|%u|%P|%T|%j`` lists it (the agent's ``QUEUE_FORMAT``).
_QUEUE_LINE = "{job_id}|{uid}|{user}|{partition}|RUNNING|{name}"


@dataclass(frozen=True)
class SimJob:
    """One running Slurm job: its GPUs (GRES indices) on each of its nodes."""

    job_id: str
    name: str
    user: str
    uid: int
    partition: str
    gpus: dict[str, tuple[int, ...]]
    #: The job holds its GPUs without using them (utilization held at 0).
    idle: bool = False

    def queue_line(self) -> str:
        """The job as ``squeue`` lists it."""
        return _QUEUE_LINE.format(job_id=self.job_id, uid=self.uid, user=self.user,
                                  partition=self.partition, name=self.name)

    def detail_line(self) -> str:
        """The job as ``scontrol show job -d -o`` prints it: one node group per node."""
        total = sum(len(indices) for indices in self.gpus.values())
        groups = "".join(
            f"   Nodes={node} CPU_IDs=0-15 Mem=0 GRES=gpu:{len(indices)}"
            f"(IDX:{','.join(map(str, indices))})" for node, indices in self.gpus.items())
        return (f"JobId={self.job_id} JobName={self.name} UserId={self.user}({self.uid}) "
                f"GroupId={self.user}({self.uid}) "
                f"JobState=RUNNING Partition={self.partition} NumNodes={len(self.gpus)} "
                f"TRES=gres/gpu={total} JOB_GRES=gpu:{total}{groups} MinCPUsNode=1 "
                f"Command=/bin/{self.name}")


def demo_jobs(job_nodes: Sequence[str], spares: Sequence[str], gpus: int) -> tuple[SimJob, ...]:
    """The busy training job on ``job_nodes``; the idle notebook on the last spare."""
    jobs = [SimJob("1001", "demo", "ada", 1001, "train",
                   {node: tuple(range(gpus)) for node in job_nodes})]
    if spares:
        jobs.append(SimJob("1002", "notebook", "bob", 1002, "interactive",
                           {spares[-1]: tuple(range(gpus // 2 or 1))}, idle=True))
    return tuple(jobs)


def workload_report(job: SimJob) -> GpuWorkloadReport:
    """What an agent reports for ``job`` on each GPU it holds."""
    return GpuWorkloadReport(slurm_job=job.job_id, user=job.user, partition=job.partition,
                             workload_job=job.name)


#: The program both commands run: the answers are in ``ANSWERS``, keyed by the argument
#: that selects them (``--nodelist=``, ``--jobs=``, the job id after ``-o``).
_PROGRAM = '''#!{python} -S
import json, sys
ANSWERS = json.loads({answers!r})
args = sys.argv[1:]
if "{command}" == "squeue":
    for arg in args:
        if arg.startswith("--nodelist="):
            sys.stdout.write(ANSWERS["nodes"].get(arg[11:], ""))
        elif arg.startswith("--jobs="):
            sys.stdout.write(ANSWERS["queue"].get(arg[7:], ""))
else:
    line = ANSWERS["detail"].get(args[-1]) if args else None
    if line is None:
        sys.exit("slurm_load_jobs error: Invalid job id specified")
    sys.stdout.write(line)
'''


def write_commands(jobs: Sequence[SimJob], directory: Path) -> Path:
    """Write ``squeue`` and ``scontrol`` answering for ``jobs`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    nodes: dict[str, str] = {}
    for job in jobs:
        for node in job.gpus:
            nodes[node] = nodes.get(node, "") + job.queue_line() + "\n"
    answers = json.dumps({
        "nodes": nodes,
        "queue": {job.job_id: job.queue_line() + "\n" for job in jobs},
        "detail": {job.job_id: job.detail_line() + "\n" for job in jobs},
    })
    for command in ("squeue", "scontrol"):
        path = directory / command
        path.write_text(_PROGRAM.format(python=sys.executable, answers=answers,
                                        command=command))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory
