"""The controller's HTTP API under test: the tokens of each role, the rules it starts with,
and ``make_api``, a controller on a temporary store behind Starlette's test client. Shared
by every test that talks to ``/api/v1`` in process, so all of them use the same tokens
and the same roles."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from sn_monitor.controller.actions.drivers.command import CommandSettings
from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.security.auth import TokenBook
from sn_monitor.controller.settings import DriverSettings
from sn_monitor.controller.storage.store import Store
from tests.support.harness import (
    HOT_RULE,
    Harness,
    make_harness,
    report_body,
    rules_from,
)

AGENT = "agent-token-0123456789abcdef"


READ = "read-token-0123456789abcdef"


OPERATE = "operate-token-0123456789abcdef"


ADMIN = "admin-token-0123456789abcdef"


MAX_BODY = 256 * 1024  # room for 1000 events, little enough to fill quickly


RULES = HOT_RULE + """
- name: ecc
  event: xid
  codes: [48]
  severity: critical
  actions: [alert, evict]
"""


#: What every client of the API sends with a body (the agent, JobClient, the CLI): the
#: test clients here send it by default too.
JSON = {"Content-Type": "application/json"}


YAML = {"Content-Type": "application/yaml"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def write_tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"""
- name: fleet-agents
  role: agent
  token: {AGENT}
  nodes: ["gpu-*"]
- name: dashboards
  role: read
  token: {READ}
- name: oncall
  role: operate
  token: {OPERATE}
- name: root
  role: admin
  token: {ADMIN}
""")
    return path


def cordon_script(tmp_path: Path) -> tuple[Path, Path]:
    """A program for the command driver: notes what it was asked, says what it did."""
    log = tmp_path / "cordon.log"
    script = tmp_path / "node-action"
    script.write_text(f"""#!/bin/sh
echo "$SN_ACTION $SN_NODE $SN_ACTION_ID" >> {log}
echo "$SN_ACTION of $SN_NODE done"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


class Api:
    """The test client, the harness behind it and the cordon script's log."""

    def __init__(self, client: TestClient, harness: Harness, log: Path) -> None:
        self.client = client
        self.h = harness
        self.log = log

    def report(self, node: str, token: str = AGENT, **kw: Any) -> Any:
        seq = self.h.sequences.get(node, 0) + 1
        self.h.sequences[node] = seq
        kw.setdefault("sample_time", self.h.clock.time())
        return self.client.post("/api/v1/reports", content=report_body(node, sequence=seq, **kw),
                                headers=bearer(token))

    def get(self, path: str, token: str = READ, **kw: Any) -> Any:
        return self.client.get(path, headers=bearer(token), **kw)

    def post(self, path: str, token: str = OPERATE, headers: dict[str, str] | None = None,
             **kw: Any) -> Any:
        return self.client.post(path, headers={**bearer(token), **(headers or {})}, **kw)


def make_api(tmp_path: Path, *, policy: PolicySettings | None = None,
             store: Store | None = None) -> tuple[Api, Harness]:
    script, log = cordon_script(tmp_path)
    drivers = DriverSettings(command=CommandSettings(program=[str(script)]))
    h = make_harness(tmp_path, rules_from(RULES), policy=policy, store=store, drivers=drivers,
                     fake=("alert", "failover"))
    app = build_app(h.controller, TokenBook.load(write_tokens(tmp_path)), MAX_BODY)
    return Api(TestClient(app, client=("10.1.2.3", 50000), headers=JSON), h, log), h
