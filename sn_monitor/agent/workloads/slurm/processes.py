"""The Slurm job of one process: from its cgroup, else from its environment.

Two pure parsers and one reader of ``<procfs>/<pid>/``:

* :func:`parse_cgroup_job`: Slurm's cgroup plugins put each step's processes in a cgroup
  named for the job and step. cgroup v1 (``proctrack/cgroup``, ``task/cgroup``):
  ``/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>`` in each controller's hierarchy
  (``/slurm_<node>/...`` for a slurmd started with ``-N``); cgroup v2:
  ``/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>`` (``<node>_slurmstepd.scope``
  with ``-N``). ``/proc/<pid>/cgroup`` is readable by anyone.
* :func:`parse_environ`: what slurmstepd puts in a task's environment (``SLURM_JOB_ID``,
  ``SLURM_JOB_USER``, ``SLURM_JOB_PARTITION``, ``SLURM_JOB_NAME``, the GPUs). The
  fallback for a Slurm that tracks processes without cgroups (``proctrack/linuxproc``).
  Another user's ``/proc/<pid>/environ`` is mode 0400 behind a ptrace-read check: the
  agent needs root with CAP_SYS_PTRACE (see ``deploy/systemd/sn-agent.service``).
* :func:`job_of_process` reads both for one pid. A pid gone since NVML listed it, or a
  file the agent may not read, is "unknown" (None or the fields missing), never an
  exception: attribution never costs the sample.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sn_monitor.agent.workloads.model import Workload
from sn_monitor.agent.workloads.procfs import cgroup_paths
from sn_monitor.agent.workloads.slurm.records import parse_indices

logger = logging.getLogger(__name__)

#: A Slurm cgroup root: ``slurm`` / ``slurm_<node>`` (v1), ``slurmstepd.scope`` /
#: ``<node>_slurmstepd.scope`` (v2); then ``uid_<uid>`` (v1), then the job and its step.
_SLURM_CGROUP = re.compile(
    r"(?:^|/)(?:slurm(?:_[^/]+)?|(?:[^/]+_)?slurmstepd\.scope)"
    r"(?:/uid_\d+)?/job_(\d+)(?:/step_([^/]+))?(?=/|$)")


@dataclass(frozen=True, slots=True)
class SlurmStep:
    """A job id and, when the path names one, its step (``0``, ``batch``, ``extern``)."""

    job_id: str
    step: str | None = None


@dataclass(frozen=True, slots=True)
class SlurmEnviron:
    """A Slurm task's environment; None or empty where it does not say.

    ``gres_gpus``: ``SLURM_STEP_GPUS`` (the step's), else ``SLURM_JOB_GPUS`` (the batch
    step's): the job's GPUs as GRES indices, as ``IDX`` in ``scontrol show job -d``.
    ``cuda_visible_devices``: what CUDA was told, as given (indices renumbered from 0
    under ``ConstrainDevices``, or UUIDs): for display, not for matching devices.
    """

    job_id: str
    step: str | None = None
    user: str | None = None
    partition: str | None = None
    name: str | None = None
    gres_gpus: tuple[int, ...] = ()
    cuda_visible_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessJob:
    """The Slurm job of a process and where it was found (``cgroup`` or ``environ``).

    ``uid``: the process's owner (of ``/proc/<pid>``), None if unknown. A cgroup is set by
    slurmstepd; an environment by whoever started the process, who may claim any job:
    :meth:`~sn_monitor.agent.workloads.slurm.directory.JobDirectory.complete` checks the
    claim against the job's owner.
    """

    job_id: str
    found_in: Literal["cgroup", "environ"]
    uid: int | None = None
    step: str | None = None
    user: str | None = None
    partition: str | None = None
    name: str | None = None
    gres_gpus: tuple[int, ...] = ()

    def workload(self) -> Workload:
        """As the shared model's :class:`Workload`."""
        return Workload(slurm_job=self.job_id, user=self.user, partition=self.partition,
                        job=self.name)


def parse_cgroup_job(text: str) -> SlurmStep | None:
    """``/proc/<pid>/cgroup`` -> the Slurm job and step; None for a process outside Slurm.

    Lines are ``hierarchy:controllers:path``; the v2 line (``0::``) is looked at first.
    """
    for path in cgroup_paths(text):
        found = _SLURM_CGROUP.search(path)
        if found is not None:
            return SlurmStep(found.group(1), found.group(2))
    return None


def parse_environ(data: bytes) -> SlurmEnviron | None:
    """``/proc/<pid>/environ`` (NUL-separated) -> the Slurm job; None without one."""
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.decode("utf-8", errors="replace").partition("=")
        if sep and key.startswith(("SLURM_", "CUDA_VISIBLE_DEVICES")):
            env.setdefault(key, value)
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id or not job_id.isdigit():
        return None
    gpus = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or ""
    cuda = env.get("CUDA_VISIBLE_DEVICES", "")
    return SlurmEnviron(
        job_id=job_id, step=env.get("SLURM_STEP_ID") or None,
        user=env.get("SLURM_JOB_USER") or None,
        partition=env.get("SLURM_JOB_PARTITION") or None,
        name=env.get("SLURM_JOB_NAME") or None,
        gres_gpus=parse_indices(gpus) if gpus else (),
        cuda_visible_devices=tuple(part for part in cuda.split(",") if part))


def job_of_process(procfs: Path, pid: int) -> ProcessJob | None:
    """The Slurm job of ``pid`` under ``procfs``; None when not a Slurm process or unknown.

    The cgroup names the job when Slurm uses cgroups; the environment adds its user,
    partition and name (and names the job when the cgroup does not). What the
    environment says is the process owner's word: pass the result through
    :meth:`~sn_monitor.agent.workloads.slurm.directory.JobDirectory.complete`, which
    puts Slurm's in its place.
    """
    uid = _owner(procfs / str(pid))
    text = _read(procfs / str(pid) / "cgroup")
    step = parse_cgroup_job(text.decode("utf-8", errors="replace")) if text else None
    raw = _read(procfs / str(pid) / "environ")
    env = parse_environ(raw) if raw else None
    if env is not None and step is not None and env.job_id != step.job_id:
        env = None  # an environment inherited from another job: the cgroup is the truth
    if step is None:
        return None if env is None else ProcessJob(
            job_id=env.job_id, found_in="environ", uid=uid, step=env.step, user=env.user,
            partition=env.partition, name=env.name, gres_gpus=env.gres_gpus)
    known = env or SlurmEnviron(step.job_id)
    return ProcessJob(job_id=step.job_id, found_in="cgroup", uid=uid, step=step.step,
                      user=known.user, partition=known.partition, name=known.name,
                      gres_gpus=known.gres_gpus)


def _owner(directory: Path) -> int | None:
    try:
        return directory.stat().st_uid
    except OSError as exc:  # the process is gone
        logger.debug("cannot stat %s: %s", directory, exc)
        return None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except PermissionError as exc:
        logger.debug("cannot read %s: %s (another user's needs CAP_SYS_PTRACE)",
                     path, exc)
    except OSError as exc:  # the process is gone (FileNotFoundError, ProcessLookupError)
        logger.debug("cannot read %s: %s", path, exc)
    return None
