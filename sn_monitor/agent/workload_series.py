"""The workload families: whose job is on each GPU, each GPU process, each source's state.

Formats a :class:`~sn_monitor.agent.snapshot.NodeSnapshot` only (the GPU collector's
attribution step filled it in):

* ``sn_gpu_workload_info{gpu,uuid,mig_instance,pod,namespace,container,slurm_job,user,
  partition,workload_job} 1``: one series per GPU (and MIG instance) and workload, a
  label empty where nobody says. Joined onto any GPU family with ``group_left``::

      sn_gpu_utilization_ratio * on(instance, uuid) group_left(namespace, pod)
        sn_gpu_workload_info

  (a GPU shared by several workloads gives one result per workload).
* ``sn_gpu_process_memory_bytes`` and ``sn_gpu_process_sm_utilization_ratio``
  ``{gpu,uuid,mig_instance,pid,command,user,container_id,pod_uid}``, where NVML gives
  them, for at most :data:`MAX_PROCESS_SERIES_PER_GPU` processes per GPU (the most
  memory first): a pid label is one series per process, so the bound keeps a GPU shared
  by hundreds of short processes from flooding Prometheus; ``sn_gpu_processes`` still
  counts them all. ``pod_uid`` joins kube-state-metrics' ``kube_pod_info{uid}``.
* ``sn_agent_source_up{source}``: 1 when the allocation source answered this cycle.

Label names. Prometheus attaches ``job`` and ``instance`` to every series it scrapes
(the scrape job and the target); a scraped label of the same name is renamed
``exported_job`` / ``exported_instance`` (``honor_labels: false``, the default) or
overwrites the target's (``honor_labels: true``, which would break ``up{job="sn-agent"}``
and every ``on(instance)`` join). So the workload's job name is ``workload_job`` and the
MIG instance ``mig_instance``. ``pod``, ``namespace`` and ``container`` keep the names
kube-state-metrics and dcgm-exporter use, so joins with ``kube_pod_labels`` need no
relabelling; Prometheus itself attaches none of them, and the PodMonitor that scrapes
the agent (deploy/kubernetes/podmonitor.yaml) drops the agent pod's own ``namespace``,
``pod`` and ``container`` target labels. ``mig_instance`` is empty until MIG instances
are enumerated (see :func:`~sn_monitor.agent.workloads.join.mig_devices`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

from sn_monitor.agent.exposition import Family, gauge
from sn_monitor.agent.snapshot import GpuProcess, GpuSample, NodeSnapshot

#: Per-process series per GPU at most (the processes using the most memory).
MAX_PROCESS_SERIES_PER_GPU: Final = 16

WORKLOAD_LABELS: Final = ("gpu", "uuid", "mig_instance", "pod", "namespace", "container",
                          "slurm_job", "user", "partition", "workload_job")
PROCESS_LABELS: Final = ("gpu", "uuid", "mig_instance", "pid", "command", "user",
                         "container_id", "pod_uid")


def workload_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    """The workload info, per-process and source families of ``snapshot``."""
    yield from _workloads(snapshot.gpus)
    yield from _processes(snapshot.gpus)
    if snapshot.sources:
        up = gauge("sn_agent_source_up",
                   "1 when the workload allocation source (kubelet, slurm) answered in the "
                   "latest sample, 0 while it cannot be read (GPUs are attributed without it).",
                   labels=["source"])
        for source in snapshot.sources:
            up.add_metric([source.name], 1.0 if source.up else 0.0)
        yield up


def _workloads(gpus: Sequence[GpuSample]) -> Iterator[Family]:
    info = gauge(
        "sn_gpu_workload_info",
        "1 for each workload on the GPU (or MIG instance): from the kubelet and Slurm "
        "allocations, else the GPU processes' users; labels empty where unknown.",
        labels=WORKLOAD_LABELS,
    )
    for gpu in gpus:
        for w in gpu.workloads:
            info.add_metric([str(gpu.index), gpu.uuid, w.mig_instance or "", w.pod or "",
                             w.namespace or "", w.container or "", w.slurm_job or "",
                             w.user or "", w.partition or "", w.workload_job or ""], 1.0)
    if info.samples:
        yield info


def listed_processes(gpu: GpuSample) -> list[GpuProcess]:
    """The GPU's processes that get series: the most memory first, then by pid."""
    processes = sorted(gpu.processes or (),
                       key=lambda p: (-(p.used_memory_bytes or 0), p.pid))
    return processes[:MAX_PROCESS_SERIES_PER_GPU]


def _processes(gpus: Sequence[GpuSample]) -> Iterator[Family]:
    memory = gauge("sn_gpu_process_memory_bytes",
                   "GPU memory the process uses (NVML); at most "
                   f"{MAX_PROCESS_SERIES_PER_GPU} processes per GPU, the most memory first.",
                   labels=PROCESS_LABELS)
    sm = gauge("sn_gpu_process_sm_utilization_ratio",
               "Fraction of time the process had a kernel on the GPU's SMs, in NVML's latest "
               "sample of it (absent: not supported, or no kernel since the last sample).",
               labels=PROCESS_LABELS)
    for gpu in gpus:
        for p in listed_processes(gpu):
            labels = [str(gpu.index), gpu.uuid, "", str(p.pid), p.command or "",
                      p.user or "", p.container_id or "", p.pod_uid or ""]
            if p.used_memory_bytes is not None:
                memory.add_metric(labels, float(p.used_memory_bytes))
            if p.sm_utilization_ratio is not None:
                sm.add_metric(labels, p.sm_utilization_ratio)
    yield from (family for family in (memory, sm) if family.samples)
