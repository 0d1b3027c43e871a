"""A small HTTP/1.1 server on its own thread, for the agent's and the fleet view's endpoints.

Keep-alive (Prometheus and dashboards keep their connections open), a thread per
connection, idle connections closed after :data:`IDLE_TIMEOUT_SECONDS`, Nagle's algorithm
off (a reply is two writes, headers then body: with Nagle the body's last segment waits
for the client's delayed ACK, 40 ms on a kept-alive connection), request lines logged at
debug level only. Each server subclasses :class:`QuietHandler` with its routes.

Every server of sn-monitor (this one, and the controller's uvicorn through
:func:`listening_socket`) binds its address before it says it serves, and a bind that
fails is a :class:`ListenError` naming the address and why, in words: the commands
print it and exit 2, never a traceback.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from sn_monitor.errors import SnMonitorError

log = logging.getLogger(__name__)

IDLE_TIMEOUT_SECONDS: Final = 300.0
#: Connections waiting to be accepted (uvicorn's default).
BACKLOG: Final = 2048


class ListenError(SnMonitorError):
    """The address to serve on cannot be bound; the message names it and says why."""


def listen_failure(host: str, port: int, err: BaseException) -> ListenError:
    """The :class:`ListenError` for a bind of ``host:port`` that raised ``err``."""
    if isinstance(err, socket.gaierror):
        why = "the host name does not resolve"
    elif isinstance(err, OSError) and err.errno == errno.EADDRINUSE:
        why = (f"address already in use: another process listens there "
               f"(ss -ltnp 'sport = :{port}' names it)")
    elif isinstance(err, OSError) and err.errno == errno.EACCES:
        why = "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
    elif isinstance(err, OSError) and err.errno == errno.EADDRNOTAVAIL:
        why = "no network interface of this machine has that address"
    elif isinstance(err, OSError) and err.strerror:
        why = err.strerror[0].lower() + err.strerror[1:]
    else:
        why = str(err) or type(err).__name__
    shown = f"[{host}]" if ":" in host else host
    return ListenError(f"cannot listen on {shown}:{port}: {why}")


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening; :class:`ListenError` if it cannot.

    For servers that take a bound socket (uvicorn's ``run(sockets=...)``): the bind
    fails before anything else starts, and connections made before the server runs wait
    in the backlog instead of being refused.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise listen_failure(host, port, err) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as err:
        sock.close()
        raise listen_failure(host, port, err) from None
    return sock


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; :meth:`answer` writes one whole reply."""

    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_SECONDS
    disable_nagle_algorithm = True

    def answer(self, code: int, media: str, data: bytes,
               headers: list[tuple[str, str]] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers or ():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class ThreadedServer:
    """``handler`` served on ``host:port`` from a daemon thread named ``name``."""

    def __init__(self, host: str, port: int, handler: type[QuietHandler], name: str) -> None:
        """Bind ``host:port`` now (:class:`ListenError` if it cannot); serve from :meth:`start`."""
        server = _Server6 if ":" in host else _Server  # an IPv6 address ([::1]:9847)
        try:
            self._server = server((host, port), handler)
        except (OSError, OverflowError) as err:  # OverflowError: a port past 65535
            raise listen_failure(host, port, err) from None
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when asked for port 0)."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name=self._name,
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6
