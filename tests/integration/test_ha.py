"""Two controllers on one real PostgreSQL store: one active, the other standing by.

Every process is real: two ``sn-monitor controller`` processes with the same config
(``store.backend: postgresql``, ``ha.lease: postgresql``, short lease times), simulated
agents that know both controllers, and, for the recovery test, a launcher and training
ranks (test_job_recovery_e2e's harness). The PostgreSQL server is the session's
(tests/postgres.py); each test has a fresh database.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sn_monitor.transport import ROLE_HEADER
from tests.integration.cluster import Cluster, ClusterHa, Process
from tests.support.job_recovery import (
    WAIT,
    assert_finished_without_repeating,
    cluster_with,
    start_a_slow_recovery,
)

pytestmark = pytest.mark.integration

#: Lease 4 s, renewal every 0.5 s (ClusterHa's defaults), a controller's start, slack.
TAKEOVER_WAIT = 4.0 + 0.5 + 20.0


@pytest.fixture
def pair(tmp_path: Path, pg_dsn: str) -> Iterator[Cluster]:
    with cluster_with(tmp_path, 5, ha=ClusterHa(pg_dsn)) as c:
        yield c


def standby_of(c: Cluster, active: Process) -> Process:
    return next(p for p in c.controllers if p is not active)


def test_one_is_active_the_other_stands_by_and_an_orderly_stop_hands_over(
        pair: Cluster, pg_dsn: str) -> None:
    c = pair
    c.start()
    active = c.find_active()
    standby = standby_of(c, active)
    answer = requests.post(f"{c.url_of(standby)}/api/v1/reports", data=b"{}", timeout=5,
                           headers={"Authorization": f"Bearer {c.agent_token}",
                                    "Content-Type": "application/json"})
    assert answer.status_code == 503
    assert answer.headers[ROLE_HEADER] == "standby"
    health = requests.get(f"{c.url_of(standby)}/healthz", timeout=5).json()
    assert health["role"] == "standby"
    assert health["active"] is not None
    assert requests.get(f"{c.url_of(standby)}/livez", timeout=5).status_code == 200
    assert "sn_controller_leader 0.0" in requests.get(
        f"{c.url_of(standby)}/metrics", timeout=5).text
    assert "sn_controller_leader 1.0" in c.controller_metrics()
    c.wait_reporting(list(c.agents))

    # SIGTERM: the active stops, gives the lease up, and the standby takes over at once
    # (well before the 4 s lease would have expired); the agents follow it.
    assert active.kill(signal.SIGTERM) == 0
    # released, not left to expire: what lets the standby take it at once
    assert c.logs_containing("released the lease")
    assert not c.logs_containing("lease not released")
    new = c.find_active(timeout=TAKEOVER_WAIT)
    assert new is standby
    c.wait_reporting(list(c.agents), timeout=30)
    # the old one, started again, stands by
    active.start()
    c.wait_for(lambda: c._healthy(active, "/livez"), 60, "the old active alive again")
    assert requests.get(f"{c.url_of(active)}/readyz", timeout=5).status_code == 503
    assert c.find_active() is standby
    password = pg_dsn.split("password=")[1].split()[0]
    assert c.logs_containing(password) == []


def test_the_standby_takes_over_a_recovery_when_the_active_is_killed(pair: Cluster) -> None:
    # test_job_recovery_e2e (g) across two controllers: the active is SIGKILLed after
    # the launcher took the restore and before the new generation made progress; the
    # standby takes the lease once it expires, resumes the recovery from the shared
    # store, and no action runs twice.
    c = pair
    c.start()
    job, rec = start_a_slow_recovery(c)
    active = c.find_active()
    standby = standby_of(c, active)
    before = {a["key"] for a in c.actions() if a["key"].startswith(f"recovery:{rec['id']}:")}
    assert active.kill(signal.SIGKILL) == -signal.SIGKILL

    assert c.find_active(timeout=TAKEOVER_WAIT) is standby
    assert_finished_without_repeating(c, job, rec, before)


def test_a_paused_active_loses_the_lease_and_stops_acting(pair: Cluster) -> None:
    # SIGSTOP: a long GC pause, a VM frozen, a partition from the database. The standby
    # takes the expired lease; the old active, resumed, finds it taken and exits 1
    # (its supervisor restarts it as a standby); the store's fence refuses anything it
    # tried to write in between.
    c = pair
    c.start()
    c.wait_reporting(list(c.agents))
    active = c.find_active()
    standby = standby_of(c, active)
    assert active.popen is not None
    active.popen.send_signal(signal.SIGSTOP)
    try:
        assert c.find_active(timeout=TAKEOVER_WAIT) is standby
        # the new active acts: an operator cordons sim-1 through it
        c.wait_reporting(["sim-1"], timeout=30)
        reply = requests.post(f"{c.url}/api/v1/nodes/sim-1/cordon", timeout=10,
                              headers={"Authorization": f"Bearer {c.admin_token}"})
        assert reply.status_code == 202, reply.text
        c.wait_for(lambda: [a for a in c.actions(node="sim-1") if a["action"] == "cordon"
                            and a["state"] == "succeeded"], WAIT, "sim-1 cordoned")
    finally:
        active.popen.send_signal(signal.SIGCONT)
    assert active.popen.wait(timeout=30) == 1
    assert c.logs_containing("lost the lease")
    keys = [a["key"] for a in c.actions()]
    assert len(keys) == len(set(keys))
    cordons = [x for x in c.script_calls(c.evict_log) if x["SN_ACTION"] == "cordon"]
    assert [x["SN_NODE"] for x in cordons] == ["sim-1"]
