"""A controller that watches nothing must not look healthy: no rules is refused (unless
the config says ``rules: []``), ``sn_controller_rules{source}`` counts what was loaded,
and ``check-config`` on a controller config looks at the rules it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sn_monitor.cli.check_config import check_config
from sn_monitor.config import ConfigError
from sn_monitor.controller.process.startup import read_rules
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.rules.spec import NO_RULES, load_rules, packaged_rules
from tests.support.harness import make_harness, rules_from

RULE = "- name: hot\n  metric: gpu_temperature_celsius\n  above: 85\n"


def _rules_samples(exposition: str) -> dict[str, float]:
    return {m[0]: float(m[1]) for m in re.findall(
        r'^sn_controller_rules\{source="([^"]*)"\} (\S+)$', exposition, re.M)}


def test_an_explicit_empty_list_runs_without_rules_from_the_config() -> None:
    loaded = read_rules(ControllerSettings(rules=[]))
    assert loaded.rules == []
    assert loaded.sources == {"config": 0}


def test_rule_files_without_a_rule_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("# everything commented out\n")
    (tmp_path / "b.yaml").write_text("[]\n")
    with pytest.raises(ConfigError) as caught:
        read_rules(ControllerSettings(rules=[str(tmp_path)]))
    assert str(caught.value) == f"{tmp_path}: {NO_RULES}"


@pytest.mark.parametrize("what", ["empty", "other files", "missing"])
def test_a_rules_path_that_gives_no_rule_file_is_refused(tmp_path: Path, what: str) -> None:
    rules = tmp_path / "rules"
    if what != "missing":
        rules.mkdir()
    if what == "other files":
        (rules / "rules.yml").write_text(RULE)
    with pytest.raises(ConfigError) as caught:
        read_rules(ControllerSettings(rules=[str(rules)]))
    assert str(caught.value) == {
        "empty": f"{rules}: no rule files (*.yaml) in this directory: it is empty",
        "other files": f"{rules}: no rule files (*.yaml) in this directory: found 1 other "
                       "file (rules.yml); rule files must end in .yaml",
        "missing": f"{rules}: rules path does not exist"}[what]


def test_each_source_is_counted(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(RULE)
    loaded = read_rules(ControllerSettings(rules=[str(tmp_path), str(packaged_rules())]))
    assert loaded.sources == {str(tmp_path): 1,
                              "packaged": len(load_rules([packaged_rules()]))}


def test_the_controller_exports_its_rules_by_source_and_after_a_reload(tmp_path: Path
                                                                        ) -> None:
    h = make_harness(tmp_path, rules_from(RULE))
    try:
        assert _rules_samples(h.controller.metrics().decode()) == {"config": 1.0}
        h.controller.reload_rules([], {"config": 0})
        assert _rules_samples(h.controller.metrics().decode()) == {"config": 0.0}
        h.controller.reload_rules(rules_from(RULE), {"/etc/sn-monitor/rules": 1})
        assert _rules_samples(h.controller.metrics().decode()) == {
            "/etc/sn-monitor/rules": 1.0}
    finally:
        h.controller.close()
        h.store.close()


def test_check_config_refuses_a_controller_config_whose_rules_are_empty(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "rules"
    empty.mkdir()
    (empty / "README").write_text("the rules moved\n")
    config = tmp_path / "controller.yaml"
    config.write_text(f"state_dir: {tmp_path}\nrules:\n  - {empty}\n")
    assert check_config([config]) == 2
    assert capsys.readouterr().err.strip() == (
        f"{config}:2: rules: {empty}: no rule files (*.yaml) in this directory: found 1 "
        "other file (README)")
    (empty / "none.yaml").write_text("[]\n")
    assert check_config([config]) == 2
    assert capsys.readouterr().err.strip() == f"{config}:2: rules: {NO_RULES}"
    (empty / "bad.yaml").write_text("- name: x\n  metric: gpu_temperature_celsius\n")
    assert check_config([config]) == 2  # the rules it names are checked too
    assert f"{config}:2: rules: {empty / 'bad.yaml'}:" in capsys.readouterr().err


def test_check_config_names_a_rules_path_not_on_this_machine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # deploy/kubernetes/config/controller.yaml names the container's /etc/sn-monitor/rules
    here = tmp_path / "rules"
    here.mkdir()
    (here / "mine.yaml").write_text(RULE)
    elsewhere = tmp_path / "in-the-container"
    config = tmp_path / "controller.yaml"
    config.write_text(f"state_dir: {tmp_path}\nrules: [{here}, {elsewhere}]\n")
    assert check_config([config]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{config}: ok (controller config)",
        f"{config}: note: rules[1]: {elsewhere} is not on this machine: not checked"]
    config.write_text(f"state_dir: {tmp_path}\nrules: []\n")
    assert check_config([config]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{config}: ok (controller config)"]
