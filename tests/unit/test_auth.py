"""Bearer tokens: the token file, roles, and which nodes an agent may report for."""

from __future__ import annotations

from pathlib import Path

import pytest

from sn_monitor.controller.security.auth import OPEN_ACCESS, ConfigError, Identity, TokenBook

AGENT = "agent-secret-0123456789"
READER = "reader-secret-0123456789"


def book_from(tmp_path: Path, text: str) -> TokenBook:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    return TokenBook.load(path)


def load_error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        book_from(tmp_path, text)
    return err.value


def test_loads_tokens_inline_and_from_files(tmp_path: Path) -> None:
    secret = tmp_path / "agent.token"
    secret.write_text(f"  {AGENT}\n")  # whitespace and the newline are not part of it
    book = book_from(tmp_path, f"""
- name: fleet-agents
  role: agent
  token_file: {secret}
  nodes: ["gpu-node-*", "spare-?"]
- name: dashboards
  role: read
  token: "{READER}"
""")
    agent = book.identify(f"Bearer {AGENT}")
    assert agent == Identity("fleet-agents", "agent", ("gpu-node-*", "spare-?"))
    reader = book.identify(f"Bearer {READER}")
    assert reader == Identity("dashboards", "read", ("*",))


def test_unknown_or_malformed_headers_identify_nobody(tmp_path: Path) -> None:
    book = book_from(tmp_path, f"- {{name: a, token: {AGENT}}}")
    for header in (None, "", "Bearer", "Bearer ", f"Basic {AGENT}", AGENT,
                   f"Bearer {AGENT}x", f"Bearer {AGENT[:-1]}", f"Token {AGENT}"):
        assert book.identify(header) is None, header
    assert book.identify(f"Bearer {AGENT} ") is not None  # trailing whitespace is trimmed


def test_the_scheme_is_case_insensitive(tmp_path: Path) -> None:
    # RFC 9110 section 11.1: the authentication scheme is case-insensitive
    book = book_from(tmp_path, f"- {{name: a, token: {AGENT}}}")
    for header in (f"bearer {AGENT}", f"BEARER {AGENT}", f"Bearer  {AGENT}"):
        identity = book.identify(header)
        assert identity is not None, header
        assert identity.name == "a"


def test_tokens_are_kept_as_digests(tmp_path: Path) -> None:
    book = book_from(tmp_path, f"- {{name: a, token: {AGENT}}}")
    assert AGENT not in repr(vars(book))


@pytest.mark.parametrize(("text", "message"), [
    ("- {name: a}", "give exactly one of token and token_file"),
    (f"- {{name: a, token: {AGENT}, token_file: /x}}", "give exactly one of token and token_file"),
    ("- {name: a, token: short}", "at least 16 characters"),
    ("- {name: a, token: '               x'}", "at least 16 characters"),
    (f"- {{name: a, token: {AGENT}}}\n- {{name: b, token: {AGENT}}}",
     "the same token is listed twice (b)"),
    (f"- {{name: a, token: {AGENT}, role: root}}", "role"),
    (f"- {{name: a, token: {AGENT}, colour: red}}", "colour"),
    (f"- {{token: {AGENT}}}", "name"),
    ("name: a\ntoken: x", "expected a list of tokens"),
    ("- {name: a, token_file: /nonexistent/sn-monitor.token}", "cannot read"),
])
def test_bad_token_files(tmp_path: Path, text: str, message: str) -> None:
    err = load_error(tmp_path, text)
    assert message in str(err)
    assert err.file.endswith("tokens.yaml")
    if "twice" in message:
        assert err.line == 2  # the second entry
    # a token never appears in an error message
    assert AGENT not in str(err)


def test_missing_token_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        TokenBook.load(tmp_path / "absent.yaml")


def test_roles_rank() -> None:
    agent = Identity("a", "agent")
    read = Identity("r", "read")
    operate = Identity("o", "operate")
    admin = Identity("x", "admin")
    assert agent.at_least("agent")
    assert not agent.at_least("read")
    assert not agent.at_least("operate")
    assert read.at_least("read")
    assert read.at_least("agent")
    assert not read.at_least("operate")
    assert operate.at_least("read")
    assert operate.at_least("operate")
    assert not operate.at_least("admin")
    assert admin.at_least("admin")
    assert admin.at_least("operate")


def test_who_may_report_for_which_node() -> None:
    agent = Identity("rack-7", "agent", ("r7-*", "spare-1"))
    assert agent.may_report_for("r7-n01")
    assert agent.may_report_for("spare-1")
    assert not agent.may_report_for("r8-n01")
    assert not agent.may_report_for("spare-10")
    assert not agent.may_report_for("R7-n01")  # node names are matched case-sensitively
    assert not Identity("everyone", "agent", ()).may_report_for("r7-n01")
    assert Identity("all", "agent").may_report_for("anything")
    # people's tokens do not report; admins may (tests, a hand-fed report)
    assert not Identity("r", "read").may_report_for("r7-n01")
    assert not Identity("o", "operate").may_report_for("r7-n01")
    assert Identity("x", "admin").may_report_for("r7-n01")
    assert OPEN_ACCESS.role == "admin"
