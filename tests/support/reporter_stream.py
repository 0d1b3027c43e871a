"""An agent Reporter that talks to the controller over the report stream, built the same
way by the stream tests and the topology tests."""

from __future__ import annotations

import random
from pathlib import Path

from sn_monitor.agent.reporter import Reporter
from sn_monitor.agent.spool import EventSpool
from sn_monitor.clock import ManualClock
from tests.support.api import AGENT

NODE = "gpu-node-017"


def make_reporter(urls: str | list[str], tmp_path: Path, clock: ManualClock,
                  timeout: float = 2.0) -> Reporter:
    spool = EventSpool(tmp_path / "spool", clock=clock)
    return Reporter(urls, AGENT, NODE, {"supernode": "sn0"}, clock, spool, timeout=timeout,
                    rng=random.Random(0))
