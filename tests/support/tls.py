"""A throwaway PKI (a CA, server and client certificates) and a real controller serving
HTTPS on loopback, for every test of TLS, mutual TLS and certificate reloads."""

from __future__ import annotations

import concurrent.futures
import hashlib
import socket
import ssl
import threading
import time
from pathlib import Path

import trustme
import uvicorn

from sn_monitor.clock import ManualClock
from sn_monitor.controller.api.app import ControllerApp
from sn_monitor.controller.api.report_lane import report_lane
from sn_monitor.controller.process.server import NotifyingServer
from sn_monitor.controller.security.tls import (
    CertificateReloader,
    TlsSettings,
    describe_certificate,
    harden,
    uvicorn_options,
)
from sn_monitor.notify import SystemdNotifier

T0 = 1_700_000_000.0


class Pki:
    """A throwaway CA and the certificates it issues, as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.ca_file = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def issue(self, name: str, *identities: str,
              common_name: str | None = None) -> tuple[Path, Path]:
        leaf = self.ca.issue_cert(*identities, common_name=common_name)
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return cert, key

    def server(self, name: str = "server") -> tuple[Path, Path]:
        return self.issue(name, "127.0.0.1")

    def node(self, node: str) -> tuple[Path, Path]:
        return self.issue(node, node)


def fingerprint(cert: Path) -> str:
    return describe_certificate(str(cert)).removeprefix("sha256 ")


def served_fingerprint(port: int, ca_file: Path,
                       client: tuple[Path, Path] | None = None) -> str:
    """The SHA-256 of the certificate the server presents on a new connection."""
    context = ssl.create_default_context(cafile=str(ca_file))
    if client is not None:
        context.load_cert_chain(*map(str, client))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


class Server:
    """The controller's app on uvicorn, as the daemon serves it (with the reports' lane,
    and TLS when ``tls`` is given), in a thread."""

    def __init__(self, app: ControllerApp, tls: TlsSettings | None = None,
                 keep_alive: float = 5.0) -> None:
        # A deadline on the graceful stop, as the daemon has: without one, stop() waits on
        # any keep-alive connection a client leaves open (until the garbage collector
        # happens to close it), and the server's thread outlives the test.
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                access_log=False, lifespan="off", http=report_lane(app.gate),
                                proxy_headers=False, timeout_graceful_shutdown=2,
                                timeout_keep_alive=keep_alive, **uvicorn_options(tls))
        config.load()
        self.reloader: CertificateReloader | None = None
        if tls is not None:
            assert config.ssl is not None
            harden(config.ssl)
            self.reloader = CertificateReloader(config.ssl, tls)
        self.server = NotifyingServer(config, SystemdNotifier(ManualClock(T0), environ={}))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"

    def connect(self) -> socket.socket:
        """A plain TCP connection to it (for raw HTTP/1.1 on the wire)."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def reload(self) -> bool:
        """What SIGHUP does: reload the certificate on the event loop's thread."""
        assert self.reloader is not None
        assert self.server.loop is not None
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        reloader = self.reloader
        self.server.loop.call_soon_threadsafe(lambda: done.set_result(reloader.reload()))
        return done.result(timeout=5)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
