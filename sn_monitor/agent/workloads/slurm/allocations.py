"""The ``slurm`` allocation source: the GPUs Slurm gave the jobs on this node, busy or idle.

A refresh lists the jobs holding an allocation on this node (``squeue --nodelist``) and,
for each, its GPUs here (``scontrol show job -d -o <id>``: ``GRES=gpu:N(IDX:...)`` of the
node group naming this node; see :mod:`.records` for why both).

**IDX to device.** ``IDX`` is a GPU's position among the node's GPUs in gres.conf (0 for
the first ``File=``), also what ``SLURM_JOB_GPUS`` / ``SLURM_STEP_GPUS`` hold. gres.conf
names a GPU by its device file, ``File=/dev/nvidiaN``, whose minor number is N, and NVML
reports that same number as the device's minor number (``nvmlDeviceGetMinorNumber``, not
its index, which follows PCI order and can differ). So IDX N is reported as the device
``minor:N``: true when gres.conf lists ``/dev/nvidia0`` .. ``/dev/nvidiaN`` in order (as
``File=/dev/nvidia[0-7]`` and ``AutoDetect=nvml`` do). A gres.conf that skips or reorders
device files (a GPU left out after a failure) shifts the positions after the gap: such a
node's allocations are off by the gap, and the process attribution (cgroup, environ),
which does not depend on the order, is the one to trust there.

A refresh costs 1 + (jobs on the node) commands (40-150 ms, up to the commands' timeout
when slurmctld is slow), so the agent asks this source on a thread of its own every
``refresh`` seconds (:class:`~sn_monitor.agent.workloads.refreshed.RefreshedSource`),
never on the sampling thread. Each refresh also hands the node's jobs (user, partition,
name) to the :class:`~sn_monitor.agent.workloads.slurm.directory.JobDirectory`, so that
a GPU process of a job already running here is completed without a command of its own.
"""

from __future__ import annotations

import socket

from sn_monitor.agent.workloads.model import DeviceAllocation, Workload
from sn_monitor.agent.workloads.slurm.commands import SOURCE, SlurmCommands
from sn_monitor.agent.workloads.slurm.directory import JobDirectory
from sn_monitor.agent.workloads.slurm.records import JobRecord, node_gpus, parse_queue

#: Seconds between two refreshes (the agent's default ``attribution.slurm.refresh``).
DEFAULT_REFRESH_SECONDS = 30.0
#: The resource name Slurm's GPUs go by (``TRES=gres/gpu=2``).
RESOURCE = "gres/gpu"


def allocations_of(held: list[tuple[JobRecord, tuple[int, ...]]]) -> tuple[DeviceAllocation, ...]:
    """Jobs and their GPUs' GRES indices -> allocations of ``minor:N``, by minor number."""
    pairs = sorted(((index, job) for job, indices in held for index in indices),
                   key=lambda pair: pair[0])
    return tuple(
        DeviceAllocation(device=f"minor:{index}", resource=RESOURCE, source=SOURCE,
                         workload=Workload(slurm_job=job.job_id, user=job.user,
                                           partition=job.partition, job=job.name))
        for index, job in pairs)


class SlurmAllocations:
    """The ``slurm`` :class:`~sn_monitor.agent.workloads.model.AllocationSource`.

    ``node``: this node's name in Slurm (default: the host name up to its first dot, as
    slurmd names itself); ``directory``: told the user, partition and name of every job
    each refresh lists. Every call asks Slurm: pace it with a ``RefreshedSource``.
    """

    name = SOURCE

    def __init__(self, commands: SlurmCommands, *, node: str | None = None,
                 directory: JobDirectory | None = None) -> None:
        self.node = node or socket.gethostname().split(".")[0]
        self._commands = commands
        self._directory = directory

    def allocations(self) -> tuple[DeviceAllocation, ...]:
        """Every GPU of this node Slurm gave a job; :class:`SourceUnavailable` if none."""
        jobs = parse_queue(self._commands.jobs_on(self.node))
        if self._directory is not None:
            self._directory.learn(jobs)
        return allocations_of([
            (job, node_gpus(self._commands.job_detail(job.job_id).strip(), job, self.node))
            for job in jobs if job.holds_devices])

    def close(self) -> None:
        """Nothing held between calls (each command is its own process)."""
