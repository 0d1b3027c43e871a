"""The advisor's row checkpoints on warnings about a node, not on the application's XIDs."""

from __future__ import annotations

import pytest

from sn_monitor.config import Duration
from sn_monitor.goodput.controlled import application_rule, warning_checkpoints
from sn_monitor.goodput.noise import Noise
from sn_monitor.goodput.replay import ReplayOptions, replay
from sn_monitor.goodput.trace import Trace
from sn_monitor.goodput.world import WorldSettings
from sn_monitor.rules.spec import EventRule, ThresholdRule, load_rules, packaged_rules
from sn_monitor.rules.xid_catalog import load_catalog


def test_no_checkpoint_on_a_warning_of_the_application_s_xids() -> None:
    added = warning_checkpoints(load_rules([packaged_rules()]))
    assert added.skipped == ["app-xid"]
    assert "app-xid" not in added.changed
    assert "ib-symbol-errors" in added.changed
    by_name = {rule.name: rule for rule in added.rules}
    assert "checkpoint" not in by_name["app-xid"].actions
    assert "checkpoint" in by_name["ib-symbol-errors"].actions


def test_the_advisor_s_row_takes_no_checkpoint_on_an_application_xid() -> None:
    """An application XID 13 on a healthy node, nothing else: no false checkpoint, and
    the row's note names the warnings that got one and the one that did not."""
    settings = WorldSettings(nodes=8, spares=1, step_seconds=Duration(10))
    app_xid = (Noise(time=1400.0, slot="node-0003", signal="app-xid"),)
    [advisor] = replay(Trace((), 3600.0, "no fault"), settings, ReplayOptions(
        policies=("sn-monitor-advisor@900",), noise=app_xid))
    assert advisor.false_checkpoints == 0
    assert any("a checkpoint on every warning: review-xid, " in note
               and "(none on the application's XIDs: app-xid)" in note
               for note in advisor.notes)


@pytest.mark.parametrize(("codes", "resolutions", "application"), [
    ([], ["RESTART_APP"], True),
    ([13, 31], [], True),                  # both RESTART_APP in NVIDIA's catalogue
    ([13, 79], [], False),                 # 79: the GPU fell off the bus
    ([], ["RESTART_APP", "RESET_GPU"], False),
    ([], [], False),                       # every XID
    ([99_999], [], False),                 # not in the catalogue: could be anything
])
def test_an_application_rule_is_an_xid_rule_of_restart_app_only(
        codes: list[int], resolutions: list[str], application: bool) -> None:
    rule = EventRule(name="x", event="xid", codes=codes, resolutions=resolutions)
    assert application_rule(rule, load_catalog()) is application


def test_a_rule_on_the_node_is_not_the_application_s() -> None:
    hot = ThresholdRule(name="hot", metric="temperature_celsius", above=90.0)
    assert not application_rule(hot, load_catalog())
