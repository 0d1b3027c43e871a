"""The one adapter between the agent and NVML.

Every NVML call the agent makes goes through :class:`NvmlLibrary`, built from an NVML
module passed in: the real ``pynvml`` (:func:`load_pynvml`) or
:mod:`sn_monitor.sim.fake_nvml`. It owns what a long-running daemon must get right:

* ``nvmlInit`` once, under a lock; ``nvmlShutdown`` on close; the driver version read once.
* Capability versus fault. ``NotSupported``, ``NoPermission``, ``Deprecated``,
  ``ArgumentVersionMismatch``, ``VgpuEccNotSupported``, ``FunctionNotFound`` and a function
  missing from the bindings mean the capability is absent: the field is None, remembered
  per (device, field) and never asked again (a missing function: on no device); all but
  ``NotSupported`` are logged once. ``GpuIsLost``, ``Unknown``, ``DriverNotLoaded``,
  ``InsufficientPower``, ``GpuNotFound`` and the like (``FAULTS``) are faults: the GPU's
  sample is returned with ``lost=True`` and a ``gpu_lost`` event is emitted once per loss.
  Any other error (``Timeout``, ``Memory``, ``InsufficientResources``, ...) is transient:
  the field is left out for this cycle only, asked again the next, and logged once per
  (device, field, error). No decision that is kept for good (the NVLink count, GPM
  support, the identity, the XID event set) is taken on a transient error.
* Init: ``LibraryNotFound`` and ``DriverNotLoaded`` from ``nvmlInit`` mean no NVML on the
  node (:class:`NvmlUnavailable`); any other error is :class:`NvmlError`. A GPU that
  faults while being identified at init is reported lost by the first collect.
* Units: NVML's mW, mJ, MHz, KB/s, MiB/s (GPM) and percent become watts, joules, hertz,
  bytes/s and 0..1 ratios here, nowhere else.
* No blocking reads in the cycle (PCIe throughput from GPM, else read seldom), and NVLink
  without ~700 driver calls a cycle (per-link reads only when something may have changed).
* XID events from an NVML event set, drained without blocking on every collect, and
  waited on by the agent's fast path (:meth:`NvmlLibrary.wait_xid_events`) on a thread
  of its own, outside the adapter's lock.
* The NVLink fabric's registration and the compute processes on each GPU (with their
  SM utilisation where the driver samples it), every cycle: one call each per GPU.
* MIG: the mode of each GPU and, while it is on, its MIG devices (UUID, GPU and compute
  instance ids, profile, memory, processes, GPM activity per GPU instance). A mode
  change probes the GPU's absent capabilities again.

Its modules, each owning one part (a module imports only those listed before it):

* :mod:`.errors`: NVML's return codes in three classes (absent, fault, transient) and the
  errors the adapter raises.
* :mod:`.units`: NVML's units to the snapshot's.
* :mod:`.device`: what is remembered about one device between cycles.
* :mod:`.calls`: the call wrapper every device read goes through, the one place an error
  is classified, the "missing function" and "logged once" memories.
* :mod:`.nvlink`: counting a GPU's NVLinks, their state and counters, the link topology.
* :mod:`.gpm`: DRAM bandwidth and PCIe throughput (GPM, else the throttled blocking read).
* :mod:`.fabric`: the NVLink fabric registration.
* :mod:`.process_utilization`: each compute process's SM utilisation.
* :mod:`.processes`: the compute processes on a GPU or a MIG device.
* :mod:`.mig`: the MIG mode, the MIG devices and what each holds.
* :mod:`.events`: the XID event set, its registrations, its wait and its drain.
* :mod:`.sampling`: one GPU's :class:`~sn_monitor.agent.snapshot.GpuSample` a cycle.
* :mod:`.library`: :class:`NvmlLibrary`, the face and the life cycle.

Nothing else in the agent imports pynvml. Outside this package, import from
``sn_monitor.agent.nvml`` only.
"""

from sn_monitor.agent.nvml.errors import GpuUnreachable, NvmlError, NvmlUnavailable
from sn_monitor.agent.nvml.fabric import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_IN_PROGRESS,
    FABRIC_STATE_NOT_STARTED,
    FABRIC_STATE_NOT_SUPPORTED,
)
from sn_monitor.agent.nvml.gpm import PCIE_THROUGHPUT_INTERVAL_SECONDS
from sn_monitor.agent.nvml.library import NvmlLibrary, load_pynvml
from sn_monitor.agent.nvml.nvlink import NVLINK_LINK_INTERVAL_SECONDS
from sn_monitor.agent.nvml.sampling import THROTTLE_REASONS

__all__ = [
    "FABRIC_STATE_COMPLETED",
    "FABRIC_STATE_IN_PROGRESS",
    "FABRIC_STATE_NOT_STARTED",
    "FABRIC_STATE_NOT_SUPPORTED",
    "NVLINK_LINK_INTERVAL_SECONDS",
    "PCIE_THROUGHPUT_INTERVAL_SECONDS",
    "THROTTLE_REASONS",
    "GpuUnreachable",
    "NvmlError",
    "NvmlLibrary",
    "NvmlUnavailable",
    "load_pynvml",
]
