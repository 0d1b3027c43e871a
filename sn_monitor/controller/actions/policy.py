"""The one safety policy every disruptive action goes through.

A rule that is wrong, a flapping sensor or a network partition must not be able to take
a supernode down. So before a disruptive action (see ``DISRUPTIVE``) runs, the policy
asks, in this order:

1. **Circuit breaker.** Too many distinct nodes faulted within a short window is a
   partition, a power event or a controller fault, not that many broken servers; while
   the breaker is open, actions that take capacity or move jobs (cordon, evict,
   failover, restore) are refused (held, for a job recovery's own steps) and a person is
   paged. First, because it is the global emergency stop and says the most about why.
   It closes once every node it counted is back and healthy (:meth:`note_healthy`: the
   partition healed), or when ``hold`` has passed without another trip; a person can
   close it or open it by hand (one opened by hand stays open for ``hold``).
2. **max_unavailable.** At most this many nodes (count, or percent of known nodes,
   rounded down, at least 1) out at once. A node already out counts once. Only actions
   that take a node out (cordon, evict, failover) are counted, and a recovery's own
   earlier evictions do not count against its next one (the runner leaves them out of
   the summary it passes: see ``ClusterSummary``).
3. **Rate limit.** At most N disruptive actions per window, cluster-wide.
4. **Cooldown.** The same action on the same node (and GPU, for throttle) not again
   within the cooldown: the guard against a flapping fault cordoning a node over and
   over, or a node whose GPUs fail one after another being evicted once per GPU. It is
   per action, not per node, on purpose: cordon-then-evict (a drain) and
   throttle-then-failover (a hot GPU that then dies) are normal sequences.
5. **Approval.** Actions listed under ``approval`` wait for a person. Last, so that a
   person is only asked about an action the limits would let through; the limits are
   checked again when the approval comes.

**Dry run** (global switch, or per rule) is applied *after* these checks: the verdict
is ``dry_run`` and the reason tells what would have happened ("would have run", "would
have been refused: ..."), which is what an operator trying rules on a live cluster
wants to read. Nothing is committed for a dry run.

Non-disruptive actions (alert, release, checkpoint, uncordon) always run, dry run or
not: an alert is how a dry run is watched, releasing a throttle and asking a job to
checkpoint only ever make things safer. Uncordon has its own guard (``may_uncordon``):
sn-monitor never uncordons a node it did not cordon.

The policy keeps its counters in memory, on the monotonic clock; ``remember`` and
``restore_breaker`` seed them from the store after a restart.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from sn_monitor.clock import Clock
from sn_monitor.config import Duration, at_least_one, positive, setting
from sn_monitor.controller.audit import (
    DISRUPTIVE,
    TAKES_NODE_OUT,
    ActionRequest,
    Refusal,
)
from sn_monitor.model import ActionName

#: Actions the open circuit breaker refuses.
FROZEN_BY_BREAKER: Final[frozenset[str]] = frozenset({"cordon", "evict", "failover", "restore"})

Verdict = Literal["run", "dry_run", "await_approval", "refuse"]


def _cooldown_slot(request: ActionRequest) -> tuple[str, int | None, str]:
    """The (node, gpu, action) a cooldown is kept for.

    Per GPU for throttle (two hot GPUs on one node are two throttles), per node for the
    actions that take the node out: a node whose GPU 2 and then GPU 5 fail is evicted
    (and failed over) once, not once per GPU.
    """
    gpu = None if request.action in TAKES_NODE_OUT else request.gpu
    return (request.node or "", gpu, request.action)


def parse_share(value: int | str) -> tuple[float, bool]:
    """``5`` -> (5, False); ``"10%"`` -> (10.0, True). ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError(f"expected a count or a percentage such as 10%, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"a count must be at least 1, got {value}")
        return float(value), False
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            percent = float(value.strip()[:-1])
        except ValueError:
            percent = math.nan
        if not 0 < percent <= 100:  # NaN fails this too
            raise ValueError(f"a percentage must be in (0%, 100%], got {value!r}")
        return percent, True
    raise ValueError(f"expected a count or a percentage such as 10%, got {value!r}")


def _count_or_percent(value: int | str) -> None:
    parse_share(value)


def _action_names(value: list[str]) -> None:
    known = get_args(ActionName)
    for name in value:
        if name not in known:
            raise ValueError(f"unknown action {name!r} (known: {', '.join(known)})")


def human_duration(seconds: float) -> str:
    """120 -> ``2m``, 5400 -> ``1h30m``, 0.5 -> ``0.5s``, 0.0268 -> ``0.03s``: for people.

    Under a minute: two decimals below 10 s, one below 60 s (a clock's noise is not news).
    """
    if seconds < 60:
        return f"{round(seconds, 2 if seconds < 10 else 1):g}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts)


@dataclass(frozen=True)
class RateLimitSettings:
    """At most ``actions`` disruptive actions per ``window``, cluster-wide."""

    actions: int = setting(default=10, check=at_least_one)
    window: Duration = setting(default=Duration(600.0), check=positive)


@dataclass(frozen=True)
class BreakerSettings:
    """When too many nodes fault together, stop evicting and page a person.

    The breaker opens when more than ``max_faulted`` (count, or percent of known nodes)
    distinct nodes faulted within ``window`` and at least ``min_faulted`` did (in a
    4-node cluster 20% is less than one node; one broken node is not a partition). It
    stays open until ``hold`` has passed without another trip.
    """

    enabled: bool = True
    window: Duration = setting(default=Duration(120.0), check=positive)
    max_faulted: int | str = setting(default="20%", check=_count_or_percent)
    min_faulted: int = setting(default=3, check=at_least_one)
    hold: Duration = setting(default=Duration(600.0), check=positive)


@dataclass(frozen=True)
class PolicySettings:
    """The ``policy:`` section of the controller's config. Defaults are the safe side."""

    dry_run: bool = False
    max_unavailable: int | str = setting(default="10%", check=_count_or_percent)
    rate_limit: RateLimitSettings = field(default_factory=RateLimitSettings)
    node_cooldown: Duration = setting(default=Duration(1800.0))
    approval: list[str] = setting(default_factory=list, check=_action_names)
    breaker: BreakerSettings = field(default_factory=BreakerSettings)


@dataclass(frozen=True)
class ClusterSummary:
    """What the policy needs to know about the cluster at decision time.

    ``unavailable``: nodes out of service now (cordoned, evicted, lost).
    """

    total_nodes: int
    unavailable: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Decision:
    """The policy's verdict on one request, with a reason a person can read.

    ``refusal`` says which limit refused it (code decides on it, never on ``reason``).
    """

    verdict: Verdict
    reason: str
    refusal: Refusal | None = None

    @property
    def runs(self) -> bool:
        """True when the action may run now."""
        return self.verdict == "run"


@dataclass(frozen=True)
class BreakerState:
    """The circuit breaker. ``since`` and ``until`` are wall-clock seconds (None: closed).

    ``nodes``: the nodes it counted (it closes once each is back and healthy);
    ``by_hand``: a person opened it (it then waits for ``until`` or a person).
    """

    open: bool
    reason: str = ""
    since: float | None = None
    until: float | None = None
    nodes: tuple[str, ...] = ()
    by_hand: bool = False


class SafetyPolicy:
    """Decides whether an action may run now. Thread-safe.

    ``decide`` is a pure question; ``commit`` records that an action ran (rate limit,
    cooldown). ``admit`` does both under one lock, so that two threads cannot both take
    the last free slot: callers that act should use ``admit``.
    """

    def __init__(self, settings: PolicySettings, clock: Clock) -> None:
        # Validated here as well as by the loader: settings built in code get the same checks.
        _count_or_percent(settings.max_unavailable)
        _count_or_percent(settings.breaker.max_faulted)
        _action_names(settings.approval)
        self.settings = settings
        self._clock = clock
        self._lock = threading.RLock()
        self._ran: deque[float] = deque()  # monotonic times of committed disruptive actions
        self._last_on: dict[tuple[str, int | None, str], float] = {}
        self._faults: dict[str, float] = {}  # node -> monotonic time of its last fault
        self._trip_mono: float | None = None  # last time the breaker (re)tripped
        self._open_since: float | None = None  # wall time it opened
        self._breaker_reason = ""
        #: The nodes the open breaker counted: it closes once each is back and healthy.
        self._counted: set[str] = set()
        self._by_hand = False

    # -- limits -----------------------------------------------------------------------

    def max_unavailable(self, total_nodes: int) -> int:
        """How many nodes may be out at once, for a cluster of ``total_nodes``."""
        amount, percent = parse_share(self.settings.max_unavailable)
        if not percent:
            return int(amount)
        return max(1, math.floor(total_nodes * amount / 100 + 1e-9))

    def decide(self, request: ActionRequest, cluster: ClusterSummary,
               rule_dry_run: bool = False, *, approved: bool = False) -> Decision:
        """The verdict on ``request`` now; records nothing (see ``admit``).

        ``approved``: a person approved it, so the approval step is skipped (the limits
        are not).
        """
        if request.action not in DISRUPTIVE:
            return Decision("run", f"{request.action} is not disruptive")
        with self._lock:
            inner = self._check_limits(request, cluster, approved)
        if self.settings.dry_run or rule_dry_run:
            which = "global dry run" if self.settings.dry_run else f"rule {request.rule} dry run"
            if inner.verdict == "run":
                what = "would have run"
            elif inner.verdict == "await_approval":
                what = "would have waited for approval"
            else:
                what = f"would have been refused: {inner.reason}"
            return Decision("dry_run", f"{which}: {what}")
        return inner

    def _check_limits(self, request: ActionRequest, cluster: ClusterSummary,
                      approved: bool) -> Decision:
        now = self._clock.monotonic()
        node = request.node
        if request.action in FROZEN_BY_BREAKER and self._breaker_open(now):
            return Decision("refuse", self._breaker_reason, Refusal.BREAKER)
        if request.action in TAKES_NODE_OUT and node is not None \
                and node not in cluster.unavailable:
            limit = self.max_unavailable(cluster.total_nodes)
            out = len(cluster.unavailable)
            if out + 1 > limit:
                return Decision(
                    "refuse",
                    f"max_unavailable: {out} of {cluster.total_nodes} nodes already out, "
                    f"limit {limit} ({self.settings.max_unavailable})",
                    Refusal.MAX_UNAVAILABLE)
        rate = self.settings.rate_limit
        self._prune_ran(now)
        if len(self._ran) >= rate.actions:
            free_in = self._ran[0] + rate.window - now
            return Decision(
                "refuse",
                f"rate limit: {len(self._ran)} disruptive actions in the last "
                f"{human_duration(rate.window)} (limit {rate.actions}); "
                f"next slot in {human_duration(max(free_in, 0.0))}", Refusal.RATE_LIMIT)
        if node is not None:
            slot = _cooldown_slot(request)
            last = self._last_on.get(slot)
            cooldown = self.settings.node_cooldown
            if last is not None and now - last < cooldown:
                gpu = f" gpu {slot[1]}" if slot[1] is not None else ""
                return Decision(
                    "refuse",
                    f"cooldown: {request.action} ran on {node}{gpu} "
                    f"{human_duration(now - last)} ago (cooldown {human_duration(cooldown)})",
                    Refusal.COOLDOWN)
        if request.action in self.settings.approval and not approved:
            return Decision("await_approval", f"{request.action} needs a person's approval")
        return Decision("run", "within policy limits")

    def _prune_ran(self, now: float) -> None:
        while self._ran and now - self._ran[0] >= self.settings.rate_limit.window:
            self._ran.popleft()

    def commit(self, request: ActionRequest) -> None:
        """Record that ``request`` is being run now (rate limit and cooldown)."""
        with self._lock:
            self._note_ran(request, self._clock.monotonic())

    def _note_ran(self, request: ActionRequest, mono: float) -> None:
        if request.action not in DISRUPTIVE:
            return
        self._ran.append(mono)
        # history from remember() may come in any order; keep the deque sorted
        if len(self._ran) > 1 and self._ran[-2] > mono:
            self._ran = deque(sorted(self._ran))
        if request.node is not None:
            slot = _cooldown_slot(request)
            self._last_on[slot] = max(mono, self._last_on.get(slot, mono))

    def did_nothing(self, request: ActionRequest) -> None:
        """``request`` ran, but its target refused it and changed nothing.

        An agent that would not reset a GPU in use did nothing: the attempt holds no
        cooldown, so that it can be asked again. The rate limit keeps counting it: that
        bound stays conservative.
        """
        if request.node is None:
            return
        with self._lock:
            self._last_on.pop(_cooldown_slot(request), None)

    def admit(self, request: ActionRequest, cluster: ClusterSummary,
              rule_dry_run: bool = False, *, approved: bool = False) -> Decision:
        """``decide``, and ``commit`` when the verdict is run, atomically."""
        with self._lock:
            decision = self.decide(request, cluster, rule_dry_run, approved=approved)
            if decision.runs:
                self.commit(request)
            return decision

    def remember(self, ran: Iterable[tuple[ActionRequest, float]]) -> None:
        """Seed the rate limit and cooldowns with actions that ran at the given wall times.

        After a restart, so that a controller that crashed and came back does not get a
        fresh budget: the runner feeds in the recent actions from the store.
        """
        with self._lock:
            wall, mono = self._clock.time(), self._clock.monotonic()
            for request, at_wall in ran:
                self._note_ran(request, mono - max(0.0, wall - at_wall))

    def may_uncordon(self, node: str, cordoned_by_us: bool) -> Decision:
        """Never uncordon a node sn-monitor did not cordon: a person had a reason."""
        if not cordoned_by_us:
            return Decision("refuse", f"sn-monitor did not cordon {node}; "
                                      "it stays cordoned until a person uncordons it",
                            Refusal.NOT_OURS)
        return Decision("run", f"{node} was cordoned by sn-monitor")

    # -- circuit breaker --------------------------------------------------------------

    def note_fault(self, node: str, total_nodes: int) -> BreakerState | None:
        """Note that ``node`` was lost or got a fault finding.

        Returns the breaker's state when *this* fault opened it (the controller then
        sends a critical alert), else None. A fault while it is open and still over the
        threshold extends the hold. Returning the event rather than calling a hook keeps
        the alert out of the policy's lock and makes the trip easy to test.
        """
        breaker = self.settings.breaker
        with self._lock:
            now = self._clock.monotonic()
            self._faults[node] = now
            for name, at in list(self._faults.items()):
                if now - at > breaker.window:
                    del self._faults[name]
            if self._breaker_open(now) and not self._by_hand:
                self._counted.add(node)
            if not breaker.enabled:
                return None
            faulted = len(self._faults)
            amount, percent = parse_share(breaker.max_faulted)
            threshold = total_nodes * amount / 100 if percent else amount
            if faulted <= threshold or faulted < breaker.min_faulted:
                return None
            was_open = self._breaker_open(now)
            self._trip_mono = now
            if was_open and self._by_hand:
                return None  # a person opened it: their reason stays
            self._counted |= set(self._faults)
            self._breaker_reason = (
                f"circuit breaker open: {faulted} of {total_nodes} nodes faulted "
                f"within {human_duration(breaker.window)}")
            if was_open:
                return None
            self._open_since = self._clock.time()
            return self._state(now)

    def note_healthy(self, node: str) -> bool:
        """``node`` reports again with no fault firing; True when that closed the breaker.

        It no longer counts as faulted, and once every node the open breaker counted is
        back the breaker closes: the partition (or the switch) healed, and what it froze
        may go on. A breaker opened by hand waits for its hold or a person.
        """
        with self._lock:
            self._faults.pop(node, None)
            now = self._clock.monotonic()
            if not self._breaker_open(now) or self._by_hand or node not in self._counted:
                return False
            self._counted.discard(node)
            if self._counted:
                return False
            self._close()
            return True

    def _close(self) -> None:
        self._trip_mono = None
        self._open_since = None
        self._breaker_reason = ""
        self._counted.clear()
        self._by_hand = False

    def _breaker_open(self, now: float) -> bool:
        if self._trip_mono is None:
            return False
        if now - self._trip_mono < self.settings.breaker.hold:
            return True
        self._close()
        return False

    def _state(self, now: float) -> BreakerState:
        if not self._breaker_open(now) or self._trip_mono is None:
            return BreakerState(open=False)
        until = self._clock.time() + (self._trip_mono + self.settings.breaker.hold - now)
        return BreakerState(open=True, reason=self._breaker_reason, since=self._open_since,
                            until=until, nodes=tuple(sorted(self._counted)),
                            by_hand=self._by_hand)

    def breaker_state(self) -> BreakerState:
        """Open or closed now, why, since when and until when (wall-clock seconds)."""
        with self._lock:
            return self._state(self._clock.monotonic())

    def restore_breaker(self, state: BreakerState) -> None:
        """Re-open a breaker that was open when the controller stopped (from the store)."""
        if not state.open or state.until is None:
            return
        with self._lock:
            wall, now = self._clock.time(), self._clock.monotonic()
            left = state.until - wall
            if left <= 0:
                return
            self._trip_mono = now + left - self.settings.breaker.hold
            self._open_since = state.since
            self._breaker_reason = state.reason
            self._counted = set(state.nodes)
            self._by_hand = state.by_hand

    def open_by_hand(self, reason: str) -> BreakerState:
        """A person freezes evictions for ``hold``, whatever the nodes do meanwhile."""
        with self._lock:
            now = self._clock.monotonic()
            if not self._breaker_open(now):
                self._open_since = self._clock.time()
            self._trip_mono = now
            self._by_hand = True
            self._counted.clear()
            self._breaker_reason = f"circuit breaker opened by hand: {reason}"
            return self._state(now)

    def reset_breaker(self) -> None:
        """Close the breaker now: a person has looked and says the cluster is fine."""
        with self._lock:
            self._close()
            self._faults.clear()
