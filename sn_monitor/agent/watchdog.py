"""The collectors' calls, made off the sampling thread: one that never returns stalls nothing.

A driver can wedge: an NVML call then blocks in the kernel and never returns, and an
agent that made it on its sampling thread would stop sampling, guarding and reporting
while its last values still look healthy. Python cannot interrupt a thread blocked in a
C call, so the calls are made where a hang does no harm: a :class:`CollectorRunner`
thread makes a cycle's ``collect()`` calls one after another (collectors are Python:
side by side they only fight for the GIL, 2.4x the CPU per sample), and the sampling
thread waits for the whole line at once. A cycle thus costs one handoff between the two
threads, not one per collector (each handoff, a notify and a thread waking, costs about
0.1 ms of CPU: measured with ``bench.agent_bench``).

Each call has a deadline, which runs from its turn: from when the line was handed over
(the first call), or from when the call before it returned. A call still running past
its deadline is *stuck*: the sampling thread stops waiting for it, its runner is
abandoned to it (the calls behind it are taken back; the runner ends once the stuck call
returns, taking no further work), and the rest of the line goes to a fresh runner. A
stuck collector gets no second call while the first hangs; the first cycle after that
call returns takes its late :class:`CallOutcome` and calls the collector again.

:meth:`CollectorWatchdog.close` stops the idle runner and closes the collectors on the
calling thread; a stuck collector is left to its abandoned runner, which closes it once
its call returns: a collector is never closed under a running call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sn_monitor.agent.collectors.base import Collector
from sn_monitor.agent.snapshot import Collected
from sn_monitor.clock import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """How one ``collect()`` call ended: what it returned, or what it raised.

    ``started`` and ``duration_seconds`` are on the injected clock's monotonic time.
    """

    collected: Collected | None
    error: Exception | None
    started: float
    duration_seconds: float


class Call:
    """One ``collect()`` asked of a collector: its deadline, and how it ended once it has.

    ``deadline`` is in real seconds from the call's turn; ``started`` is on the clock,
    set when the runner begins the call.
    """

    __slots__ = ("collector", "deadline", "outcome", "started")

    def __init__(self, collector: Collector, deadline: float) -> None:
        self.collector = collector
        self.deadline = deadline
        self.started: float | None = None
        self.outcome: CallOutcome | None = None


@dataclass(frozen=True, slots=True)
class Overrun:
    """A call past its deadline, and the calls behind it in the line that were not made."""

    stuck: Call
    not_made: list[Call]


class CollectorRunner:
    """One thread (``agent-collect``) that makes the calls it is handed, in order.

    The thread starts with the first line handed over and ends at :meth:`stop`, or, once
    abandoned to a stuck call, when that call returns (closing the collector then if
    :meth:`close_when_returned` asked it to).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._line: deque[Call] = deque()
        self._turn = 0.0  # real time at which the head of the line got its turn
        self._stuck: Call | None = None
        self._close_after = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def run(self, calls: Sequence[Call]) -> Overrun | None:
        """Make ``calls`` in order and wait for them: None once all have returned.

        When one runs past its deadline, the wait ends there: this runner is abandoned
        to that call, and the :class:`Overrun` names it and the calls not made.
        """
        with self._cond:
            if self._stuck is not None or self._stopping:
                raise RuntimeError("the collector runner takes no more calls")
            self._line.extend(calls)
            self._turn = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="agent-collect",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
            while self._line:
                head = self._line[0]
                left = self._turn + head.deadline - time.monotonic()
                if left <= 0:
                    return self._abandon_to(head)
                self._cond.wait(left)
        return None

    def late_outcome(self) -> CallOutcome | None:
        """The outcome of the stuck call this runner was abandoned to, once it returned."""
        with self._cond:
            return None if self._stuck is None else self._stuck.outcome

    def close_when_returned(self) -> bool:
        """Have the stuck call's collector closed here once the call returns.

        True: it will be; False: the call has returned already (close it yourself).
        """
        with self._cond:
            if self._stuck is None or self._stuck.outcome is not None:
                return False
            self._close_after = True
            return True

    def stop(self, timeout: float) -> bool:
        """End the thread once its line is done; True when it has ended within ``timeout``."""
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify_all()
        if thread is None:
            return True
        thread.join(max(0.0, timeout))
        return not thread.is_alive()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` real seconds for an abandoned runner to end."""
        thread = self._thread
        if thread is not None:
            thread.join(max(0.0, timeout))
        return self.late_outcome() is not None

    def _abandon_to(self, head: Call) -> Overrun:
        """Take back the calls behind ``head``; the thread ends once ``head`` returns."""
        not_made = list(self._line)[1:]
        self._line = deque([head])
        self._stuck = head
        if self._thread is not None:
            self._thread.name = f"agent-collect-stuck-{head.collector.name}"
        return Overrun(head, not_made)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._line and not self._stopping:
                    self._cond.wait()
                if not self._line:
                    return
                call = self._line[0]
            outcome = self._make(call)
            with self._cond:
                call.outcome = outcome  # with the pop: a call is done once it is off the line
                self._line.popleft()
                self._turn = time.monotonic()
                if self._stuck is not None:
                    close = self._close_after
                    break
                if not self._line:
                    self._cond.notify_all()
        if close:
            close_collector(call.collector)

    def _make(self, call: Call) -> CallOutcome:
        started = self._clock.monotonic()
        call.started = started
        collected: Collected | None = None
        error: Exception | None = None
        try:
            collected = call.collector.collect()
        except Exception as err:  # noqa: BLE001 - handed to the sampler, which logs it
            error = err
        return CallOutcome(collected, error, started, max(0.0, self._clock.monotonic() - started))


def close_collector(collector: Collector) -> None:
    """Close one collector; a failure to is logged, not raised."""
    try:
        collector.close()
    except OSError as err:
        log.warning("close failed: %s", err, extra={"collector": collector.name})


@dataclass(frozen=True, slots=True)
class CycleCalls:
    """One cycle's calls: those that returned in time, those stuck, those back late.

    ``returned`` maps each collector called and answered this cycle to its outcome;
    ``stuck`` each collector whose call runs past its deadline to when that call started
    (on the clock; None if the runner had not begun it); ``late`` holds the outcomes of
    stuck calls that have returned since the last cycle.
    """

    returned: dict[str, CallOutcome]
    stuck: dict[str, float | None]
    late: list[tuple[str, CallOutcome]]


class CollectorWatchdog:
    """Calls every collector once a cycle, each up to its deadline, on runner threads.

    ``deadlines`` are in real seconds, one for each collector's name.
    """

    def __init__(self, collectors: Sequence[Collector], clock: Clock,
                 deadlines: Mapping[str, float]) -> None:
        self._collectors = list(collectors)
        self._clock = clock
        self._deadlines = dict(deadlines)
        self._runner: CollectorRunner | None = None
        self._hung: dict[str, tuple[CollectorRunner, Call]] = {}
        self._closed = False

    def cycle(self) -> CycleCalls:
        """Call each collector not stuck, in order; return once each returned or is stuck."""
        if self._closed:
            raise RuntimeError("the collectors are closed")
        late: list[tuple[str, CallOutcome]] = []
        calls: list[Call] = []
        for collector in self._collectors:
            hung = self._hung.get(collector.name)
            if hung is not None:
                outcome = hung[0].late_outcome()
                if outcome is None:
                    continue  # stuck since an earlier cycle: no second call into it
                del self._hung[collector.name]
                late.append((collector.name, outcome))
            calls.append(Call(collector, self._deadlines[collector.name]))
        stuck_now = self._make(calls)
        returned: dict[str, CallOutcome] = {}
        for call in calls:
            if call not in stuck_now:
                assert call.outcome is not None  # made, and the line waited for it
                returned[call.collector.name] = call.outcome
        stuck = {name: call.started for name, (_runner, call) in self._hung.items()}
        return CycleCalls(returned, stuck, late)

    def _make(self, calls: list[Call]) -> list[Call]:
        """Hand ``calls`` to the runner, and to a fresh one past each stuck call."""
        stuck: list[Call] = []
        pending = calls
        while pending:
            runner = self._runner if self._runner is not None else CollectorRunner(self._clock)
            self._runner = runner
            overrun = runner.run(pending)
            if overrun is None:
                break
            stuck.append(overrun.stuck)
            self._hung[overrun.stuck.collector.name] = (runner, overrun.stuck)
            self._runner = None
            pending = overrun.not_made
        return stuck

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` real seconds for the stuck calls to return (True: all did)."""
        end = time.monotonic() + timeout
        return all([runner.join(end - time.monotonic()) for runner, _call in self._hung.values()])

    def close(self, timeout: float) -> list[str]:
        """Stop the runner and close every collector; return those left to close later.

        A stuck collector cannot be closed under its hung call: its runner closes it if
        the call ever returns (the thread is a daemon: it holds no process open). Once
        closed, a second call does nothing.
        """
        if self._closed:
            return []
        self._closed = True
        if self._runner is not None and not self._runner.stop(timeout):
            return [collector.name for collector in self._collectors]  # calls in flight
        left: list[str] = []
        for collector in self._collectors:
            hung = self._hung.get(collector.name)
            if hung is not None and hung[0].close_when_returned():
                left.append(collector.name)
                continue
            close_collector(collector)
        return left
