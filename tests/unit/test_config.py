"""The config loader and the corpus of bad agent config files."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sn_monitor.agent.settings import AgentSettings, load_agent_settings
from sn_monitor.cli.check_config import check_config, check_file
from sn_monitor.config import (
    ConfigError,
    Duration,
    bind,
    format_key,
    listen_address,
    parse_duration,
    parse_listen,
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
     ("sn_monitor/rules/default.yaml", "rule file"),
     ("tests/fixtures/jobs/trillion.yaml", "job file"),
     ("deploy/jobs/example.yaml", "job file")],
)
def test_shipped_files_are_valid(path, kind):
    assert check_file(ROOT / path) == kind


def test_token_files_are_recognised_and_checked(tmp_path):
    secret = tmp_path / "agent.token"
    secret.write_text("0123456789abcdef0123456789abcdef\n")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"- {{name: a, role: agent, token_file: {secret}}}\n"
                      f"- {{name: b, role: read, token_file: {tmp_path}}}\n")
    with pytest.raises(ConfigError, match=r"tokens.yaml:2: \[1\].token_file: cannot read"):
        check_file(tokens)


def test_a_token_file_not_on_this_machine_is_a_note_not_an_error(tmp_path, capsys):
    # deploy/tokens.example.yaml names /etc/sn-monitor/*.token, checked on a workstation
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(f"- {{name: a, role: agent, token_file: {tmp_path / 'missing'}}}\n"
                      f"- {{name: b, role: read, token: {'x' * 8}}}\n")
    with pytest.raises(ConfigError, match=r"tokens.yaml:2: \[1\]: a token must be at least"):
        check_file(tokens)  # what is in the file is still checked
    tokens.write_text(f"- {{name: a, role: agent, token_file: {tmp_path / 'missing'}}}\n"
                      f"- {{name: b, token_file: {tmp_path / 'missing'}, token: {'x' * 16}}}\n")
    with pytest.raises(ConfigError, match=r"tokens.yaml:2: \[1\]: give exactly one of"):
        check_file(tokens)
    tokens.write_text(f"- {{name: a, role: agent, token_file: {tmp_path / 'missing'}}}\n")
    assert check_config([tokens]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{tokens}: ok (token file)",
        f"{tokens}: note: token_file {tmp_path / 'missing'} is not on this machine: not checked"]


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


# ------------------------------------------------ the controllers an agent reports to


def _agent(tmp_path: Path, text: str):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path, load_agent_settings(path)


def test_controller_urls_list_every_controller(tmp_path):
    _, settings = _agent(tmp_path, "controller:\n  urls: [http://ctl-a:9848, http://ctl-b:9848/]\n")
    assert settings.controller.url is None
    assert settings.controller.controller_urls == ("http://ctl-a:9848", "http://ctl-b:9848/")
    _, one = _agent(tmp_path, "controller: {url: https://ctl:9848}\n")
    assert one.controller.controller_urls == ("https://ctl:9848",)
    assert AgentSettings().controller.controller_urls == ()


@pytest.mark.parametrize(("text", "message"), [
    ("controller:\n  url: http://a:9848\n  urls: [http://b:9848]\n",
     ":1: controller: give url (one controller) or urls (several), not both"),
    ("controller:\n  urls: [https://a:9848, http://b:9848]\n",
     ":2: controller.urls: every URL must use one scheme, got http and https"),
    ("controller:\n  urls:\n    - http://a:9848\n    - ctl-b:9848\n",
     ":2: controller.urls: [1]: expected an http:// or https:// URL, got 'ctl-b:9848'"),
    ("controller:\n  urls: [http://a:9848, http://a:9848/]\n",
     ":2: controller.urls: [1]: 'http://a:9848/' is listed twice"),
    ("controller:\n  urls: []\n",
     ":2: controller.urls: list at least one controller URL, or leave urls out"),
    ("controller:\n  urls: http://a:9848\n",
     ":2: controller.urls: expected a list, got 'http://a:9848'"),
])
def test_bad_controller_urls_name_the_key(tmp_path, text, message):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_agent_settings(path)
    assert str(caught.value).startswith(f"{path}{message}")


def _cli_settings(*argv: str):
    from sn_monitor.cli import build_parser
    from sn_monitor.cli.agent import agent_settings

    return agent_settings(build_parser().parse_args(["agent", *argv]))


def test_controller_flag_once_is_url_and_more_often_urls(tmp_path):
    one = _cli_settings("--controller", "http://ctl:9848")
    assert (one.controller.url, one.controller.urls) == ("http://ctl:9848", None)
    two = _cli_settings("--controller", "http://a:9848", "--controller", "http://b:9848")
    assert (two.controller.url, two.controller.urls) == (None, ["http://a:9848",
                                                                "http://b:9848"])
    path, _ = _agent(tmp_path, "controller: {urls: [http://a:9848, http://b:9848]}\n")
    flag = _cli_settings("--config", str(path), "--controller", "http://c:9848")
    assert flag.controller.controller_urls == ("http://c:9848",)  # the flag wins
    kept = _cli_settings("--config", str(path), "--token-file", "/t")
    assert kept.controller.controller_urls == ("http://a:9848", "http://b:9848")
    with pytest.raises(ConfigError, match=r"^command line: --controller: urls: every URL "
                                          r"must use one scheme"):
        _cli_settings("--controller", "http://a:9848", "--controller", "https://b:9848")


# ------------------------------------------------ first contact: what a person types wrong


@pytest.mark.parametrize(("value", "parsed"), [
    ("0.0.0.0:9847", ("0.0.0.0", 9847)),
    ("127.0.0.1:1", ("127.0.0.1", 1)),
    ("[::1]:9848", ("::1", 9848)),
    ("ctl-a.example.org:65535", ("ctl-a.example.org", 65535)),
    ("localhost:9847", ("localhost", 9847)),
])
def test_listen_addresses_parse(value, parsed):
    assert parse_listen(value) == parsed
    listen_address(value)


@pytest.mark.parametrize(("value", "message"), [
    ("127.0.0.1:99999", "port 99999 is out of range 1-65535 (in '127.0.0.1:99999')"),
    ("127.0.0.1:0", "port 0 is out of range 1-65535"),
    ("127.0.0.1:http", "the port must be a number 1-65535, got 'http'"),
    ("127.0.0.1", "expected HOST:PORT (such as 0.0.0.0:9847), got '127.0.0.1'"),
    (":9847", "expected HOST:PORT"),
    ("::1:9847", "write an IPv6 address in brackets, as [::1]:9847"),
    ("[::g]:9847", "[::g] is not an IPv6 address"),
    ("300.1.1.1:9847", "300.1.1.1 is not an IPv4 address"),
    ("ctl_a:9847", "'ctl_a' is neither an IP address nor a host name"),
    ("a b:9847", "'a b' is neither an IP address nor a host name"),
])
def test_bad_listen_addresses_say_what_is_wrong(value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        listen_address(value)


def test_a_listen_address_in_a_file_names_file_key_and_line(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("node: a\nlisten: 127.0.0.1:99999\n")
    with pytest.raises(ConfigError) as caught:
        load_agent_settings(path)
    assert str(caught.value) == (f"{path}:2: listen: port 99999 is out of range 1-65535 "
                                 "(in '127.0.0.1:99999')")


@pytest.mark.parametrize(("text", "guess"), [
    ("sweep_intervall: 10s\n", "sweep_interval"),  # a controller config, by its closest key
    ("state_dir: /x\npolicy:\n  dry_rn: true\n", "dry_run"),
    ("intervall: 1s\n", "interval"),  # an agent config
    ("collectors:\n  nvml:\n    enabld: false\n", "enabled"),
])
def test_an_unknown_key_names_the_likely_one(tmp_path, text, guess):
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        check_file(path)
    assert f"unknown key; did you mean {guess}? (known keys: " in str(caught.value)


def test_an_unknown_key_like_none_lists_the_known_ones(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("paths:\n  zzz: /x\n")
    with pytest.raises(ConfigError) as caught:
        check_file(path)
    assert str(caught.value) == (f"{path}:2: paths.zzz: unknown key "
                                 "(known keys: kmsg, procfs, sysfs)")


def test_the_controller_command_suggests_the_key(tmp_path):
    from sn_monitor.controller.settings import load_controller_settings

    path = tmp_path / "controller.yaml"
    path.write_text("rules: [/x]\nsweep_intervall: 10s\n")
    with pytest.raises(ConfigError, match=r":2: sweep_intervall: unknown key; did you mean "
                                          r"sweep_interval\?"):
        load_controller_settings(path)


@pytest.mark.parametrize(("text", "message"), [
    ("controller: {url: '127.0.0.1:9848'}\n",
     ":1: controller.url: expected an http:// or https:// URL, got '127.0.0.1:9848' "
     "(did you mean 'http://127.0.0.1:9848'?)"),
    ("controller: {url: 'http://:9848'}\n", ":1: controller.url: the URL names no host"),
    ("controller: {url: 'http://ctl:99999'}\n", ":1: controller.url: invalid URL: port"),
])
def test_a_controller_url_without_scheme_or_host_is_refused(tmp_path, text, message):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_agent_settings(path)
    assert str(caught.value).startswith(f"{path}{message}")


def _all_help() -> dict[str, str]:
    from sn_monitor.cli import build_parser

    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser.format_help(),
            **{name: sub.format_help() for name, sub in commands.choices.items()}}


def test_help_is_plain_text():
    for command, text in _all_help().items():
        assert not re.search(r"``|`[^`\n]+`|:[a-z]+:`", text), (command, text)


def test_check_config_help_lists_each_kind_and_how_it_is_told():
    text = _all_help()["check-config"]
    for kind in ("scenario file", "XID catalogue", "job file", "token file", "rule file",
                 "fleet config", "controller config", "agent config"):
        assert kind in text
    for sign in ("kind: Scenario", "kind: XidCatalog", "kind: DistributedJob", "supernodes:",
                 "sweep_interval", "collectors"):
        assert sign in text


def _parse_error(capsys, *argv: str) -> str:
    from sn_monitor.cli import build_parser

    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(list(argv))
    assert caught.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["agent", "--listen", "127.0.0.1:99999"],
     "argument --listen: port 99999 is out of range 1-65535"),
    (["controller", "--listen", "localhost"], "argument --listen: expected HOST:PORT"),
    (["agent", "--controller", "127.0.0.1:9848"],
     "argument --controller: expected an http:// or https:// URL, got '127.0.0.1:9848' "
     "(did you mean 'http://127.0.0.1:9848'?)"),
    (["simulate", "--controller", "ctl:9848"], "argument --controller: expected an http://"),
    (["breaker", "--controller", "http://"], "argument --controller: the URL names no host"),
    (["topology", "--controller", "ctl"], "argument --controller: expected an http://"),
    (["slurm-health", "--agent", "127.0.0.1:9847"], "argument --agent: expected an http://"),
])
def test_bad_flags_are_refused_when_parsed(capsys, argv, message):
    assert message in _parse_error(capsys, *argv)
