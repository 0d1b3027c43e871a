"""The agent's own thermal guard: caps a hot GPU's power without waiting for the controller.

The controller may be unreachable exactly when a fan fails, so every agent protects its
own GPUs. Each cycle :meth:`ThermalGuard.observe` looks at the snapshot:

* a GPU at or above ``throttle_at`` for ``hold`` seconds without a break gets its power
  limit lowered to ``power_cap`` x its default limit (clamped to the GPU's [min, max]);
* a GPU the guard capped, below ``release_at`` for ``hold`` seconds, gets its original
  limit back.

``throttle_at`` never sits above the GPU's own slowdown threshold minus
:data:`SLOWDOWN_MARGIN_CELSIUS`: by the time the hardware slows itself down it is too late
to act gracefully. When that lowers ``throttle_at``, ``release_at`` moves down with it so
the hysteresis gap stays the same (see :func:`effective_thresholds`).

**The operator's limit always comes back.** The limit a GPU had before its first change
is written to ``state_dir/guard.json`` (atomically, fsynced) *before* the limit is
touched. A release, :meth:`ThermalGuard.restore_all` (at agent stop) and
:meth:`ThermalGuard.recover` (at agent start, after a crash) put it back and then forget
it. Should that file not be writable the GPU is capped anyway (the hardware comes first)
and the original is kept in memory, so only a crash would lose it; that is logged.

**One cap per GPU, shared with the controller.** The controller's ``throttle`` and
``release`` commands come through :meth:`ThermalGuard.apply_cap` and
:meth:`ThermalGuard.release`, so the original is saved the same way. A cap is owned by
whoever set it last: the guard auto-releases only caps it set itself (a controller
throttle stays until the controller releases it); a controller release releases any cap
(if the GPU is still hot, the guard caps it again after ``hold``). When a GPU is already
capped at or below the guard's target, the guard leaves it alone; a milder controller
cap is lowered to the guard's target and the guard then owns it.

**Modes.** ``enforce`` acts. ``dry-run`` decides, logs and emits events ("would cap GPU 3
to 490 W") but never calls the setter; :meth:`ThermalGuard.throttled` then stays empty
because nothing is throttled. ``off`` takes no decisions of its own; controller commands
are still carried out (they are the controller's decision, made under its own dry-run
policy). :meth:`ThermalGuard.recover` restores saved limits in every mode: they were
changed by an earlier run, and leaving a GPU capped by an agent that no longer guards it
is the worse outcome.

**Failures.** A setter error (:class:`NvmlError`: no permission, GPU lost) is logged with
the GPU and retried every cycle; it never escapes :meth:`observe`.

**Fresh readings only; a hung NVML.** The guard decides only on the GPUs of the snapshot
in hand, read this cycle. A GPU missing from it (its collector failed or is stuck, see
:mod:`sn_monitor.agent.watchdog`) has its hold timers reset: "hot for ``hold`` seconds
without a break" cannot be vouched for across readings that were never taken, so the
guard neither caps nor releases it on the strength of older temperatures; once readings
come back, the hold starts again from the first of them. When the ``nvml`` collector
itself is stuck the driver is wedged and the setter would hang too (on the sampling
thread, stopping every later cycle), so the guard calls it not at all: caps and
restores wanted meanwhile (its own, the controller's, ``restore_all`` at stop) fail at
once with "NVML is not answering" and are retried every cycle as any setter error is;
the saved original limits stay in ``guard.json``, so an agent stopped meanwhile puts them
back when it next starts (:meth:`recover`). The GPUs cannot be protected from here while
NVML hangs; the ``collector_stuck`` event and ``sn_agent_collector_stuck`` tell a person.

Every action is an :class:`Event` (``kind="guard"``, ``source="agent"``) for the reporter
to spool, so the controller learns what the node did on its own.

Its modules: :mod:`.saved_limits` (the saved originals and their file, imports nothing of
the package) and :mod:`.thermal` (:class:`ThermalGuard`: the decisions, the caps, the
setter). Both log as ``sn_monitor.agent.guard``.
"""

from sn_monitor.agent.guard.saved_limits import STATE_FILE
from sn_monitor.agent.guard.thermal import (
    SLOWDOWN_MARGIN_CELSIUS,
    Cap,
    CapOutcome,
    Owner,
    PowerLimitSetter,
    ThermalGuard,
    effective_thresholds,
)

__all__ = [
    "SLOWDOWN_MARGIN_CELSIUS",
    "STATE_FILE",
    "Cap",
    "CapOutcome",
    "Owner",
    "PowerLimitSetter",
    "ThermalGuard",
    "effective_thresholds",
]
