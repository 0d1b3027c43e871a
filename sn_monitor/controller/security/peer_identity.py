"""Who sent a report: a verified client certificate, a bearer token, or both.

A client certificate names one node. Its node is its DNS subject alternative name when
it has exactly one; a certificate with no DNS name is named by its subject common name
(CN); a certificate with two or more DNS names names no node (a certificate is one
node's, not a group's), nor does one whose name is not a node name (``*`` and the other
glob characters are refused: they would widen :meth:`Identity.may_report_for`).
The identity it gives is ``cert:<node>``, role ``agent``, for that node only, and only
on the reports' route: operators keep using tokens for the rest of the API.

What a report needs is the controller's ``tls.agent_auth``:

``either`` (the default)
    a token or a certificate;
``token`` / ``cert``
    that one (the other may come along);
``both``
    both.

Whenever both come, they must agree: the token must be allowed to report for the
certificate's node, and the report is then accepted for that node only. A token that
is present but unknown is refused (401) even next to a good certificate.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any, Literal

from sn_monitor.controller.errors import Forbidden, Unauthenticated
from sn_monitor.controller.security.auth import Identity, TokenBook
from sn_monitor.model import is_node_name

AgentAuth = Literal["either", "token", "cert", "both"]

#: The key under the ASGI scope's ``extensions`` that carries the connection's
#: :class:`ClientCertificate` to the reports' ASGI handler (uvicorn does not pass TLS
#: details to the app).
SCOPE_EXTENSION = "sn_monitor.client_certificate"


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """A client certificate the TLS layer verified: its node, or why it names none."""

    node: str | None
    problem: str = ""

    def identity(self) -> Identity:
        """The agent identity of this certificate's node (call only when ``node`` is set)."""
        assert self.node is not None
        return Identity(name=f"cert:{self.node}", role="agent", nodes=(self.node,))


def certificate_node(peercert: dict[str, Any]) -> ClientCertificate:
    """The node a decoded certificate (``SSLObject.getpeercert()``) names; see the module."""
    dns = [value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    if len(set(dns)) > 1:
        return ClientCertificate(None, f"it has {len(set(dns))} DNS names, a node has one")
    if dns:
        name, source = dns[0], "DNS name"
    else:
        common = [value for rdn in peercert.get("subject", ()) for key, value in rdn
                  if key == "commonName"]
        if len(common) != 1:
            return ClientCertificate(None, "it has no DNS name and not exactly one CN")
        name, source = common[0], "CN"
    if not is_node_name(name):  # as reports carry it: no glob characters, no spaces
        return ClientCertificate(None, f"its {source} {name[:80]!r} is not a node name")
    return ClientCertificate(name)


def client_certificate(transport: asyncio.BaseTransport) -> ClientCertificate | None:
    """The verified client certificate of a connection, None without one.

    ``getpeercert()`` returns a certificate only when the handshake verified it against
    the client CA, which the server context requires before asking for one.
    """
    ssl_object = transport.get_extra_info("ssl_object")
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return None
    peercert = ssl_object.getpeercert()
    return certificate_node(peercert) if peercert else None


def report_identity(tokens: TokenBook | None, authorization: str | None,
                    certificate: ClientCertificate | None, agent_auth: AgentAuth) -> Identity:
    """Who may send this report, by the rules of the module docstring.

    Raises Unauthenticated (no or unknown credentials) or Forbidden.

    For a controller that verifies client certificates. Without a token file no token
    identifies anyone (a bearer header is ignored), so only certificates count.
    """
    token: Identity | None = None
    if tokens is not None and authorization:
        token = tokens.identify(authorization)
        if token is None:
            raise Unauthenticated("unknown bearer token")
        if not token.at_least("agent"):
            raise Forbidden(f"{token.name} ({token.role}) may not report")
    if certificate is not None and certificate.node is None:
        raise Forbidden(f"the client certificate names no node: {certificate.problem}")
    if token is None and agent_auth in ("token", "both"):
        raise Unauthenticated("missing bearer token (tls.agent_auth: "
                            f"{agent_auth} requires one)")
    if certificate is None and agent_auth in ("cert", "both"):
        raise Unauthenticated("missing client certificate (tls.agent_auth: "
                            f"{agent_auth} requires one)")
    if certificate is None:
        if token is None:
            raise Unauthenticated("missing bearer token or client certificate")
        return token
    by_cert = certificate.identity()
    if token is None:
        return by_cert
    node = certificate.node
    assert node is not None
    if not token.may_report_for(node):
        raise Forbidden(f"{token.name} may not report for node {node}, "
                            "the node of the client certificate")
    return Identity(name=f"{token.name}+{by_cert.name}", role="agent", nodes=(node,))


__all__ = ["SCOPE_EXTENSION", "AgentAuth", "ClientCertificate", "certificate_node",
           "client_certificate", "report_identity"]
