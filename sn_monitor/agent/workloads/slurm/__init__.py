"""Slurm as an attribution source: which Slurm job a GPU process, or an idle GPU, belongs to.

* :mod:`.processes`: the job of one process, from its ``/proc/<pid>/cgroup`` (cgroup v1
  and v2 paths of Slurm's cgroup plugins; readable by anyone) and else from its
  ``/proc/<pid>/environ`` (``SLURM_JOB_ID``, ``SLURM_JOB_USER``, ...; another user's
  needs CAP_SYS_PTRACE, see ``deploy/systemd/sn-agent.service``);
* :mod:`.records`: pure parsers of ``squeue`` (a job's user, partition, name) and
  ``scontrol show job -d -o`` (its GPUs' GRES indices per node), and Slurm hostlists;
* :mod:`.commands`: the one place the agent runs ``squeue`` and ``scontrol`` (each
  bounded by a timeout);
* :mod:`.directory`: a job id to its user, partition and name, cached per job;
* :mod:`.allocations`: the ``slurm`` :class:`~sn_monitor.agent.workloads.model.AllocationSource`,
  the GPUs Slurm gave the jobs on this node, busy or idle.

May import: the standard library, ``sn_monitor.agent.workloads.model``,
``sn_monitor.clock``, ``sn_monitor.program``.
"""
