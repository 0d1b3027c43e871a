"""The fleet view's merge and its settings, without controllers (the HTTP side is
tests/integration/test_fleet.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError
from sn_monitor.fleet.settings import FleetSettings, SupernodeSettings, load_fleet_settings
from sn_monitor.fleet.view import FleetView, SupernodeUnreachable, node_states


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
