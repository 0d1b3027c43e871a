"""The guard's decisions and actions: :class:`ThermalGuard` (see the package docstring).

Per GPU: hold timers, the wanted cap and its owner, the setter's failures; each cycle it
decides and converges every GPU's limit to what is wanted. Imports :mod:`.saved_limits`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.guard.saved_limits import SavedLimits
from sn_monitor.agent.nvml import NvmlError
from sn_monitor.agent.settings import GuardSettings
from sn_monitor.agent.snapshot import CollectorStatus, GpuSample, NodeSnapshot
from sn_monitor.clock import Clock
from sn_monitor.model import Event

log = logging.getLogger(__package__)  # the guard's one logger, named as before the split

#: ``set_power_limit(gpu_index, watts)``: :meth:`NvmlLibrary.set_power_limit_watts`.
PowerLimitSetter = Callable[[int, float], None]
Owner = Literal["guard", "controller"]

#: The guard acts at least this far below the GPU's own slowdown temperature.
SLOWDOWN_MARGIN_CELSIUS = 3.0
# Caps closer than this are the same cap (NVML limits are whole milliwatts anyway).
_WATTS_EPSILON = 0.5


def effective_thresholds(
    settings: GuardSettings, slowdown_celsius: float | None
) -> tuple[float, float]:
    """(throttle at, release below) for a GPU with this slowdown threshold.

    ``throttle_at`` is lowered to ``slowdown - margin`` when that is below it; the release
    threshold moves down by the same amount so the hysteresis gap is kept.
    """
    throttle = settings.throttle_at
    release = settings.release_at
    if slowdown_celsius is not None:
        ceiling = slowdown_celsius - SLOWDOWN_MARGIN_CELSIUS
        if ceiling < throttle:
            release -= throttle - ceiling
            throttle = ceiling
    return throttle, release


@dataclass(frozen=True, slots=True)
class CapOutcome:
    """What :meth:`ThermalGuard.apply_cap` / :meth:`ThermalGuard.release` did."""

    ok: bool
    message: str
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class Cap:
    """A wanted power cap. ``dry_run`` caps were only decided, never set."""

    watts: float
    owner: Owner
    reason: str
    dry_run: bool = False


@dataclass(slots=True)
class _GpuState:
    """What the guard tracks per GPU between cycles."""

    index: int
    pci_bus_id: str | None = None
    limit_watts: float | None = None
    default_watts: float | None = None
    min_watts: float | None = None
    max_watts: float | None = None
    temperature_celsius: float | None = None
    above_since: float | None = None
    below_since: float | None = None
    cap: Cap | None = None
    # The cap the setter last accepted; None: the original limit is in effect.
    applied_watts: float | None = None
    # The limit may differ from the saved original (set, or recovered from the file).
    dirty: bool = False
    failing: bool = False
    noop_logged: bool = False
    last_error: str | None = None
    # Why the limit is to be restored, for the event once the restore takes.
    why: str = ""


class ThermalGuard:
    """Caps hot GPUs and restores the operator's limits; see the package docstring."""

    def __init__(
        self,
        settings: GuardSettings,
        set_power_limit: PowerLimitSetter,
        state_dir: Path,
        clock: Clock,
    ) -> None:
        self._settings = settings
        self._set = set_power_limit
        self._saved = SavedLimits(state_dir)
        self._clock = clock
        self._lock = threading.RLock()
        self._gpus: dict[int, _GpuState] = {}
        self._outbox: list[Event] = []
        # The nvml collector's status while it is stuck (None: NVML answers).
        self._nvml_stuck: CollectorStatus | None = None

    @property
    def mode(self) -> str:
        return self._settings.mode

    @property
    def state_file(self) -> Path:
        return self._saved.path

    # ---------------------------------------------------------------- queries

    def throttled(self) -> set[int]:
        """GPUs whose power limit sn-monitor has lowered now (guard or controller cap)."""
        with self._lock:
            return {i for i, s in self._gpus.items() if s.applied_watts is not None}

    def caps(self) -> dict[int, Cap]:
        """The wanted caps by GPU, dry-run ones included."""
        with self._lock:
            return {i: s.cap for i, s in self._gpus.items() if s.cap is not None}

    def known_gpus(self) -> list[int]:
        """GPU indices seen in snapshots (what "every GPU" means to a command)."""
        with self._lock:
            return sorted(i for i, s in self._gpus.items() if s.limit_watts is not None)

    def default_limit_watts(self, gpu: int) -> float | None:
        """The GPU's default power limit as last sampled."""
        with self._lock:
            state = self._gpus.get(gpu)
            return None if state is None else state.default_watts

    def original_limits(self) -> dict[int, float]:
        """The saved operator limits of GPUs whose limit sn-monitor may have changed."""
        with self._lock:
            return self._saved.all()

    # ---------------------------------------------------------------- the cycle

    def observe(self, snapshot: NodeSnapshot) -> list[Event]:
        """Decide and act for one snapshot; return the guard's events since the last call.

        The events include those of controller commands carried out since then.
        """
        with self._lock:
            now = self._clock.monotonic()
            self._nvml_stuck = next((c for c in snapshot.collectors
                                     if c.name == NvmlCollector.name and c.stuck), None)
            fresh = {sample.index for sample in snapshot.gpus}
            for index, state in self._gpus.items():
                if index not in fresh:  # no reading this cycle: no evidence either way
                    state.above_since = state.below_since = None
            for sample in snapshot.gpus:
                state = self._remember(sample)
                if self._settings.mode != "off":
                    self._decide(state, sample, now)
            for state in list(self._gpus.values()):
                self._converge(state)
            events, self._outbox = self._outbox, []
            return events

    def _remember(self, sample: GpuSample) -> _GpuState:
        state = self._state(sample.index)
        state.pci_bus_id = sample.pci_bus_id or state.pci_bus_id
        if not sample.lost:
            state.limit_watts = _known(sample.power_limit_watts, state.limit_watts)
            state.default_watts = _known(sample.power_default_limit_watts, state.default_watts)
            state.min_watts = _known(sample.power_min_limit_watts, state.min_watts)
            state.max_watts = _known(sample.power_max_limit_watts, state.max_watts)
        return state

    def _decide(self, state: _GpuState, sample: GpuSample, now: float) -> None:
        temperature = sample.temperature_celsius
        if sample.lost or temperature is None:
            state.above_since = state.below_since = None
            return
        state.temperature_celsius = temperature
        throttle_at, release_at = effective_thresholds(
            self._settings, sample.slowdown_temperature_celsius
        )
        if temperature >= throttle_at:
            state.below_since = None
            state.above_since = now if state.above_since is None else state.above_since
        elif temperature < release_at:
            state.above_since = None
            state.below_since = now if state.below_since is None else state.below_since
            state.noop_logged = False
        else:
            state.above_since = state.below_since = None
        hold = float(self._settings.hold)
        if state.above_since is not None and now - state.above_since >= hold:
            self._guard_cap(state, temperature, throttle_at)
        elif (
            state.below_since is not None
            and now - state.below_since >= hold
            and state.cap is not None
            and state.cap.owner == "guard"
        ):
            why = f"below {release_at:g} °C for {hold:g} s, now {temperature:.1f} °C"
            self._release(state, why, dry_run=state.cap.dry_run, now=False)

    def _guard_cap(self, state: _GpuState, temperature: float, throttle_at: float) -> None:
        base = state.default_watts if state.default_watts is not None else state.limit_watts
        if base is None:
            if not state.noop_logged:
                state.noop_logged = True
                log.error("GPU %d is hot (%.1f °C) but its power limits are unknown: "
                          "cannot cap it", state.index, temperature, extra={"gpu": state.index})
            return
        target = self._clamp(state, self._settings.power_cap * base)
        saved = self._saved.get(state.index)
        original = saved if saved is not None else state.limit_watts
        if state.cap is not None and state.cap.watts <= target + _WATTS_EPSILON:
            return
        if state.cap is None and original is not None and original <= target + _WATTS_EPSILON:
            if not state.noop_logged:
                state.noop_logged = True
                log.warning("GPU %d is hot (%.1f °C) but its limit %.0f W is already at or "
                            "below the guard's cap %.0f W", state.index, temperature, original,
                            target, extra={"gpu": state.index})
            return
        hold = float(self._settings.hold)
        reason = f"{temperature:.1f} °C, at or above {throttle_at:g} °C for {hold:g} s"
        self._apply(state, target, "guard", reason, dry_run=self._settings.mode == "dry-run",
                    now=False)

    # ---------------------------------------------------------------- commands

    def apply_cap(
        self, gpu: int, watts: float, reason: str, *, dry_run: bool = False
    ) -> CapOutcome:
        """Cap ``gpu`` at ``watts`` for the controller; the original limit is saved first.

        ``dry_run`` (the command's) only reports what would be done and changes no state,
        so a dry-run command never stops the guard from acting. Unlike the guard's own
        caps, a refused set is not retried: the outcome says so and the controller decides.
        """
        with self._lock:
            state = self._gpus.get(gpu)
            if state is None or state.limit_watts is None:
                return CapOutcome(False, f"GPU {gpu} is not present on this node")
            target = self._clamp(state, watts)
            if dry_run and self._settings.mode != "dry-run":
                return CapOutcome(True, f"would cap GPU {gpu} to {target:.0f} W", dry_run=True)
            previous = state.cap
            ok = self._apply(state, target, "controller", reason,
                             dry_run=self._settings.mode == "dry-run")
            if not ok:
                state.cap = previous
                if not state.dirty and state.cap is None:
                    self._saved.forget(state.index)
                return CapOutcome(False, f"cannot cap GPU {gpu} to {target:.0f} W: "
                                         f"{state.last_error or 'power limits unknown'}")
            dry = state.cap is not None and state.cap.dry_run
            verb = "would cap" if dry else "capped"
            return CapOutcome(True, f"{verb} GPU {gpu} to {target:.0f} W", dry_run=dry)

    def release(self, gpu: int, reason: str, *, dry_run: bool = False) -> CapOutcome:
        """Restore ``gpu``'s original limit, whoever capped it."""
        with self._lock:
            state = self._gpus.get(gpu)
            if state is None:
                return CapOutcome(False, f"GPU {gpu} is not present on this node")
            if state.cap is None and not state.dirty:
                return CapOutcome(True, f"GPU {gpu} was not capped", dry_run=dry_run)
            if dry_run and self._settings.mode != "dry-run":
                return CapOutcome(True, f"would restore GPU {gpu}'s power limit", dry_run=True)
            was_dry = state.cap is not None and state.cap.dry_run
            ok = self._release(state, reason, dry_run=was_dry)
            if not ok:
                return CapOutcome(False, f"cannot restore GPU {gpu}'s power limit yet "
                                         "(retrying every cycle)")
            verb = "would restore" if was_dry else "restored"
            return CapOutcome(True, f"{verb} GPU {gpu}'s power limit", dry_run=was_dry)

    # ---------------------------------------------------------------- start and stop

    def recover(self) -> list[Event]:
        """At start: put back every limit a previous run saved, then clear the file.

        A restore the driver refuses stays in the file and is retried every cycle.
        """
        with self._lock:
            saved = self._saved.load()
            if not saved:
                return []
            log.warning("guard state from a previous run holds %d saved power limits: "
                        "restoring them", len(saved))
            for gpu, watts in saved.items():
                self._saved.adopt(gpu, watts)
                state = self._state(gpu)
                state.dirty = True
                state.cap = None
                state.why = "left by a previous agent run"
                self._converge(state)
            events, self._outbox = self._outbox, []
            return events

    def restore_all(self) -> list[Event]:
        """At stop: restore every changed limit (call before NVML is shut down)."""
        with self._lock:
            for state in self._gpus.values():
                if state.cap is not None and state.cap.dry_run:
                    log.info("dry-run: would restore GPU %d's power limit (agent stopping)",
                             state.index, extra={"gpu": state.index})
                    state.cap = None
                elif state.cap is not None or state.dirty:
                    state.cap = None
                    state.why = "agent stopping"
                    self._converge(state)
            events, self._outbox = self._outbox, []
            return events

    # ---------------------------------------------------------------- mechanics

    def _state(self, gpu: int) -> _GpuState:
        state = self._gpus.get(gpu)
        if state is None:
            state = self._gpus[gpu] = _GpuState(gpu)
        return state

    @staticmethod
    def _clamp(state: _GpuState, watts: float) -> float:
        if state.max_watts is not None:
            watts = min(watts, state.max_watts)
        if state.min_watts is not None:
            watts = max(watts, state.min_watts)
        return round(watts, 3)  # NVML takes whole milliwatts

    def _apply(self, state: _GpuState, watts: float, owner: Owner, reason: str, *,
               dry_run: bool, now: bool = True) -> bool:
        """Want ``watts`` on ``state``'s GPU; with ``now``, set it now and say if it took.

        :meth:`observe` passes ``now=False``: its own pass over every GPU sets it, once.
        """
        if dry_run:
            state.cap = Cap(watts, owner, reason, dry_run=True)
            self._event(state, f"dry-run: would cap GPU {state.index} power limit to "
                               f"{watts:.0f} W ({owner}: {reason})")
            return True
        state.cap = Cap(watts, owner, reason)
        return self._converge(state) if now else True

    def _release(self, state: _GpuState, reason: str, *, dry_run: bool, now: bool = True) -> bool:
        if dry_run:
            state.cap = None
            self._event(state, f"dry-run: would restore GPU {state.index}'s power limit "
                               f"({reason})")
            return True
        state.cap = None
        state.why = reason
        return self._converge(state) if now else True

    def _converge(self, state: _GpuState) -> bool:
        """Bring the GPU's limit to what is wanted; True when it is there."""
        cap = state.cap
        if cap is not None and cap.dry_run:
            return True
        if cap is not None:
            if state.applied_watts is not None and abs(state.applied_watts - cap.watts) < 1e-6:
                return True
            original = self._saved.get(state.index)
            if original is None:
                if state.limit_watts is None:
                    return False
                original = state.limit_watts
                self._saved.save(state.index, original)
            if not self._call(state, cap.watts, f"cap to {cap.watts:.0f} W"):
                return False
            state.applied_watts = cap.watts
            state.dirty = True
            self._event(state, f"capped GPU {state.index} power limit {original:.0f} W -> "
                               f"{cap.watts:.0f} W ({cap.owner}: {cap.reason})")
            return True
        if not state.dirty:
            if state.index in self._saved:  # saved, but the change never took
                self._saved.forget(state.index)
            return True
        saved = self._saved.get(state.index)
        if saved is None:  # nothing to restore to; cannot happen by construction
            state.dirty = False
            state.applied_watts = None
            return True
        if not self._call(state, saved, f"restore {saved:.0f} W"):
            return False
        state.applied_watts = None
        state.dirty = False
        self._saved.forget(state.index)
        self._event(state, f"restored GPU {state.index} power limit to {saved:.0f} W"
                           + (f" ({state.why})" if state.why else ""))
        return True

    def _call(self, state: _GpuState, watts: float, what: str) -> bool:
        error: str | None = None
        if self._nvml_stuck is not None:  # the call would hang this thread too
            error = (f"NVML is not answering (the nvml collector has been stuck for "
                     f"{self._nvml_stuck.duration_seconds:.0f} s): not calling it")
        else:
            try:
                self._set(state.index, watts)
            except NvmlError as err:
                error = str(err)
        if error is not None:
            state.last_error = error
            if not state.failing:
                state.failing = True
                log.error("guard cannot %s on GPU %d: %s (retrying every cycle)", what,
                          state.index, error, extra={"gpu": state.index})
                self._event(state, f"guard cannot {what} on GPU {state.index}: {error}")
            else:
                log.debug("guard still cannot %s on GPU %d: %s", what, state.index, error,
                          extra={"gpu": state.index})
            return False
        state.last_error = None
        if state.failing:
            state.failing = False
            log.info("guard could %s on GPU %d after earlier failures", what, state.index,
                     extra={"gpu": state.index})
        return True

    def _event(self, state: _GpuState, message: str) -> None:
        log.warning("%s", message, extra={"gpu": state.index})
        self._outbox.append(
            Event(kind="guard", source="agent", time_seconds=self._clock.time(),
                  message=message, gpu=state.index, pci_bus_id=state.pci_bus_id, code=None)
        )


def _known(value: float | None, previous: float | None) -> float | None:
    return previous if value is None else value
