"""The one way action drivers speak HTTP: a small wrapper around a ``requests.Session``.

Every outgoing call of the webhook, Slack and Alertmanager drivers goes through
:class:`HttpClient`, so that the rules are the same everywhere:

* a timeout is always set (``requests`` waits forever by default);
* redirects are never followed: a webhook that redirects is misconfigured, and following
  it would send the body (and its signature or bearer token) somewhere nobody chose;
* ``requests`` does no retries of its own (its adapter default): the action runner
  retries, with backoff, on :class:`TemporaryError`;
* exceptions and status codes become the action error model (STYLE 12): timeouts,
  connection errors, 408, 409, 429 and 5xx are temporary (with ``Retry-After`` honoured);
  other 4xx, 3xx and malformed URLs are permanent;
* URLs in messages and logs are cut to ``scheme://host[:port]/path``: no user info, no
  query string (where tokens live). For URLs whose *path* is the secret (Slack incoming
  webhooks), ``secret_path=True`` drops the path too. Exception text from ``requests``
  is never passed on verbatim, because it quotes the URL.
* urllib3 logs every request line at DEBUG (``"POST /services/T/B/secret?x=y HTTP/1.1"
  200``): a filter on its connection-pool logger (:class:`RequestLineFilter`) cuts the
  query string from those lines and hides the paths of ``secret_path`` clients, so that
  ``--log-level debug`` does not print a credential either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests

from sn_monitor.controller.actions.base import PermanentError, TemporaryError
from sn_monitor.transport import describe_failure, parse_retry_after, redact_url

log = logging.getLogger(__name__)

#: Status codes worth retrying besides 5xx: request timeout, conflict, too many requests.
TEMPORARY_STATUS: frozenset[int] = frozenset({408, 409, 429})

#: How much of an error response body is quoted in an error message.
BODY_EXCERPT_CHARS = 200

#: The logger urllib3 writes its request lines to, and their format (urllib3 2.x).
URLLIB3_POOL_LOGGER = "urllib3.connectionpool"
_URLLIB3_REQUEST_LINE = '%s://%s:%s "%s %s %s" %s %s'
_URL_ARG = 4


class RequestLineFilter(logging.Filter):
    """Redacts the target of urllib3's DEBUG request lines (see the module docstring).

    The query string always goes (``?…``); a path that a ``secret_path`` client has
    sent to becomes ``/…``. Other records pass unchanged. Installed once, at import.
    """

    def __init__(self) -> None:
        super().__init__()
        self._secret_paths: set[str] = set()
        self._lock = threading.Lock()

    def hide_path(self, url: str) -> None:
        """From now on, print ``url``'s path as ``/…`` in request lines."""
        try:
            path = urlsplit(url).path
        except ValueError:
            return
        if path not in ("", "/"):
            with self._lock:
                self._secret_paths.add(path)

    def redact(self, target: str) -> str:
        """``/a/b?token=x`` -> ``/a/b?…``; a hidden path -> ``/…``."""
        path, sep, _ = target.partition("?")
        with self._lock:
            if path in self._secret_paths:
                path = "/…"
        return path + ("?…" if sep else "")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg != _URLLIB3_REQUEST_LINE or not isinstance(args, tuple) \
                or len(args) <= _URL_ARG:
            return True
        target = args[_URL_ARG]
        if isinstance(target, str):
            record.args = (*args[:_URL_ARG], self.redact(target), *args[_URL_ARG + 1:])
        return True


REQUEST_LINES = RequestLineFilter()
logging.getLogger(URLLIB3_POOL_LOGGER).addFilter(REQUEST_LINES)


@dataclass(frozen=True)
class HttpResponse:
    """The parts of a successful response a driver may want."""

    status: int
    body: bytes
    headers: Mapping[str, str]


class HttpClient:
    """One driver's HTTP session: fixed timeout, no redirects, errors as the action model.

    ``headers`` are sent with every request (e.g. ``Authorization``) and are never logged.
    ``verify`` is True, False, or the path of a CA bundle. ``secret_path`` hides URL paths
    in messages (see :func:`redact_url`).
    """

    def __init__(
        self,
        driver: str,
        *,
        timeout: float,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
        secret_path: bool = False,
        user_agent: str = "sn-monitor",
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be greater than 0, got {timeout}")
        self.driver = driver
        self.timeout = timeout
        self.secret_path = secret_path
        # per request, not on the session: requests lets REQUESTS_CA_BUNDLE in the
        # environment override a session's verify, which would drop a configured ca_file
        self.verify = verify
        self.session = requests.Session()
        self.session.headers["User-Agent"] = user_agent
        self.session.headers.update(headers or {})

    def close(self) -> None:
        """Close the pooled connections."""
        self.session.close()

    def where(self, url: str) -> str:
        """The URL as it may appear in logs and messages."""
        return redact_url(url, secret_path=self.secret_path)

    def post(self, url: str, body: bytes, headers: Mapping[str, str] | None = None,
             content_type: str = "application/json") -> HttpResponse:
        """POST ``body``; return the 2xx response or raise Temporary/PermanentError."""
        return self.request("POST", url, body=body,
                            headers={"Content-Type": content_type, **(headers or {})})

    def request(self, method: str, url: str, *, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> HttpResponse:
        """Send one request; every failure becomes TemporaryError or PermanentError."""
        where = self.where(url)
        if self.secret_path:
            REQUEST_LINES.hide_path(url)
        try:
            response = self.session.request(
                method, url, data=body, headers=dict(headers or {}),
                timeout=self.timeout, allow_redirects=False, verify=self.verify,
            )
        except requests.Timeout:
            log.warning("%s: %s %s timed out after %ss", self.driver, method, where,
                        self.timeout)
            raise TemporaryError(f"{method} {where} timed out after {self.timeout}s") from None
        except requests.ConnectionError as err:
            cause = describe_failure(err)
            log.warning("%s: %s %s failed: %s", self.driver, method, where, cause)
            raise TemporaryError(f"{method} {where} failed: {cause}") from None
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema, requests.exceptions.InvalidHeader) as err:
            raise PermanentError(f"{method} {where}: {type(err).__name__}") from None
        except requests.RequestException as err:
            log.warning("%s: %s %s failed: %s", self.driver, method, where,
                        type(err).__name__)
            raise TemporaryError(f"{method} {where} failed: {type(err).__name__}") from None
        with response:
            return self._check(method, where, response)

    def _check(self, method: str, where: str, response: requests.Response) -> HttpResponse:
        status = response.status_code
        if 200 <= status < 300:
            log.debug("%s: %s %s -> %d", self.driver, method, where, status)
            return HttpResponse(status, response.content, dict(response.headers))
        excerpt = _excerpt(response)
        if 300 <= status < 400:
            target = self.where(response.headers.get("Location", ""))
            message = (f"{method} {where} -> {status} redirect to {target}, not followed: "
                       "configure the final URL")
            log.warning("%s: %s", self.driver, message)
            raise PermanentError(message)
        message = f"{method} {where} -> {status}" + (f": {excerpt}" if excerpt else "")
        log.warning("%s: %s", self.driver, message)
        if status >= 500 or status in TEMPORARY_STATUS:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            raise TemporaryError(message, retry_after=retry_after)
        raise PermanentError(message)


def _excerpt(response: requests.Response) -> str:
    """The start of an error body, on one line (servers explain 4xx there)."""
    try:
        text = response.content[: BODY_EXCERPT_CHARS * 4].decode("utf-8", "replace")
    except requests.RequestException:
        return ""
    text = " ".join(text.split())
    return text[:BODY_EXCERPT_CHARS]
