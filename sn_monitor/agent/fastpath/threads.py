"""The fast path's threads of one agent, started and stopped together.

:class:`FastEventPath` runs an :class:`~.nvml_waiter.NvmlEventWaiter` when the agent has
NVML and a :class:`~.kernel_follower.KernelLogFollower` when it reads the kernel log,
both handing to one :class:`~.handoff.EventHandoff`. It is started after the agent's
first sample (NVML initialised, the kernel log open) and stopped before the collectors
are closed.
"""

from __future__ import annotations

from sn_monitor.agent.fastpath.handoff import EventHandoff
from sn_monitor.agent.fastpath.kernel_follower import FollowedLog, KernelLogFollower
from sn_monitor.agent.fastpath.nvml_waiter import NvmlEventWaiter, XidSource


class FastEventPath:
    """The NVML waiter (``xids``) and the kernel-log follower (``kernel_log``), either optional."""

    def __init__(self, handoff: EventHandoff, *, xids: XidSource | None,
                 kernel_log: FollowedLog | None, node: str = "") -> None:
        self._threads: list[NvmlEventWaiter | KernelLogFollower] = []
        if xids is not None:
            self._threads.append(NvmlEventWaiter(xids, handoff.deliver, node=node))
        if kernel_log is not None:
            self._threads.append(KernelLogFollower(kernel_log, handoff.deliver, node=node))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float) -> None:
        """Stop every thread (each waits at most ``timeout`` seconds)."""
        for thread in self._threads:
            thread.stop(timeout)
