"""The checkpoint interval a replayed policy runs at: a fixed one, Daly's, or ``auto``.

A policy is named ``NAME[@INTERVAL]`` (``kubernetes@daly``, ``torchrun@5m``):

- a duration: that interval, fixed;
- ``daly``: Daly's higher-order optimum (``results.DALY_2006``, cited under the
  table) from the save cost every policy pays (the world's ``save_blocking``) and the
  policy's own MTBF: the trace's length over the interruptions it counted in a replay
  at its default interval;
- ``auto``: for sn-monitor, its advisor (the controller's own, online); for a baseline,
  the best ETTR of replays at its default and at Daly's interval times
  :data:`SEARCH_FACTORS`: what a user who tuned it on this very trace would run.

Each choice says how it was made in a note under the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

from sn_monitor.config import parse_duration_text
from sn_monitor.controller.jobs.advisor import daly
from sn_monitor.goodput.results import PolicyResult

IntervalChoice = float | Literal["daly", "auto"]
#: ``auto`` for a baseline: Daly's interval times these, each replayed.
SEARCH_FACTORS = (0.5, 0.7, 1.0, 1.4, 2.0)
#: A replay of the policy at one interval (a number of seconds, or ``auto``).
ReplayAt = Callable[[float | str], PolicyResult]


def parse_policy(text: str) -> tuple[str, IntervalChoice | None]:
    """``NAME[@INTERVAL]`` into the name and the interval (None: the policy's default).

    Raises ValueError on an interval that is neither a duration, ``daly`` nor ``auto``.
    """
    name, _, interval = text.strip().partition("@")
    if not interval:
        return name, None
    if interval in ("daly", "auto"):
        return name, interval  # type: ignore[return-value]
    seconds = parse_duration_text(interval)
    if seconds <= 0:
        raise ValueError(f"{text}: the interval must be above 0")
    return name, seconds


def at_interval(replay_at: ReplayAt, choice: IntervalChoice, *, default: float,
                save_seconds: float, duration: float, search: bool) -> PolicyResult:
    """``replay_at`` at ``choice``, with a note saying how the interval was chosen.

    ``search``: ``auto`` is the best of a search (a baseline); otherwise ``auto`` is
    passed on to the policy (sn-monitor's advisor).
    """
    if choice == "auto" and not search:
        return replay_at("auto")
    if not isinstance(choice, str):
        return replay_at(choice)
    first = replay_at(default)
    mtbf = duration / max(1, first.interruptions)
    tau = daly(save_seconds, mtbf)
    why = (f"Daly's {tau:.0f} s from the {save_seconds:g} s save and its MTBF of "
           f"{mtbf / 3600:.2f} h ({first.interruptions} interruptions at {default:.0f} s; "
           "Daly 2006)")
    if choice == "daly":
        return _noted(replay_at(tau), f"interval: {why}")
    tried = [first, *(replay_at(tau * f) for f in SEARCH_FACTORS)]
    best = max(tried, key=lambda r: r.ettr)
    seconds = ", ".join(f"{r.checkpoint_interval_seconds:.0f} s {r.ettr * 100:.2f} %"
                        for r in tried)
    return _noted(best, f"interval: the best replayed of {seconds} ({default:.0f} s, "
                        f"then {why} x {', '.join(f'{f:g}' for f in SEARCH_FACTORS)})")


def _noted(result: PolicyResult, note: str) -> PolicyResult:
    return dataclasses.replace(result, notes=[note, *result.notes])
