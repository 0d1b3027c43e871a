"""The agent process: a sampling loop on its own clock, and the HTTP endpoint.

Sampling runs under APScheduler (one job, never overlapping, late runs coalesced);
/metrics serves the latest snapshot. SIGTERM or SIGINT starts an orderly stop with a
hard deadline well below systemd's default ``TimeoutStopSec`` (90 s).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from apscheduler.schedulers.background import BackgroundScheduler

from sn_monitor.agent.collectors.base import Collector
from sn_monitor.agent.exporter import SnapshotCollector
from sn_monitor.agent.exposition import ExpositionCache
from sn_monitor.agent.sampler import Sampler
from sn_monitor.agent.server import AgentHttpServer
from sn_monitor.agent.settings import AgentSettings, parse_listen
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.clock import Clock

log = logging.getLogger(__name__)

#: Called before each sample with the seconds since the previous one (the simulator
#: advances its GPUs and counters here; a real node has none).
BeforeSample = Callable[[float], None]
#: Called after each sample with the new snapshot (the terminal view, later the reporter).
AfterSample = Callable[[NodeSnapshot], None]

STOP_DEADLINE_SECONDS = 20.0


class Agent:
    """Wires the collectors, the sampler, the exporter and the HTTP server together."""

    def __init__(
        self,
        settings: AgentSettings,
        collectors: Sequence[Collector],
        clock: Clock,
        before_sample: BeforeSample | None = None,
        after_sample: Sequence[AfterSample] = (),
    ) -> None:
        self.settings = settings
        self._clock = clock
        self.sampler = Sampler(settings.node, collectors, clock)
        self.exporter = SnapshotCollector(lambda: self.sampler.latest)
        self.exposition = ExpositionCache(self.exporter, lambda: self.sampler.latest)
        self._before = before_sample
        self._after = list(after_sample)
        self._last_tick: float | None = None
        self._scheduler = BackgroundScheduler(daemon=True)
        self._stopped = threading.Event()
        host, port = parse_listen(settings.listen)
        self.http = AgentHttpServer(
            host, port, self.exposition, lambda: self.sampler.latest, clock,
            max_age=max(3 * settings.interval, 5.0),
        )

    def tick(self) -> NodeSnapshot:
        """One cycle: advance the simulation if any, sample, hand the snapshot on."""
        now = self._clock.monotonic()
        elapsed = self.settings.interval if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        if self._before is not None:
            self._before(elapsed)
        snapshot = self.sampler.sample()
        for hook in self._after:
            hook(snapshot)
        return snapshot

    def _tick_logged(self) -> None:
        try:
            self.tick()
        except Exception:  # the loop must survive a bad cycle; it is logged
            log.exception("sampling cycle failed", extra={"node": self.settings.node})

    def start(self) -> None:
        """Take the first sample, then serve and sample every ``interval``."""
        self.tick()
        self.http.start()
        self._scheduler.add_job(
            self._tick_logged, "interval", seconds=self.settings.interval,
            id="sample", max_instances=1, coalesce=True, misfire_grace_time=None,
        )
        self._scheduler.start()
        log.info("agent serving on %s, sampling every %ss", self.settings.listen,
                 self.settings.interval, extra={"node": self.settings.node})

    def stop(self) -> None:
        """Stop sampling, stop serving, close the collectors (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        self.http.stop()
        self.sampler.close()
        log.info("agent stopped", extra={"node": self.settings.node})

    def run_until_signalled(self, duration: float | None = None) -> None:
        """Run until SIGTERM/SIGINT (or ``duration`` seconds), then stop in order."""
        done = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            del frame
            log.info("received %s, stopping", signal.Signals(signum).name)
            done.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            done.wait(timeout=duration)
        finally:
            stopper = threading.Thread(target=self.stop, name="agent-stop", daemon=True)
            stopper.start()
            stopper.join(timeout=STOP_DEADLINE_SECONDS)
            if stopper.is_alive():
                log.error("agent did not stop within %ss", STOP_DEADLINE_SECONDS)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
