"""Reports posted: ``POST {url}/api/v1/reports`` over one keep-alive session.

The session (``requests``) is made for the first posted report: an agent whose reports go
on a stream never imports requests (~16 MB of its RSS). Imports :mod:`.failover` and
:mod:`.replies`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sn_monitor.agent.reporter.failover import Controllers
from sn_monitor.agent.reporter.replies import Failure, Reply, decode_reply
from sn_monitor.transport import describe_failure, error_text, is_standby, parse_retry_after

if TYPE_CHECKING:
    import requests

REPORTS_PATH = "/api/v1/reports"
_MAX_ERROR_TEXT = 500


class ReportPoster:
    """Posts a report to the current controller of ``controllers``.

    ``verify`` is the CA bundle (None: the session's and the environment's default),
    ``cert`` the client certificate and key; ``session`` one to use (and not close).
    """

    def __init__(self, controllers: Controllers, token: str | None, timeout: float, *,
                 verify: bool | str | None, cert: tuple[str, str] | None,
                 session: requests.Session | None) -> None:
        self._controllers = controllers
        self._token = token
        self._timeout = timeout
        # Per request, not on the session: requests lets REQUESTS_CA_BUNDLE override a
        # session's ``verify``.
        self._verify = verify
        self._cert = cert
        self._owns_session = session is None
        #: Made for the first posted report (None: none posted yet).
        self.session = session

    @property
    def endpoint(self) -> str:
        return self._controllers.url + REPORTS_PATH

    def attempt(self, body: bytes) -> Reply | Failure:
        """POST the report: the reply when accepted, else the failure."""
        import requests  # only once a controller without streams is met

        if self.session is None:
            self.session = requests.Session()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        named = self._controllers.named
        try:
            response = self.session.post(
                self.endpoint, data=body, headers=headers, timeout=self._timeout,
                verify=self._verify, cert=self._cert, allow_redirects=False,
            )
        except requests.RequestException as err:
            return Failure(f"{named()} unreachable: {describe_failure(err)}", fail_over=True)
        status = response.status_code
        if not 200 <= status < 300:
            return self._controllers.refused(
                status,
                error_text(response.content, _MAX_ERROR_TEXT) or response.reason or "",
                parse_retry_after(response.headers.get("Retry-After")),
                standby=is_standby(status, response.headers),
            )
        return decode_reply(response.content, named())

    def close(self) -> None:
        if self._owns_session and self.session is not None:
            self.session.close()
