"""What every HTTP client of sn-monitor agrees on: URLs in logs, URL settings, Retry-After.

The agent's reporter, the controller's drivers, its lease clients and the command line
all name URLs in log lines, metric labels and error messages; none of them may print a
credential that a URL carries. So a URL is shown as :func:`redact_url` makes it, checked
in settings by :func:`check_http_url`, a server's ``Retry-After`` read by
:func:`parse_retry_after`, an error answer's own words by :func:`error_text`, and a
request that got no answer at all said in words (``connection refused``, ``name does not
resolve``, ``timed out``) by :func:`describe_failure`. A bearer token comes from a file,
by :func:`read_token`. A standby controller's answer is
told by :func:`is_standby`: the client asks the next one.
"""

from __future__ import annotations

import email.utils
import errno
import json
import socket
import ssl
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from sn_monitor.errors import SnMonitorError

#: The header a standby controller answers with (``standby``): a client moves on to the
#: next controller of the pair (HTTP headers are case-insensitive).
ROLE_HEADER: Final = "X-SN-Controller-Role"


def is_standby(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an answer is a standby controller's: 503 with :data:`ROLE_HEADER` ``standby``.

    Every client of an HA pair (agents, training jobs, ``sn-monitor breaker``, the fleet
    view) then asks the next controller at once. Header names are matched in any case,
    whatever ``headers`` is (``requests``' headers, or a plain dict of the names as read).
    """
    if status != 503:
        return False
    role = ROLE_HEADER.lower()
    return any(name.lower() == role and value.strip().lower() == "standby"
               for name, value in headers.items())


def error_text(body: bytes, limit: int = 500) -> str:
    """An error answer's own words, at most ``limit`` characters.

    Its JSON ``error`` (or ``detail``, ``message``), else the JSON, else the body as text.
    """
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:limit]
    if isinstance(doc, dict):
        for key in ("error", "detail", "message"):
            if key in doc:
                return str(doc[key])[:limit]
    return str(doc)[:limit]


def redact_url(url: str, *, secret_path: bool = False) -> str:
    """``https://user:pw@host:8443/p/a?token=x`` -> ``https://host:8443/p/a``.

    User info and the query string (where tokens live) always go; with ``secret_path``
    the path is replaced by ``/…`` too (Slack webhook URLs carry their token in the
    path). Anything unparsable becomes ``<invalid url>``.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<invalid url>"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    path = "/…" if secret_path and parts.path not in ("", "/") else parts.path
    return f"{parts.scheme}://{netloc}{path}"


def check_http_url(value: str) -> None:
    """Settings check: an absolute http(s) URL with a host and a valid port (ValueError).

    ``ctl:9848`` (no scheme) is told what to write instead: ``http://ctl:9848``.
    """
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as err:
        raise ValueError(f"invalid URL: {str(err).lower()}") from None
    if parts.scheme not in ("http", "https"):
        hint = ""
        if "://" not in value and not value.startswith("/"):
            hint = f" (did you mean 'http://{value}'?)"
        shown = value if "://" not in value else redact_url(value)
        raise ValueError(f"expected an http:// or https:// URL, got {shown!r}{hint}")
    if not parts.hostname:
        raise ValueError(f"the URL names no host: {redact_url(value)!r}")
    if port == 0:
        raise ValueError(f"the port must be 1-65535: {redact_url(value)!r}")


#: Errors of the operating system said in words a person acts on.
_ERRNO_WORDS: Final = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.ECONNABORTED: "connection reset",
    errno.EPIPE: "connection reset",
    errno.ETIMEDOUT: "timed out",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
    errno.EADDRNOTAVAIL: "address not available",
}


def describe_failure(err: BaseException) -> str:
    """Why a request or a connection got no answer, in words: ``connection refused``.

    One of ``connection refused``, ``name does not resolve``, ``timed out``, ``connection
    reset``, ``no route to host``, ``network unreachable``, ``TLS ...``, ``not an http://
    or https:// URL``, else the operating system's own words or the exception's type.
    The chain of causes is walked down to the socket's error (``requests`` wraps urllib3's
    error, which wraps the socket's); the text of a ``requests`` exception is never
    quoted, because it names the request's URL, query string (a token) included. The
    caller names the URL, as :func:`redact_url` shows it.
    """
    for cause in _causes(err):
        if isinstance(cause, socket.gaierror):
            temporary = cause.errno == socket.EAI_AGAIN
            return "name does not resolve" + (" (DNS did not answer)" if temporary else "")
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS: certificate not trusted ({cause.verify_message})"
        if isinstance(cause, ssl.SSLError):
            reason = getattr(cause, "reason", None)  # set by the ssl module, not by hand
            if reason == "WRONG_VERSION_NUMBER":
                return "TLS: the server does not speak TLS (an http:// URL?)"
            why = reason or cause.strerror or "handshake failed"
            return f"TLS: {why.lower().replace('_', ' ')}"
        if isinstance(cause, TimeoutError):
            return "timed out"
        if isinstance(cause, OSError) and cause.errno in _ERRNO_WORDS:
            return _ERRNO_WORDS[cause.errno]
    import requests  # already imported by whoever sent the request

    if isinstance(err, requests.Timeout):
        return "timed out"
    if isinstance(err, requests.exceptions.InvalidSchema | requests.exceptions.MissingSchema
                  | requests.exceptions.InvalidURL):
        return "not an http:// or https:// URL"
    for cause in _causes(err):
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror[0].lower() + cause.strerror[1:]
    if isinstance(err, OSError) and not isinstance(err, requests.RequestException) and str(err):
        return str(err)  # our own connection errors (the reports' stream) name no URL
    return type(err).__name__


def _causes(err: BaseException) -> Iterator[BaseException]:
    """``err``, then what it wraps: ``reason`` (urllib3), an exception in its args, the cause."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        reason = getattr(current, "reason", None)
        nested = next((a for a in current.args if isinstance(a, BaseException)), None)
        current = (reason if isinstance(reason, BaseException) else
                   nested or current.__cause__ or current.__context__)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), None when absent or bad.

    Delta-seconds may carry a fraction (``0.5``): lenient, as our own standby is exact.
    """
    if value is None:
        return None
    text = value.strip()
    if text.replace(".", "", 1).isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


class TokenError(SnMonitorError):
    """The controller token file cannot be used."""


def read_token(path: str | Path) -> str:
    """The bearer token from ``path``, stripped; :class:`TokenError` names the problem.

    The token itself never appears in an error or a log line.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise TokenError(f"cannot read token file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise TokenError(f"token file {path} is not UTF-8 text") from None
    token = text.strip()
    if not token:
        raise TokenError(f"token file {path} is empty")
    if any(c.isspace() for c in token):
        raise TokenError(f"token file {path} holds more than one word")
    return token
