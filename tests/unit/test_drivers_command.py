"""The command driver (and job control through it) with real child processes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from sn_monitor.controller.actions.base import PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.command import CommandDriver, CommandSettings
from sn_monitor.controller.actions.drivers.job_control import JobControlDriver
from sn_monitor.controller.audit import ActionRequest
from tests.drivers.servers import wait_until


def act(action: str = "evict", **params: object) -> ActionRequest:
    return ActionRequest(id="act-9", key="k", action=action,  # type: ignore[arg-type]
                         node="gpu-node-017", reason="XID 79\non GPU 3", rule="fatal-xid",
                         gpu=3, incident_id=5, severity="critical", params=params)


def python(code: str, timeout: float = 10.0, **env: str) -> CommandDriver:
    return CommandDriver(CommandSettings(program=[sys.executable, "-c", code],
                                         timeout=timeout, env=env))  # type: ignore[arg-type]


def test_environment_and_success_message() -> None:
    code = ("import json, os; print('drained', os.environ['SN_NODE']); print('more');"
            "print(json.dumps({k: v for k, v in os.environ.items()"
            " if k.startswith('SN_') or k == 'EXTRA'}))")
    driver = python(code, EXTRA="yes")
    outcome = driver.run(act(checkpoint="/ckpt/1"))
    assert outcome.message == "drained gpu-node-017"
    assert outcome.details == {"exit_code": 0}


def test_every_variable_reaches_the_program(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    code = (f"import json, os; open({str(out)!r}, 'w').write(json.dumps("
            "{k: v for k, v in os.environ.items() if k.startswith('SN_') or k == 'EXTRA'}))")
    python(code, EXTRA="yes").run(act(checkpoint="/ckpt/1"))
    env = json.loads(out.read_text())
    assert env == {
        "SN_ACTION": "evict", "SN_NODE": "gpu-node-017", "SN_GPU": "3",
        "SN_RULE": "fatal-xid", "SN_SEVERITY": "critical", "SN_REASON": "XID 79 on GPU 3",
        "SN_ACTION_ID": "act-9", "SN_INCIDENT_ID": "5",
        "SN_PARAMS": '{"checkpoint": "/ckpt/1"}', "EXTRA": "yes",
    }


def test_exit_75_is_temporary() -> None:
    with pytest.raises(TemporaryError, match="busy"):
        python("import sys; sys.stderr.write('busy\\n'); sys.exit(75)").run(act())


def test_other_exit_codes_are_permanent_with_stderr_tail() -> None:
    code = "import sys; sys.stderr.write('x' * 5000 + ' no such node\\n'); sys.exit(1)"
    with pytest.raises(PermanentError, match=r"exited 1: x+ no such node$") as caught:
        python(code).run(act())
    assert len(str(caught.value)) < 700


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = tmp_path / "slow.sh"
    script.write_text(f"#!/bin/sh\nsleep 30 &\necho $! > {pid_file}\nwait\n")
    script.chmod(0o755)
    driver = CommandDriver(CommandSettings(program=[str(script)], timeout=0.3))  # type: ignore[arg-type]
    with pytest.raises(TemporaryError, match="process group"):
        driver.run(act())
    child = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        # A zombie not yet reaped by init still answers signal 0.
        stat = Path(f"/proc/{child}/stat")
        return stat.exists() and stat.read_text().split(") ")[1].startswith("Z")

    assert wait_until(gone, timeout=5)


def test_missing_program_is_permanent(tmp_path: Path) -> None:
    driver = CommandDriver(CommandSettings(program=[str(tmp_path / "nope")]))
    with pytest.raises(PermanentError, match="cannot run"):
        driver.run(act())


def test_killed_by_signal_is_temporary() -> None:
    with pytest.raises(TemporaryError, match="signal 9"):
        python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)").run(act())


def test_settings_need_a_program() -> None:
    from sn_monitor.config import ConfigError, bind, parse_yaml

    with pytest.raises(ConfigError, match="program"):
        bind(CommandSettings, parse_yaml("program: []\n", "c.yaml"))


def test_job_control_through_a_command(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    code = (f"import os; open({str(out)!r}, 'w').write(os.environ['SN_ACTION'] + ' '"
            " + os.environ['SN_PARAMS']); print('restored')")
    driver = JobControlDriver(command=python(code))
    outcome = driver.run(act("restore", job="trillion", checkpoint="/ckpt/900"))
    assert outcome.message == "restore: restored"
    assert out.read_text() == 'restore {"checkpoint": "/ckpt/900", "job": "trillion"}'
    assert driver.idempotent is True  # the program takes a repeated SN_ACTION_ID as done
