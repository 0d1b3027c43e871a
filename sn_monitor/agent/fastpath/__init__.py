"""The agent's fast event path: a fault event reported the moment it happens.

The sampling cycle sees an XID once a cycle; this package owns the threads that see it
at once and hand it on without waiting for the cycle:

* :mod:`.nvml_waiter`: a thread blocked in NVML's event wait
  (:meth:`NvmlLibrary.wait_xid_events <sn_monitor.agent.nvml.NvmlLibrary.wait_xid_events>`),
  with a timeout that lets it stop.
* :mod:`.kernel_follower`: a thread that wakes when the kernel log has something new
  (``poll()`` on ``/dev/kmsg``; inotify on a followed file's directory) and makes the
  kmsg collector read it at once; :mod:`.inotify` is Linux inotify through ctypes.
* :mod:`.handoff`: each event through the sampler's join (GPU index, the XID ledger that
  counts an XID seen by NVML and the kernel log once), then, when new, spooled and the
  report thread woken to send it in an event-only report.
* :mod:`.threads`: the threads of one agent, started and stopped together.

It owns no event source: the adapter's event set and the collector's reader stay the
sampling cycle's too, so that whichever path takes an event takes it once. Imports the
NVML adapter's error, the model and the snapshot's types; the sampler and the reporter
reach it as callables (the daemon wires them).
"""
