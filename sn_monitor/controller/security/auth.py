"""Who may talk to the controller: bearer tokens with a role and, for agents, their nodes.

The token file (``--token-file``) is YAML, read by the one config loader::

    - name: fleet-agents          # who, for the audit trail
      role: agent                 # agent | read | operate | admin
      token_file: /etc/sn-monitor/agent.token   # or token: "..." (prefer a file)
      nodes: ["gpu-node-*"]       # agents only: the node names it may report for

Tokens are kept and looked up as SHA-256 digests, and never logged.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sn_monitor.config import ConfigError, Document, bind, load_yaml
from sn_monitor.model import NODE_NAME_CHARACTERS, NODE_NAME_MAX_LENGTH, is_node_name

Role = Literal["agent", "read", "operate", "admin"]

#: What each role may do, in addition to what the roles below it may do.
_RANK: dict[str, int] = {"agent": 0, "read": 1, "operate": 2, "admin": 3}
#: A token's node pattern: node-name characters and fnmatch's ``* ? [ ] !``, nothing else
#: (a space or a newline in a pattern could only ever match a name no report may carry).
_NODE_PATTERN = re.compile(rf"[*?\[\]!{NODE_NAME_CHARACTERS}]{{1,{NODE_NAME_MAX_LENGTH}}}")


@dataclass(frozen=True)
class TokenEntry:
    """One line of the token file."""

    name: str
    role: Role = "agent"
    token: str | None = None
    token_file: str | None = None
    nodes: list[str] = field(default_factory=lambda: ["*"])


@dataclass(frozen=True)
class Identity:
    """Who made a request."""

    name: str
    role: Role
    nodes: tuple[str, ...] = ("*",)

    def may_report_for(self, node: str) -> bool:
        """Agents report only for their own nodes; admins for any; nobody for a non-name.

        ``node`` must be a node name (:func:`~sn_monitor.model.is_node_name`) whatever
        the patterns say: fnmatch's ``*`` matches any character, a newline included.
        """
        if not is_node_name(node):
            return False
        if self.role == "admin":
            return True
        return self.role == "agent" and any(fnmatch.fnmatchcase(node, p) for p in self.nodes)

    def at_least(self, role: Role) -> bool:
        """Whether this identity has ``role`` or a stronger one (agents only report)."""
        if self.role == "agent":
            return role == "agent"
        return _RANK[self.role] >= _RANK[role]


#: The identity of every request when no token file is configured (a dev setup).
OPEN_ACCESS = Identity(name="anonymous", role="admin")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenBook:
    """Maps bearer tokens to identities."""

    def __init__(self, identities: dict[bytes, Identity]) -> None:
        self._by_digest = identities

    @classmethod
    def load(cls, path: str | Path) -> TokenBook:
        """Read the token file; every problem is a ConfigError naming file, key and line."""
        return cls(_identities(load_yaml(path), absent=None))

    def identify(self, authorization: str | None) -> Identity | None:
        """The identity behind an ``Authorization: Bearer ...`` header, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        # the scheme is case-insensitive (RFC 9110, section 11.1): "bearer" is fine
        if scheme.lower() != "bearer" or not token.strip():
            return None
        # A dict lookup by digest: the lookup's timing depends on a hash of the secret's
        # hash, which tells an attacker nothing, and it stays O(1) with a token per node.
        return self._by_digest.get(_digest(token.strip()))


def check_token_file(path: str | Path) -> list[str]:
    """Check a token file as :meth:`TokenBook.load` does (ConfigError), on any machine.

    A ``token_file`` that is not on this machine (the file is checked on a workstation
    before it is installed) is returned, not an error: the controller that loads it
    refuses to start without it. One that is here is read and checked.
    """
    absent: list[str] = []
    _identities(load_yaml(path), absent=absent)
    return absent


def _identities(doc: Document, absent: list[str] | None) -> dict[bytes, Identity]:
    """The token file's identities by digest; with ``absent``, missing token files go there."""
    if not isinstance(doc.data, list):
        raise doc.error((), "expected a list of tokens")
    identities: dict[bytes, Identity] = {}
    for i, raw in enumerate(doc.data):
        entry = bind(TokenEntry, doc, raw, (i,))
        if (entry.token is None) == (entry.token_file is None):
            raise doc.error((i,), "give exactly one of token and token_file")
        if (absent is not None and entry.token_file is not None
                and not Path(entry.token_file).exists()):
            absent.append(entry.token_file)
            _check_node_patterns(entry, doc, i)
            continue
        token = _token_of(entry, doc, i)
        _check_node_patterns(entry, doc, i)
        digest = _digest(token)
        if digest in identities:
            raise doc.error((i,), f"the same token is listed twice ({entry.name})")
        identities[digest] = Identity(entry.name, entry.role, tuple(entry.nodes))
    return identities


def _check_node_patterns(entry: TokenEntry, doc: Document, index: int) -> None:
    for j, pattern in enumerate(entry.nodes):
        if not _NODE_PATTERN.fullmatch(pattern):
            raise doc.error((index, "nodes", j), (
                f"{pattern!r} is not a node pattern: node-name characters "
                f"({NODE_NAME_CHARACTERS}) and the wildcards * ? [ ] !, "
                f"1 to {NODE_NAME_MAX_LENGTH} characters"))


def _token_of(entry: TokenEntry, doc: Document, index: int) -> str:
    if entry.token is not None:
        token = entry.token.strip()
    else:
        assert entry.token_file is not None
        try:
            token = Path(entry.token_file).read_text(encoding="utf-8").strip()
        except OSError as err:
            raise doc.error((index, "token_file"), f"cannot read: {err.strerror}") from None
    if len(token) < 16:
        raise doc.error((index,), "a token must be at least 16 characters")
    return token


__all__ = ["OPEN_ACCESS", "ConfigError", "Identity", "TokenBook", "check_token_file"]
