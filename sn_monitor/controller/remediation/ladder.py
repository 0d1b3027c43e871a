"""The remediation ladder: reset the GPU, then reboot the node, then take it out for good.

A GPU-level fault (an XID NVIDIA resolves with a reset, a GPU lost, a row remap waiting
for a reset) is not repaired by moving the job to a spare: that only gets the job going
again. The node itself is repaired rung by rung, each rung only when the one below did
not clear the fault:

1. ``reset_gpu``: the agent resets the one GPU;
2. ``reboot``: the agent runs the configured reboot command;
3. ``replace``: the node stays cordoned and a person is paged: it needs hands or an RMA.

The agent refuses a reset while a process uses the GPU, and a reboot while one uses any
GPU of the node: the ladder waits for the job's ranks to leave (the rule that started it
moves the job to a spare), asking again every ``retry_every``; work that is still there
after ``idle_wait`` is not killed: the node goes to ``replace`` (a person decides).

A rule names the first rung (``reset_gpu`` or ``reboot`` in its actions); NVIDIA's
catalogue may start it higher (XID 79 needs a reboot, not a reset); and a node repaired
at one rung that faults again within ``repeat_within`` starts one rung higher.

After a reset or a reboot the agent *verifies* the node (sn_monitor.agent.verify: every
GPU present, no remap pending, links at full width, NVLinks up, DCGM's diagnostic,
the operator's own test). Pass: the fault is cleared and the node goes back into
service (:class:`ServiceReturn`: uncordoned, back in its jobs' spare pools). Fail: the
next rung. A rule may start higher (``reboot`` in its actions), and a repeat offender
does (``escalate:``). A person lifting a cordon, or a node rebooted behind the
controller's back, gets the same check before it returns (rung ``check``).

Every rung is an action through the runner, so through the safety policy (dry-run,
max_unavailable, rate limit, cooldown, breaker) and audited before it runs. A rung the
policy holds back is asked again every ``retry_every``; a rung the policy runs only as a
dry run ends the ladder there (nothing was done, so nothing can be verified), and so
does an agent whose own remediation is a dry run (the default on real hardware until an
operator sets ``remediation.mode: enforce``): the node stays out and a person is told
what would have run. The ladders in progress are kept in the store: a controller
restart resumes them. They are written once a sweep when they changed (:meth:`persist`),
not at every change: a burst of a thousand faults would otherwise write the whole set
a thousand times, on the writer's thread, while the reports wait. An incident and the
action records of each rung are in the store before the rung runs; what a controller
killed within a sweep of a change loses is the ladder's own note of it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from sn_monitor.clock import Clock
from sn_monitor.config import Duration, positive, setting
from sn_monitor.model import CommandResult
from sn_monitor.rules.base import format_duration

log = logging.getLogger(__name__)

Rung = Literal["check", "reset_gpu", "reboot", "replace"]
#: The rungs in the order they are climbed (``check`` is verification alone).
LADDER: Final[tuple[Rung, ...]] = ("check", "reset_gpu", "reboot", "replace")
Step = Literal["acting", "waiting", "verifying", "done", "dry_run", "replace"]
#: Where a repair rests: nothing more happens to it without a new fault or a person.
RESTING: Final[frozenset[str]] = frozenset({"done", "dry_run", "replace"})
#: The rung NVIDIA's Xid catalogue asks for at least, by resolution (a reset does not
#: bring back a GPU the catalogue says needs a reboot).
CATALOGUE_RUNGS: Final[dict[str, Rung]] = {
    "RESTART_BM": "reboot", "RESTART_VM": "reboot",
    "CONTACT_SUPPORT": "replace", "CHECK_MECHANICALS": "replace",
}
#: The store key the ladders in progress are kept under.
META_KEY: Final = "remediation"
#: Repairs kept after they end (the API shows them; the oldest are dropped).
KEPT_ENDED: Final = 200


@dataclass(frozen=True)
class LadderSettings:
    """``remediation:`` in the controller's config."""

    #: Off: the rules' ``reset_gpu`` and ``reboot`` do nothing (logged); nodes return to
    #: service by hand (``POST /api/v1/jobs/J/spares/N``), as before the ladder.
    enabled: bool = True
    #: How long a GPU reset waits for the processes on the GPU to leave (the job's ranks
    #: are being moved to a spare) before the node is rebooted instead.
    idle_wait: Duration = setting(default=Duration(600.0), check=positive)
    #: How often a rung the agent refused (GPU in use) or the policy held back is asked again.
    retry_every: Duration = setting(default=Duration(30.0), check=positive)
    #: A rung or a verification the agent has not answered within this is given up as
    #: failed (the node is gone or wedged): the next rung. A reboot's answer comes after
    #: the node is back, so this bounds a reboot too.
    answer_within: Duration = setting(default=Duration(1200.0), check=positive)
    #: A node that faults again this soon after a repair passed starts one rung higher.
    repeat_within: Duration = setting(default=Duration(86400.0), check=positive)


@dataclass
class Repair:
    """One node's way up the ladder (one at a time per node)."""

    node: str
    gpu: int | None
    rung: Rung
    step: Step
    rule: str
    reason: str
    incident_id: int | None
    started: float
    since: float
    action_id: str | None = None
    attempts: int = 0
    history: list[str] = field(default_factory=list)
    #: ``check``: a person (or a reboot) asked for the check, not a fault: what fails it
    #: keeps the node out of the spare pools, but a person's uncordon is not undone.
    origin: Literal["fault", "check"] = "fault"
    #: Every incident whose fault this repair took in (the first and those that joined):
    #: their rungs are decided, so a restarted controller does not ask for them again.
    incidents: list[int] = field(default_factory=list)

    def to_doc(self) -> dict[str, Any]:
        """Its fields, the lists copied.

        Not ``dataclasses.asdict``, which deep-copies every value: ten times as slow, for
        fields that are all strings and numbers.
        """
        doc = {f.name: getattr(self, f.name) for f in _REPAIR_FIELDS}
        doc["history"] = list(self.history)
        doc["incidents"] = list(self.incidents)
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Repair:
        return cls(**doc)

    @property
    def active(self) -> bool:
        return self.step not in RESTING


_REPAIR_FIELDS: Final = dataclasses.fields(Repair)


class RemediationPorts(Protocol):
    """What the ladder asks of the controller."""

    def submit_rung(self, action: str, repair: Repair, reason: str) -> tuple[str, str]:
        """Submit ``action`` (reset_gpu, reboot, verify) for ``repair``'s node; (id, state)."""
        ...

    def return_to_service(self, repair: Repair, checks: str) -> None:
        """The node passed its check: uncordon it, give it back to its jobs' spare pools."""
        ...

    def needs_replacement(self, repair: Repair, *, cordon: bool = True) -> None:
        """The last rung: keep the node out (``cordon``) and page a person, saying why."""
        ...

    def did_nothing(self, action_id: str) -> None:
        """The agent refused the rung (work on the GPU): it holds no cooldown."""
        ...

    def load(self) -> str | None:
        """The ladders as saved (JSON), or None."""
        ...

    def save(self, text: str) -> None:
        """Save the ladders (JSON)."""
        ...


def _is_refusal_to_wait_for(result: CommandResult) -> bool:
    """The agent refused a reset or a reboot because processes use a GPU: wait, ask again."""
    return not result.ok and "in use by process" in result.message


def describe_checks(result: CommandResult) -> str:
    """The failed checks of a verification, or its message: why a node is not fit."""
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok and not c.skipped]
    return "; ".join(failed) if failed else (result.message or "no reason given")


class RemediationLadder:
    """Every node's repair in progress; see the module docstring.

    Thread-safe: faults come from the store's writer, agent results from the writer,
    timers from the sweep.
    """

    def __init__(self, settings: LadderSettings, clock: Clock, ports: RemediationPorts
                 ) -> None:
        self.settings = settings
        self._clock = clock
        self._ports = ports
        self._lock = threading.RLock()
        #: The ladders changed since they were last written (:meth:`persist`).
        self._changed = False
        self._repairs: dict[str, Repair] = {}
        self._ended: list[Repair] = []
        self._by_action: dict[str, str] = {}

    # ------------------------------------------------------------------ state

    def load(self) -> None:
        """Take the ladders a previous run left (they go on at the next sweep)."""
        text = self._ports.load()
        if not text:
            return
        try:
            doc = json.loads(text)
            repairs = [Repair.from_doc(d) for d in doc.get("active", [])]
            ended = [Repair.from_doc(d) for d in doc.get("ended", [])]
        except (ValueError, TypeError, AttributeError) as err:
            log.error("remediation: the saved ladders cannot be read (%s): starting afresh",
                      err)
            return
        with self._lock:
            self._repairs = {r.node: r for r in repairs}
            self._ended = ended[-KEPT_ENDED:]
            self._by_action = {r.action_id: r.node for r in repairs if r.action_id}

    def persist(self) -> None:
        """Write the ladders to the store if they changed since the last write."""
        with self._lock:
            if not self._changed:
                return
            doc = {"active": [r.to_doc() for r in self._repairs.values()],
                   "ended": [r.to_doc() for r in self._ended[-KEPT_ENDED:]]}
            self._changed = False
        try:
            self._ports.save(json.dumps(doc))
        except Exception:
            with self._lock:
                self._changed = True  # written at the next sweep
            raise

    def repairs(self, node: str | None = None) -> list[dict[str, Any]]:
        """The repairs in progress and the latest ended ones, newest first."""
        with self._lock:
            every = [*self._ended, *self._repairs.values()]
        return [r.to_doc() for r in sorted(every, key=lambda r: r.since, reverse=True)
                if node is None or r.node == node]

    def active(self, node: str) -> bool:
        """Whether ``node`` is being repaired (its faults are the ladder's to clear)."""
        with self._lock:
            repair = self._repairs.get(node)
            return repair is not None and repair.active

    # ------------------------------------------------------------------ starting

    def start(self, node: str, gpu: int | None, rung: Rung, *, rule: str, reason: str,
              incident_id: int | None) -> None:
        """A fault asks for ``rung`` on ``node`` (``gpu``): start, or join the repair there.

        A repair in progress on the node takes the new fault in: the higher rung of the
        two. Another GPU's fault joins it as it is: the verification after the rung
        checks the whole node, so a fault the rung did not touch fails it and the ladder
        climbs (to a reboot, which takes every GPU).
        """
        if not self.settings.enabled:
            log.info("remediation is off: not starting %s on %s (%s)", rung, node, reason,
                     extra={"node": node, "gpu": gpu, "rule": rule})
            return
        now = self._clock.time()
        with self._lock:
            current = self._repairs.get(node)
            rung, again = self._after_earlier_repair(node, rung, now)
            if again:
                reason = f"{reason} ({again})"
            if current is not None and current.active:
                climb = LADDER.index(rung) > LADDER.index(current.rung)
                if incident_id is not None:
                    current.incidents.append(incident_id)
                current.history.append(f"{_clock_text(now)} {rule}: {reason}")
                if climb and current.step in ("waiting", "acting"):
                    # the rung asked is under way or waiting: the next one replaces it
                    self._climb(current, rung, f"{rule} asks for {rung}", now)
                elif climb:
                    current.history.append(f"then {rung} if this rung does not clear it")
                self._changed = True
                return
            repair = Repair(node=node, gpu=gpu, rung=rung, step="acting", rule=rule,
                            reason=reason, incident_id=incident_id, started=now, since=now,
                            history=[f"{_clock_text(now)} {rule}: {reason}"],
                            origin="check" if rung == "check" else "fault",
                            incidents=[] if incident_id is None else [incident_id])
            if current is not None:
                self._ended.append(current)
            self._repairs[node] = repair
            log.warning("remediation of %s starts at %s: %s", node, rung, reason,
                        extra={"node": node, "gpu": gpu, "rule": rule})
            self._act(repair, now)
            self._changed = True

    def decided(self, incident_id: int) -> bool:
        """Whether a repair (in progress or ended) took in ``incident_id``'s fault."""
        with self._lock:
            return any(incident_id in r.incidents or r.incident_id == incident_id
                       for r in (*self._repairs.values(), *self._ended))

    def _after_earlier_repair(self, node: str, rung: Rung, now: float) -> tuple[Rung, str]:
        """One rung above the last repair of ``node`` that passed within repeat_within."""
        within = float(self.settings.repeat_within)
        earlier = [r for r in self._ended if r.node == node and r.step == "done"
                   and r.rung in LADDER[1:3] and now - r.since < within]
        if not earlier or rung == "check":
            return rung, ""
        last = earlier[-1]
        higher = LADDER[min(LADDER.index(last.rung) + 1, len(LADDER) - 1)]
        if LADDER.index(higher) <= LADDER.index(rung):
            return rung, ""
        return higher, (f"{last.rung} repaired it {format_duration(now - last.since)} ago: "
                        f"{higher} this time")

    def check(self, node: str, why: str) -> None:
        """Verify ``node`` before it returns to service (a person's uncordon, a reboot seen)."""
        with self._lock:
            current = self._repairs.get(node)
            if current is not None and current.active:
                return  # its ladder verifies it anyway
        self.start(node, None, "check", rule="return-to-service", reason=why,
                   incident_id=None)

    # ------------------------------------------------------------------ results

    def on_result(self, node: str, result: CommandResult) -> None:
        """An agent's answer to a rung or a verification of this ladder."""
        now = self._clock.time()
        with self._lock:
            owner = self._by_action.pop(result.id, None)
            repair = self._repairs.get(owner) if owner is not None else None
            if repair is None or repair.action_id != result.id or not repair.active:
                return
            repair.action_id = None
            if repair.step == "verifying":
                self._verified(repair, result, now)
            elif result.ok and result.dry_run:
                # the agent's remediation is in dry-run: nothing was repaired, a person does
                repair.step = "dry_run"
                repair.reason = (f"{repair.rung} is a dry run on the agent "
                                 f"({result.message})")
                repair.history.append(f"{_clock_text(now)} {repair.reason}")
                self._end(repair)
                self._ports.needs_replacement(repair, cordon=False)  # its rule took it out
            elif result.ok:
                repair.history.append(f"{_clock_text(now)} {repair.rung} done: "
                                      f"{result.message}")
                self._verify(repair, now)
            elif _is_refusal_to_wait_for(result):
                self._ports.did_nothing(result.id)
                if now - repair.started < float(self.settings.idle_wait):
                    repair.step = "waiting"
                    repair.history.append(f"{_clock_text(now)} {repair.rung} refused, "
                                          f"waiting: {result.message}")
                else:  # never reboot work away: a person decides what to do with it
                    self._climb(repair, "replace", "the node stayed in use for "
                                f"{format_duration(float(self.settings.idle_wait))}", now)
            else:
                self._climb(repair, None, f"{repair.rung} failed: {result.message}", now)
            self._changed = True

    def _verified(self, repair: Repair, result: CommandResult, now: float) -> None:
        if result.ok:
            repair.step = "done"
            repair.since = now
            checks = ", ".join(c.name for c in result.checks if c.ok) or "passed"
            repair.history.append(f"{_clock_text(now)} verified: {checks}")
            log.warning("remediation of %s: the node passed its check after %s: back into "
                        "service", repair.node, repair.rung, extra={"node": repair.node})
            self._end(repair)
            self._ports.return_to_service(repair, checks)
        else:
            self._climb(repair, None, f"failed its check: {describe_checks(result)}", now)

    # ------------------------------------------------------------------ time

    def tick(self) -> None:
        """Retry what waits, give up on what the agent never answered (the sweep)."""
        now = self._clock.time()
        with self._lock:
            changed = False
            for repair in list(self._repairs.values()):
                if not repair.active:
                    continue
                quiet = now - repair.since
                if repair.step == "waiting" and quiet >= float(self.settings.retry_every):
                    if repair.attempts and now - repair.started >= float(self.settings.idle_wait):
                        # never reboot work away: a person decides what to do with it
                        self._climb(repair, "replace", "the node stayed in use for "
                                    f"{format_duration(float(self.settings.idle_wait))}", now)
                    else:
                        self._act(repair, now)
                    changed = True
                elif (repair.step in ("acting", "verifying") and repair.action_id
                      and quiet >= float(self.settings.answer_within)):
                    self._by_action.pop(repair.action_id, None)
                    repair.action_id = None
                    self._climb(repair, None, f"no answer from the agent for "
                                f"{format_duration(quiet)}", now)
                    changed = True
            if changed:
                self._changed = True
        self.persist()

    # ------------------------------------------------------------------ moves

    def _act(self, repair: Repair, now: float) -> None:
        """Run the repair's rung (or, for ``check``, its verification)."""
        repair.since = now
        if repair.rung == "check":
            self._verify(repair, now)
            return
        if repair.rung == "replace":
            repair.step = "replace"
            repair.history.append(f"{_clock_text(now)} out of service until a person "
                                  "repairs it")
            log.critical("remediation of %s: no rung cleared the fault: it needs a person",
                         repair.node, extra={"node": repair.node})
            self._end(repair)
            self._ports.needs_replacement(repair)
            return
        repair.attempts += 1
        action_id, state = self._ports.submit_rung(repair.rung, repair, repair.reason)
        self._after_submit(repair, action_id, state, "acting", now)

    def _verify(self, repair: Repair, now: float) -> None:
        repair.since = now
        action_id, state = self._ports.submit_rung(
            "verify", repair, f"verify {repair.node} after {repair.rung}")
        self._after_submit(repair, action_id, state, "verifying", now)

    def _after_submit(self, repair: Repair, action_id: str, state: str, step: Step,
                      now: float) -> None:
        repair.step = step
        if state in ("pending", "running", "succeeded"):
            repair.action_id = action_id
            self._by_action[action_id] = repair.node
        elif state == "dry_run":
            repair.step = "dry_run"
            repair.history.append(f"{_clock_text(now)} {repair.rung}: dry run (the policy "
                                  "ran nothing, so there is nothing to verify)")
            self._end(repair)
        else:  # refused (the breaker, a limit), awaiting approval, held: ask again later
            repair.step = "waiting"
            repair.history.append(f"{_clock_text(now)} {step} {repair.rung}: {state}")

    def _climb(self, repair: Repair, to: Rung | None, why: str, now: float) -> None:
        if repair.action_id:
            self._by_action.pop(repair.action_id, None)
            repair.action_id = None
        index = LADDER.index(repair.rung)
        nxt = to if to is not None else LADDER[min(index + 1, len(LADDER) - 1)]
        if repair.rung == "check" and to is None:
            nxt = "replace"  # a check alone repairs nothing: what fails it needs a person
        repair.history.append(f"{_clock_text(now)} {why}: next {nxt}")
        log.warning("remediation of %s: %s: next rung %s", repair.node, why, nxt,
                    extra={"node": repair.node, "gpu": repair.gpu})
        repair.rung = nxt
        repair.attempts = 0
        repair.reason = why
        self._act(repair, now)

    def _end(self, repair: Repair) -> None:
        """A repair at rest stays listed (and in the store) among the ended ones."""
        if self._repairs.get(repair.node) is repair:
            del self._repairs[repair.node]
        self._ended.append(repair)
        del self._ended[:-KEPT_ENDED]


def _clock_text(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(wall))


def first_rung(asked: Rung, resolution: str | None) -> Rung:
    """The rung a ladder starts at: the one a rule asks, or the catalogue's if higher."""
    floor = CATALOGUE_RUNGS.get(resolution or "")
    return floor if floor is not None and LADDER.index(floor) > LADDER.index(asked) else asked

