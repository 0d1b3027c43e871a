"""The config loader and the corpus of bad agent config files."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sn_monitor.agent.settings import AgentSettings, load_agent_settings
from sn_monitor.cli import check_config, check_file
from sn_monitor.config import (
    ConfigError,
    Duration,
    bind,
    format_key,
    parse_duration,
    parse_yaml,
    setting,
)
from tests.conftest import expected_messages

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "tests" / "fixtures" / "config" / "bad"


def _expected() -> list[tuple[str, str]]:
    return expected_messages(BAD)


def test_every_bad_file_has_an_expectation():
    listed = {name for name, _ in _expected()}
    assert listed == {p.name for p in BAD.glob("*.yaml")}


@pytest.mark.parametrize(("name", "message"), _expected())
def test_bad_config_names_file_key_and_line(name, message):
    path = BAD / name
    with pytest.raises(ConfigError) as caught:
        check_file(path)
    assert str(caught.value) == f"{path}{message}"


@pytest.mark.parametrize(
    ("path", "kind"),
    [("deploy/agent.yaml", "agent config"), ("deploy/controller.yaml", "controller config"),
     ("rules/default.yaml", "rule file"), ("tests/fixtures/jobs/trillion.yaml", "job file"),
     ("deploy/jobs/example.yaml", "job file")],
)
def test_shipped_files_are_valid(path, kind):
    assert check_file(ROOT / path) == kind


def test_token_files_are_recognised_and_checked(tmp_path):
    secret = tmp_path / "agent.token"
    secret.write_text("0123456789abcdef0123456789abcdef\n")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"- {{name: a, role: agent, token_file: {secret}}}\n"
                      f"- {{name: b, role: read, token_file: {tmp_path / 'missing'}}}\n")
    with pytest.raises(ConfigError, match=r"tokens.yaml:2: \[1\].token_file: cannot read"):
        check_file(tokens)


def test_check_config_exits_2_without_traceback():
    bad = BAD / "guard-mode.yaml"
    good = ROOT / "deploy" / "agent.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "sn_monitor.cli", "check-config", str(good), str(bad)],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad}:2: guard.mode: must be one of enforce, dry-run, off" in result.stderr
    assert f"{good}: ok" in result.stdout


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert check_config([tmp_path / "nope.yaml"]) == 2
    assert "nope.yaml: no such file" in capsys.readouterr().err


def test_shipped_agent_config_is_valid():
    settings = load_agent_settings(ROOT / "deploy" / "agent.yaml")
    assert settings.node == "gpu-node-017"
    assert settings.labels == {"supernode": "sn0", "rack": "r12"}
    assert settings.guard.hold == 5.0
    assert settings.collectors.net.exclude == "^(lo|docker.*|veth.*)$"


def test_empty_file_gives_defaults(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("# nothing set\n")
    assert load_agent_settings(path) == AgentSettings(node=load_agent_settings(path).node)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("500ms", 0.5), ("5m", 300.0), ("1h30m", 5400.0), ("2m30s", 150.0),
     (3, 3.0), (0.25, 0.25), ("1.5s", 1.5), ("1d", 86400.0)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["fast", "1 s", "s", "-1s", -2, True, "1s5", "", None])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_key_paths_format_lists():
    assert format_key(("rules", 3, "for")) == "rules[3].for"


@dataclass(frozen=True)
class _Inner:
    hold: Duration = setting(default=Duration(1), key="for")


@dataclass(frozen=True)
class _Outer:
    items: list[_Inner] = field(default_factory=list)
    name: str = "x"


def test_errors_inside_lists_name_the_index_and_line():
    doc = parse_yaml("name: a\nitems:\n  - for: 2s\n  - for: soon\n", "rules.yaml")
    with pytest.raises(ConfigError) as caught:
        bind(_Outer, doc)
    assert str(caught.value) == (
        "rules.yaml:4: items[1].for: expected a duration such as 1s or 500ms, got 'soon'"
    )


def test_yaml_keyword_names_bind_to_fields():
    doc = parse_yaml("items: [{for: 3s}]\n", "f.yaml")
    assert bind(_Outer, doc).items[0].hold == 3.0


def test_an_agent_config_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"top-level-list.yaml:1: expected a mapping, got a list"):
        load_agent_settings(BAD / "top-level-list.yaml")


@pytest.mark.parametrize(("text", "message"), [
    ("a: " + "9" * 5000, "a value cannot be read"),  # past Python's int string limit
    ("&a [*a]", "nested too deeply (or a recursive alias)"),
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
])
def test_pathological_yaml_is_a_config_error_not_a_traceback(text, message):
    with pytest.raises(ConfigError) as caught:
        parse_yaml(text, "rules.yaml")
    assert str(caught.value).startswith("rules.yaml: ")
    assert message in str(caught.value)
