"""``sn-monitor controller`` refusing to start: a clear line and an exit status, never a
traceback or a secret, when its store's connection string or server is wrong."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.postgres import PostgresServer
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

SECRET = "s3cret-do-not-print"


def start(tmp: Path, store: dict[str, str], env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    config = tmp / "controller.yaml"
    config.write_text(yaml.safe_dump({"store": store}))
    environ = {k: v for k, v in os.environ.items() if k != "SN_STORE_DSN"}
    done = subprocess.run(
        [sys.executable, "-m", "sn_monitor.cli", "controller", "--config", str(config),
         "--listen", f"127.0.0.1:{free_port()}", "--rules", str(ROOT / "sn_monitor" / "rules"),
         "--state-dir", str(tmp / "state")],
        cwd=ROOT, env={**environ, **(env or {})}, capture_output=True, text=True,
        timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert SECRET not in done.stderr + done.stdout
    return done


def test_a_missing_or_empty_dsn_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.dsn"
    done = start(tmp_path, {"backend": "postgresql", "dsn_file": str(missing)})
    assert done.returncode == 2
    assert f"store.dsn_file: cannot read {missing}" in done.stderr
    empty = tmp_path / "empty.dsn"
    empty.write_text("\n")
    done = start(tmp_path, {"backend": "postgresql", "dsn_file": str(empty)})
    assert done.returncode == 2
    assert f"{empty} is empty" in done.stderr


def test_no_dsn_at_all_names_both_places(tmp_path: Path) -> None:
    done = start(tmp_path, {"backend": "postgresql"})
    assert done.returncode == 2
    assert "dsn_file or $SN_STORE_DSN" in done.stderr


def test_an_unreachable_server_exits_1_naming_it_without_the_password(tmp_path: Path
                                                                       ) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"host=127.0.0.1 port={port} dbname=sn user=sn password={SECRET}"
    done = start(tmp_path, {"backend": "postgresql"}, env={"SN_STORE_DSN": dsn})
    assert done.returncode == 1
    assert f"postgresql://sn@127.0.0.1:{port}/sn" in done.stderr


def test_a_malformed_connection_string_is_not_echoed(tmp_path: Path) -> None:
    dsn_file = tmp_path / "store.dsn"
    dsn_file.write_text(f"host=127.0.0.1 password={SECRET} port")
    done = start(tmp_path, {"backend": "postgresql", "dsn_file": str(dsn_file)})
    assert done.returncode == 1
    assert "connection string is not valid" in done.stderr


def test_a_wrong_password_exits_1(tmp_path: Path, postgres_server: PostgresServer,
                                  pg_dsn: str) -> None:
    wrong = pg_dsn.replace(f"password={postgres_server.password}", f"password={SECRET}")
    assert wrong != pg_dsn
    done = start(tmp_path, {"backend": "postgresql"}, env={"SN_STORE_DSN": wrong})
    assert done.returncode == 1
    assert "password authentication failed" in done.stderr
    assert postgres_server.password not in done.stderr


def _controller(tmp: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "sn_monitor.cli", "controller", "--state-dir",
            str(tmp / "state"), *args]


def test_a_rules_directory_without_rule_files_is_refused_naming_what_is_there(
        tmp_path: Path) -> None:
    old = tmp_path / "rules"  # the old rules/ path: only Prometheus' files are left there
    (old / "prometheus").mkdir(parents=True)
    (old / "sn-monitor-alerts.yml").write_text("groups: []\n")
    listen = f"127.0.0.1:{free_port()}"
    done = subprocess.run(_controller(tmp_path, "--listen", listen, "--rules", str(old)),
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"{old}: no rule files (*.yaml) in this directory: found 2 other files (prometheus, "
        "sn-monitor-alerts.yml); rule files must end in .yaml")
    done = subprocess.run(_controller(tmp_path, "--listen", listen, "--rules",
                                      str(tmp_path / "typo")),
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"{tmp_path / 'typo'}: rules path does not exist"


def test_rules_asked_for_empty_start_and_say_so_in_the_metrics(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "controller.yaml"
    config.write_text("rules: []\n")
    log = tmp_path / "controller.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(_controller(tmp_path, "--config", str(config), "--listen",
                                            f"127.0.0.1:{port}"),
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        body = ""
        deadline = time.monotonic() + 60
        while 'sn_controller_rules{source="config"}' not in body:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as answer:
                    body = answer.read().decode()
            except OSError:
                time.sleep(0.2)
        assert 'sn_controller_rules{source="config"} 0.0' in body.splitlines()
        assert "no rules: the config says rules: []" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
