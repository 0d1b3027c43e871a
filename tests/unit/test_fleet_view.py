"""The fleet view's merge and its settings, without controllers (the HTTP side is
tests/integration/test_fleet.py)."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError
from sn_monitor.fleet.settings import FleetSettings, SupernodeSettings, load_fleet_settings
from sn_monitor.fleet.view import Controllers, FleetView, SupernodeUnreachable, node_states
from tests.drivers.servers import RecordingHTTPServer, Reply


def _settings(*names: str) -> FleetSettings:
    return FleetSettings(supernodes=[SupernodeSettings(name=n, controllers=[f"http://{n}:9848"])
                                     for n in names], cache=1.0)  # type: ignore[arg-type]


class Answers:
    """What each supernode answers: a document, or an exception to raise."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, str, dict[str, str]]] = []

    def __call__(self, supernode: SupernodeSettings, path: str,
                 params: Mapping[str, str]) -> tuple[str, Any]:
        self.asked.append((supernode.name, path, dict(params)))
        answer = self.answers[supernode.name]
        if isinstance(answer, Exception):
            raise answer
        return supernode.controllers[0], answer


def test_nodes_are_merged_and_tagged_with_their_supernode() -> None:
    fetch = Answers({"sn0": {"nodes": [{"name": "a", "state": "healthy"}]},
                     "sn1": {"nodes": [{"name": "a", "state": "lost"},
                                       {"name": "b", "state": "healthy"}]}})
    view = FleetView(_settings("sn0", "sn1"), ManualClock(), fetch)
    try:
        answer = view.nodes()
    finally:
        view.close()
    assert [(n["supernode"], n["name"]) for n in answer.items] == [
        ("sn0", "a"), ("sn1", "a"), ("sn1", "b")]  # one name in two supernodes: two nodes
    assert answer.partial is False
    assert node_states(answer) == {("sn0", "healthy"): 1, ("sn1", "lost"): 1,
                                   ("sn1", "healthy"): 1}
    doc = answer.document("nodes")
    assert [s["items"] for s in doc["supernodes"]] == [1, 2]


def test_a_supernode_that_does_not_answer_makes_the_view_partial() -> None:
    fetch = Answers({"sn0": {"nodes": [{"name": "a"}]},
                     "sn1": SupernodeUnreachable("http://sn1:9848: unreachable"),
                     "sn2": {"unexpected": True}})
    view = FleetView(_settings("sn0", "sn1", "sn2"), ManualClock(), fetch)
    try:
        answer = view.nodes()
    finally:
        view.close()
    assert answer.partial is True
    assert [n["name"] for n in answer.items] == ["a"]
    status = {s.name: s for s in answer.supernodes}
    assert status["sn1"].error == "http://sn1:9848: unreachable"
    assert status["sn2"].error is not None
    assert "no 'nodes' list" in status["sn2"].error


def test_answers_are_reused_for_the_cache_time() -> None:
    clock = ManualClock()
    fetch = Answers({"sn0": {"incidents": []}})
    view = FleetView(_settings("sn0"), clock, fetch)
    try:
        view.incidents("open")
        view.incidents("open")
        assert len(fetch.asked) == 1
        view.incidents(None)  # another question: asked
        assert len(fetch.asked) == 2
        clock.advance(1.5)
        view.incidents("open")
        assert len(fetch.asked) == 3
    finally:
        view.close()
    assert fetch.asked[0] == ("sn0", "/api/v1/incidents", {"status": "open"})


@pytest.mark.parametrize(("text", "fragment"), [
    ("supernodes: []\n", "supernodes: at least one supernode"),
    ("supernodes:\n- name: sn0\n  controllers: [http://a:1]\n- name: sn0\n"
     "  controllers: [http://b:1]\n", "sn0 given twice"),
    ("supernodes:\n- name: sn0\n  controllers: []\n", "at least one controller URL"),
    ("supernodes:\n- name: sn0\n  controllers: [ftp://a]\n", "http:// or https://"),
    ("supernodes:\n- name: Bad Name\n  controllers: [http://a:1]\n", "lower-case"),
    ("supernodes:\n- name: sn0\n  controllers: [http://a:1]\ntimeout: soon\n", "timeout"),
])
def test_a_bad_fleet_file_names_the_file_the_key_and_the_line(
        tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_fleet_settings(path)
    message = str(info.value)
    assert message.startswith(str(path))
    assert ":" in message.split(str(path), 1)[1][:4]  # file:line
    assert fragment in message


# ---------------------------------------------------------------- asking over HTTP


@pytest.fixture
def controllers() -> Iterator[list[RecordingHTTPServer]]:
    """A standby, a failing controller, a garbled answer and an active controller."""
    replies = [Reply(503, b"{}", {"X-SN-Controller-Role": "standby"}), Reply(500, b"oops"),
               Reply(200, b"not json"),
               Reply(200, b'{"nodes": [{"name": "a"}]}', {"Content-Type": "application/json"})]
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(RecordingHTTPServer(reply)) for reply in replies]


def test_a_standby_a_failing_controller_and_a_garbled_answer_pass_to_the_next(
        controllers: list[RecordingHTTPServer]) -> None:
    active = controllers[-1]
    supernode = SupernodeSettings(name="sn0", controllers=[s.url for s in controllers])
    asking = Controllers(5.0, {"sn0": "secret"})
    try:
        answered_by, doc = asking.get(supernode, "/api/v1/nodes", {"status": "open"})
    finally:
        asking.close()
    assert answered_by == active.url
    assert doc == {"nodes": [{"name": "a"}]}
    for server in controllers:  # each asked once, with the supernode's token
        [call] = server.requests
        assert (call.path, call.query) == ("/api/v1/nodes", {"status": ["open"]})
        assert call.header("Authorization") == "Bearer secret"


def test_when_no_controller_answers_each_reason_is_said(
        controllers: list[RecordingHTTPServer]) -> None:
    standby, failing, garbled, _ = controllers
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{unused.getsockname()[1]}"  # nothing listens there
    supernode = SupernodeSettings(
        name="sn0", controllers=[standby.url, failing.url, garbled.url, gone])
    asking = Controllers(5.0, {})
    try:
        with pytest.raises(SupernodeUnreachable) as info:
            asking.get(supernode, "/api/v1/nodes", {})
    finally:
        asking.close()
    assert str(info.value) == "; ".join([
        f"{standby.url}: standby", f"{failing.url}: answered 500",
        f"{garbled.url}: the answer is not JSON", f"{gone}: unreachable (connection refused)"])
    assert standby.requests[0].header("Authorization") is None  # no token configured


# ---------------------------------------------------------------- the command's failures


def test_the_command_refuses_a_bad_file_a_token_it_cannot_read_and_a_busy_port(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sn_monitor.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("supernodes:\n- name: sn0\n  controllers: [ftp://a]\n")
    assert main(["fleet", "--config", str(bad)]) == 2
    assert f"{bad}:3:" in capsys.readouterr().err

    no_token = tmp_path / "no-token.yaml"
    no_token.write_text("supernodes:\n- name: sn0\n  controllers: [http://127.0.0.1:1]\n"
                        f"  token_file: {tmp_path / 'missing.token'}\n")
    assert main(["fleet", "--config", str(no_token)]) == 2
    err = capsys.readouterr().err
    assert "missing.token" in err
    assert "Traceback" not in err

    good = tmp_path / "fleet.yaml"
    good.write_text("supernodes:\n- name: sn0\n  controllers: [http://127.0.0.1:1]\n")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # the command sets up logging: put back
    try:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            assert main(["fleet", "--config", str(good), "--listen", f"127.0.0.1:{port}"]) == 2
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
