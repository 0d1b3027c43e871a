"""The controller's TLS: settings, uvicorn's options, and the certificate reload on SIGHUP.

uvicorn builds one :class:`ssl.SSLContext` at start-up (``Config.ssl``) and makes every
connection from it. A reload loads the new certificate and key into that same context:
handshakes from then on present the new certificate, connections already open keep the
one they started with. The client CA is read at start-up only.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from dataclasses import dataclass
from typing import Any, Literal

from sn_monitor.config import setting
from sn_monitor.controller.security.peer_identity import AgentAuth
from sn_monitor.tls import ca_bundle, check_key_pair, load_key_pair, readable_file

log = logging.getLogger(__name__)

ClientCerts = Literal["none", "optional", "required"]

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
              "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True)
class TlsSettings:
    """``tls:`` in the controller config: serve HTTPS, optionally verify client certificates.

    ``client_certs``: ``none`` asks for no client certificate; ``optional`` verifies one
    when a client sends it (agents with certificates, operators with tokens);
    ``required`` refuses the handshake without one. Default: ``optional`` with a
    ``client_ca_file``, else ``none``. ``agent_auth`` is what a report needs (see
    :mod:`sn_monitor.controller.security.peer_identity`).
    """

    cert_file: str = setting(check=readable_file)
    key_file: str = setting(check=readable_file)
    client_ca_file: str | None = setting(default=None, check=ca_bundle)
    client_certs: ClientCerts | None = None
    agent_auth: AgentAuth = "either"

    def __post_init__(self) -> None:
        check_key_pair(self.cert_file, self.key_file)
        if self.client_certs not in (None, "none") and self.client_ca_file is None:
            raise ValueError(f"client_certs: {self.client_certs} needs a client_ca_file")
        if self.agent_auth in ("cert", "both") and self.client_cert_mode == "none":
            raise ValueError(f"agent_auth: {self.agent_auth} needs client certificates "
                             "(a client_ca_file and client_certs optional or required)")

    @property
    def client_cert_mode(self) -> ClientCerts:
        """``client_certs`` with its default filled in."""
        if self.client_certs is not None:
            return self.client_certs
        return "optional" if self.client_ca_file else "none"

    @property
    def verifies_clients(self) -> bool:
        return self.client_cert_mode != "none"


def uvicorn_options(tls: TlsSettings | None) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments for ``tls`` (none for plain HTTP).

    ``ssl_ciphers`` None keeps Python's default cipher list (uvicorn's default,
    ``TLSv1``, would leave out TLS 1.2's AEAD ciphers).
    """
    if tls is None:
        return {}
    return {
        "ssl_certfile": tls.cert_file,
        "ssl_keyfile": tls.key_file,
        "ssl_ca_certs": tls.client_ca_file if tls.verifies_clients else None,
        "ssl_cert_reqs": _CERT_REQS[tls.client_cert_mode],
        "ssl_ciphers": None,
    }


def harden(context: ssl.SSLContext) -> None:
    """TLS 1.2 or later only."""
    context.minimum_version = ssl.TLSVersion.TLSv1_2


class CertificateReloader:
    """Loads ``tls``'s certificate and key again into the context uvicorn serves from.

    Call :meth:`reload` on the event loop's thread: an ``SSLContext`` must not change
    while another thread makes a connection from it.
    """

    def __init__(self, context: ssl.SSLContext, tls: TlsSettings) -> None:
        self._context = context
        self._tls = tls

    def reload(self) -> bool:
        """True if the new pair is in use; a bad pair is logged and the old one kept."""
        try:
            load_key_pair(self._context, self._tls.cert_file, self._tls.key_file)
        except ValueError as err:
            log.error("TLS certificate not reloaded, the old one stays: %s", err)
            return False
        log.info("TLS certificate reloaded from %s (%s)", self._tls.cert_file,
                 describe_certificate(self._tls.cert_file))
        return True


def describe_certificate(cert_file: str) -> str:
    """``sha256 AB:CD:..`` of the file's first certificate, for a log line."""
    try:
        with open(cert_file, encoding="ascii") as handle:
            text = handle.read()
        first = text[text.index(_BEGIN):text.index(_END) + len(_END)]
        der = ssl.PEM_cert_to_DER_cert(first)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        return f"fingerprint unknown: {err}"
    return "sha256 " + hashlib.sha256(der).hexdigest()


_BEGIN = "-----BEGIN CERTIFICATE-----"
_END = "-----END CERTIFICATE-----"


__all__ = ["CertificateReloader", "TlsSettings", "describe_certificate",
           "harden", "uvicorn_options"]
