"""What every HTTP client says when a request got no answer, and which URLs it takes."""

from __future__ import annotations

import errno
import re
import socket
import ssl

import pytest
import requests

from sn_monitor.transport import check_http_url, describe_failure
from tests.drivers.servers import RecordingHTTPServer

SECRET = "tok-3f9a"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def raised(url: str, timeout: float = 5.0) -> requests.RequestException:
    with pytest.raises(requests.RequestException) as caught:
        requests.get(url, timeout=timeout)
    return caught.value


def test_a_closed_port_is_connection_refused() -> None:
    err = raised(f"http://127.0.0.1:{closed_port()}/api?token={SECRET}")
    assert describe_failure(err) == "connection refused"


def test_no_answer_is_timed_out(listening_port: int) -> None:
    err = raised(f"http://127.0.0.1:{listening_port}/api?token={SECRET}", timeout=0.2)
    assert describe_failure(err) == "timed out"


def test_tls_to_a_plain_http_server_is_a_tls_failure(server: RecordingHTTPServer) -> None:
    err = raised(server.url.replace("http://", "https://") + f"/api?token={SECRET}")
    assert describe_failure(err) == "TLS: the server does not speak TLS (an http:// URL?)"


def test_a_url_without_scheme_is_said_so() -> None:
    assert describe_failure(raised("127.0.0.1:9848")) == "not an http:// or https:// URL"


def _wrapped(cause: BaseException) -> requests.ConnectionError:
    """As requests raises it: its text quotes the URL; the socket's error is underneath."""
    err = requests.ConnectionError(f"HTTPConnectionPool: /api?token={SECRET} failed")
    err.__cause__ = cause
    return err


@pytest.mark.parametrize(("cause", "words"), [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "name does not resolve"),
    (socket.gaierror(socket.EAI_AGAIN, "Temporary failure"),
     "name does not resolve (DNS did not answer)"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "connection refused"),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "connection reset"),
    (OSError(errno.EHOSTUNREACH, "No route to host"), "no route to host"),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), "network unreachable"),
    (TimeoutError("timed out"), "timed out"),
    (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "TLS: "),
    (OSError(errno.EMFILE, "Too many open files"), "too many open files"),
])
def test_the_socket_error_under_a_request_is_said_in_words(cause: BaseException,
                                                          words: str) -> None:
    said = describe_failure(_wrapped(cause))
    assert said.startswith(words)
    assert SECRET not in said


def test_an_error_with_no_cause_is_its_type_never_its_text() -> None:
    err = requests.ConnectionError(f"HTTPConnectionPool: /api?token={SECRET} failed")
    assert describe_failure(err) == "ConnectionError"


@pytest.mark.parametrize("url", ["http://ctl:9848", "https://10.0.0.1", "http://[::1]:9848/x"])
def test_http_urls_pass(url: str) -> None:
    check_http_url(url)


@pytest.mark.parametrize(("url", "message"), [
    ("127.0.0.1:9848", "expected an http:// or https:// URL, got '127.0.0.1:9848' "
                       "(did you mean 'http://127.0.0.1:9848'?)"),
    ("ctl", "(did you mean 'http://ctl'?)"),
    ("ftp://ctl", "expected an http:// or https:// URL, got 'ftp://ctl'"),
    ("http://", "the URL names no host"),
    ("http://ctl:0", "the port must be 1-65535"),
    ("http://ctl:99999", "invalid URL: port out of range"),
    (f"ftp://u:{SECRET}@ctl/", "got 'ftp://ctl/'"),  # user info never shown
])
def test_bad_urls_say_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        check_http_url(url)
    assert SECRET not in str(caught.value)
