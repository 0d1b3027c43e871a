"""TLS, mutual TLS and who-is-who for reports.

A throwaway CA (trustme) issues the controller's certificate for 127.0.0.1 and the
nodes' client certificates. The controller's app runs in-process on uvicorn with the
reports' lane and the same TLS options, hardening and reloader as the daemon
(:func:`~sn_monitor.controller.security.tls.uvicorn_options`); requests talk to it over loopback.
"""

from __future__ import annotations

import itertools
import logging
import random
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sn_monitor.agent.reporter import Reporter
from sn_monitor.agent.settings import load_agent_settings
from sn_monitor.agent.spool import EventSpool
from sn_monitor.cli import build_parser
from sn_monitor.cli.check_config import check_config
from sn_monitor.client import JobClient
from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.api.statuses import status_of
from sn_monitor.controller.errors import ControllerError
from sn_monitor.controller.security.auth import Identity, TokenBook
from sn_monitor.controller.security.peer_identity import (
    AgentAuth,
    ClientCertificate,
    certificate_node,
    report_identity,
)
from sn_monitor.controller.security.tls import (
    TlsSettings,
    uvicorn_options,
)
from sn_monitor.controller.settings import load_controller_settings
from tests.support.api import ADMIN, AGENT, READ, write_tokens
from tests.support.harness import Harness
from tests.support.reporter import snapshot
from tests.support.tls import T0, Pki, Server, fingerprint, served_fingerprint

_sequence = itertools.count(1)


# ------------------------------------------------------------------------------ PKI


# --------------------------------------------------------------------------- server


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


@pytest.fixture
def serve(harness: Harness, tmp_path: Path) -> Iterator[Any]:
    """``serve(tls, certificates=..., agent_auth=...)`` -> a running :class:`Server`."""
    servers: list[Server] = []
    tokens = TokenBook.load(write_tokens(tmp_path))

    def start(tls: TlsSettings | None, agent_auth: AgentAuth = "either") -> Server:
        app = build_app(harness.controller, tokens, 64 * 1024,
                        certificates=tls is not None and tls.verifies_clients,
                        agent_auth=agent_auth)
        servers.append(Server(app, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def tls_settings(pki: Pki, client_certs: str | None = "optional", **extra: Any) -> TlsSettings:
    cert, key = pki.server()
    if client_certs is None:
        return TlsSettings(cert_file=str(cert), key_file=str(key), **extra)
    return TlsSettings(cert_file=str(cert), key_file=str(key),
                       client_ca_file=str(pki.ca_file),
                       client_certs=client_certs, **extra)  # type: ignore[arg-type]


def post_report(server: Server, node: str, *, token: str | None = None,
                cert: tuple[Path, Path] | None = None, verify: Path | bool = True,
                headers: dict[str, str] | None = None) -> requests.Response:
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    body = (b'{"node": "%s", "instance": "i1", "sequence": %d, "sample_time_seconds": %f, '
            b'"interval_seconds": 1.0, "gpus": []}') % (node.encode(), next(_sequence), T0)
    return requests.post(f"{server.url}/api/v1/reports", data=body, headers=sent,
                         timeout=10, verify=str(verify) if isinstance(verify, Path) else verify,
                         cert=(str(cert[0]), str(cert[1])) if cert else None)


# ----------------------------------------------------------------- plain HTTP and TLS


def test_plain_http_still_works_without_tls(serve):
    server = serve(None)
    assert server.url.startswith("http://")
    assert post_report(server, "gpu-1", token=AGENT).status_code == 200
    assert post_report(server, "gpu-1").status_code == 401


def test_tls_with_a_token(serve, pki):
    server = serve(tls_settings(pki, client_certs=None))
    reply = post_report(server, "gpu-1", token=AGENT, verify=pki.ca_file)
    assert reply.status_code == 200, reply.text
    assert post_report(server, "gpu-1", verify=pki.ca_file).status_code == 401
    # a client that does not trust the controller's CA does not talk to it
    with pytest.raises(requests.exceptions.SSLError):
        post_report(server, "gpu-1", token=AGENT)
    # nor does plain HTTP reach the API on the TLS port
    with pytest.raises(requests.RequestException):
        requests.get(server.url.replace("https://", "http://") + "/healthz", timeout=5)


def test_tls_1_2_and_later_with_aead_ciphers(serve, pki):
    server = serve(tls_settings(pki, client_certs=None))
    assert server.reloader is not None
    assert server.reloader._context.minimum_version == ssl.TLSVersion.TLSv1_2
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.version() == "TLSv1.2"
        cipher = tls.cipher()
        assert cipher is not None
        assert "GCM" in cipher[0] or "CHACHA20" in cipher[0]


# ------------------------------------------------------------------- mutual TLS


def test_a_certificate_reports_for_its_own_node_only(serve, pki, harness):
    server = serve(tls_settings(pki))
    own = pki.node("gpu-1")
    reply = post_report(server, "gpu-1", cert=own, verify=pki.ca_file)
    assert reply.status_code == 200, reply.text
    reply = post_report(server, "gpu-2", cert=own, verify=pki.ca_file)
    assert reply.status_code == 403
    assert reply.json()["error"] == "cert:gpu-1 may not report for node gpu-2"
    assert [n["name"] for n in harness.controller.list_nodes()] == ["gpu-1"]


def test_a_node_named_by_its_cn_when_it_has_no_dns_name(serve, pki):
    server = serve(tls_settings(pki))
    cert = pki.issue("by-cn", "10.1.2.3", common_name="gpu-7")
    assert post_report(server, "gpu-7", cert=cert, verify=pki.ca_file).status_code == 200
    assert post_report(server, "gpu-8", cert=cert, verify=pki.ca_file).status_code == 403


def test_a_certificate_for_two_nodes_names_none(serve, pki):
    server = serve(tls_settings(pki))
    cert = pki.issue("two", "gpu-1", "gpu-2")
    reply = post_report(server, "gpu-1", cert=cert, verify=pki.ca_file)
    assert reply.status_code == 403
    assert "names no node" in reply.json()["error"]


def test_token_and_certificate_must_agree(serve, pki):
    server = serve(tls_settings(pki))
    own = pki.node("gpu-1")
    assert post_report(server, "gpu-1", token=AGENT, cert=own,
                       verify=pki.ca_file).status_code == 200
    # the token may report for gpu-2, the certificate may not
    reply = post_report(server, "gpu-2", token=AGENT, cert=own, verify=pki.ca_file)
    assert reply.status_code == 403
    assert reply.json()["error"] == "fleet-agents+cert:gpu-1 may not report for node gpu-2"
    # the token (nodes gpu-*) may not report for the certificate's node
    other = pki.node("cpu-9")
    reply = post_report(server, "cpu-9", token=AGENT, cert=other, verify=pki.ca_file)
    assert reply.status_code == 403
    assert "may not report for node cpu-9, the node of the client certificate" in \
        reply.json()["error"]
    # an unknown token is refused even next to a good certificate; a read token may not report
    assert post_report(server, "gpu-1", token="x" * 32, cert=own,
                       verify=pki.ca_file).status_code == 401
    assert post_report(server, "gpu-1", token=READ, cert=own,
                       verify=pki.ca_file).status_code == 403


@pytest.mark.parametrize(
    ("agent_auth", "token", "cert", "status"),
    [("either", True, False, 200), ("either", False, True, 200),
     ("either", False, False, 401), ("both", True, False, 401), ("both", False, True, 401),
     ("both", True, True, 200), ("cert", True, False, 401), ("cert", False, True, 200),
     ("token", False, True, 401), ("token", True, True, 200)],
)
def test_what_a_report_needs(serve, pki, agent_auth, token, cert, status):
    server = serve(tls_settings(pki, agent_auth=agent_auth), agent_auth=agent_auth)
    reply = post_report(server, "gpu-1", token=AGENT if token else None,
                        cert=pki.node("gpu-1") if cert else None, verify=pki.ca_file)
    assert reply.status_code == status, reply.text


def test_the_asgi_path_sees_the_certificate_too(serve, pki):
    """``Expect: 100-continue`` takes uvicorn's ASGI path instead of the lane."""
    server = serve(tls_settings(pki))
    own = pki.node("gpu-1")
    for node, status in (("gpu-1", 200), ("gpu-2", 403)):
        reply = post_report(server, node, cert=own, verify=pki.ca_file,
                            headers={"Expect": "100-continue"})
        assert reply.status_code == status, reply.text


def test_operators_keep_using_tokens(serve, pki):
    server = serve(tls_settings(pki))
    nodes = f"{server.url}/api/v1/nodes"
    reply = requests.get(nodes, headers={"Authorization": f"Bearer {READ}"}, timeout=10,
                         verify=str(pki.ca_file))
    assert reply.status_code == 200
    # a node's certificate is no operator's credential
    cert = tuple(map(str, pki.node("gpu-1")))
    assert requests.get(nodes, timeout=10, verify=str(pki.ca_file),
                        cert=cert).status_code == 401  # type: ignore[arg-type]


def test_required_client_certificates_refuse_the_handshake_without_one(serve, pki):
    server = serve(tls_settings(pki, client_certs="required"))
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        post_report(server, "gpu-1", token=AGENT, verify=pki.ca_file)
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        # TLS 1.3: the client's side of the handshake ends before the server's verdict,
        # which arrives as an alert (or a closed connection) instead of an answer
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = tls.recv(1024)
        except (ssl.SSLError, ConnectionResetError):
            answer = b""
        assert answer == b""
    assert post_report(server, "gpu-1", cert=pki.node("gpu-1"),
                       verify=pki.ca_file).status_code == 200


def test_a_certificate_from_another_ca_is_refused(serve, pki, tmp_path):
    server = serve(tls_settings(pki))
    stranger = Pki(tmp_path / "other").node("gpu-1")
    with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        post_report(server, "gpu-1", cert=stranger, verify=pki.ca_file)


# -------------------------------------------------------------------- reload


def test_reload_serves_the_new_certificate_to_new_connections(serve, pki, caplog):
    tls = tls_settings(pki, client_certs=None)
    server = serve(tls)
    old = fingerprint(Path(tls.cert_file))
    assert served_fingerprint(server.port, pki.ca_file) == old
    keep = requests.Session()
    healthz = {"url": f"{server.url}/healthz", "timeout": 5, "verify": str(pki.ca_file)}
    assert keep.get(**healthz).status_code == 200

    renewed = pki.ca.issue_cert("127.0.0.1")
    renewed.cert_chain_pems[0].write_to_path(tls.cert_file)
    renewed.private_key_pem.write_to_path(tls.key_file)
    assert served_fingerprint(server.port, pki.ca_file) == old  # nothing until reloaded
    with caplog.at_level(logging.INFO, logger="sn_monitor.controller.security.tls"):
        assert server.reload()
    new = fingerprint(Path(tls.cert_file))
    assert new != old
    assert served_fingerprint(server.port, pki.ca_file) == new
    assert f"sha256 {new}" in caplog.text
    # the connection opened before goes on with the certificate it started with
    assert keep.get(**healthz).status_code == 200
    keep.close()


def test_a_bad_pair_keeps_the_old_certificate(serve, pki, caplog):
    tls = tls_settings(pki, client_certs=None)
    server = serve(tls)
    old = fingerprint(Path(tls.cert_file))
    pki.ca.issue_cert("127.0.0.1").cert_chain_pems[0].write_to_path(tls.cert_file)
    with caplog.at_level(logging.ERROR, logger="sn_monitor.controller.security.tls"):
        assert not server.reload()
    assert "TLS certificate not reloaded, the old one stays" in caplog.text
    assert "KEY_VALUES_MISMATCH" in caplog.text or "key values mismatch" in caplog.text
    assert served_fingerprint(server.port, pki.ca_file) == old
    Path(tls.key_file).write_text("not a key\n")
    assert not server.reload()
    Path(tls.cert_file).unlink()
    assert not server.reload()
    assert served_fingerprint(server.port, pki.ca_file) == old
    assert "PRIVATE KEY" not in caplog.text


# --------------------------------------------------------------- who is who, pure


@pytest.mark.parametrize(
    ("peercert", "node", "problem"),
    [({"subject": ((("commonName", "gpu-1"),),)}, "gpu-1", ""),
     ({"subject": ((("commonName", "x"),),), "subjectAltName": (("DNS", "gpu-2"),)},
      "gpu-2", ""),
     ({"subjectAltName": (("DNS", "gpu-2"), ("IP Address", "10.0.0.2"))}, "gpu-2", ""),
     ({"subjectAltName": (("DNS", "gpu-2"), ("DNS", "gpu-2"))}, "gpu-2", ""),
     ({"subjectAltName": (("DNS", "gpu-1"), ("DNS", "gpu-2"))}, None, "2 DNS names"),
     ({"subject": ((("commonName", "gpu-*"),),)}, None, "not a node name"),
     ({"subjectAltName": (("DNS", "*.example"),)}, None, "not a node name"),
     ({"subject": ((("commonName", "gpu-[12]"),),)}, None, "not a node name"),
     ({"subject": ((("organizationName", "acme"),),)}, None, "not exactly one CN"),
     ({"subject": ((("commonName", "a"),), (("commonName", "b"),))}, None,
      "not exactly one CN")],
)
def test_the_node_a_certificate_names(peercert, node, problem):
    found = certificate_node(peercert)
    assert found.node == node
    assert problem in found.problem


def test_a_certificate_identity_reports_for_its_node_only():
    identity = ClientCertificate("gpu-1").identity()
    assert identity == Identity("cert:gpu-1", "agent", ("gpu-1",))
    assert identity.may_report_for("gpu-1")
    assert not identity.may_report_for("gpu-10")
    assert not identity.at_least("read")


def test_without_a_token_file_a_bearer_header_counts_for_nothing():
    cert = ClientCertificate("gpu-1")
    assert report_identity(None, f"Bearer {ADMIN}", cert, "either").name == "cert:gpu-1"
    with pytest.raises(ControllerError) as caught:
        report_identity(None, f"Bearer {ADMIN}", None, "either")
    assert status_of(caught.value) == 401


# ---------------------------------------------------------------------- settings


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_controller_tls_settings_are_checked_at_load(pki, tmp_path):
    cert, key = pki.server()
    good = write_config(tmp_path / "c.yaml", f"""\
listen: 127.0.0.1:9848
tls:
  cert_file: {cert}
  key_file: {key}
  client_ca_file: {pki.ca_file}
""")
    tls = load_controller_settings(good).tls
    assert tls is not None
    assert tls.client_cert_mode == "optional"
    assert tls.agent_auth == "either"
    assert uvicorn_options(tls)["ssl_cert_reqs"] == ssl.CERT_OPTIONAL
    cases = {
        f"tls:\n  cert_file: {tmp_path}/missing.crt\n  key_file: {key}\n":
            f":2: tls.cert_file: no such file: {tmp_path}/missing.crt",
        f"tls:\n  cert_file: {cert}\n  key_file: {key}\n  client_ca_file: {key}\n":
            ":4: tls.client_ca_file: not a PEM file of CA certificates",
        f"tls:\n  cert_file: {cert}\n  key_file: {key}\n  client_certs: required\n":
            ":1: tls: client_certs: required needs a client_ca_file",
        f"tls:\n  cert_file: {cert}\n  key_file: {key}\n  agent_auth: cert\n":
            ":1: tls: agent_auth: cert needs client certificates",
        f"tls:\n  key_file: {key}\n": ":1: tls: missing required key 'cert_file'",
        f"tls:\n  cert_file: {cert}\n  key_file: {key}\n  client_certs: maybe\n":
            ":4: tls.client_certs: must be one of none, optional, required",
    }
    other_key = pki.server("other")[1]
    cases[f"tls:\n  cert_file: {cert}\n  key_file: {other_key}\n"] = \
        ":1: tls: " + f"{cert} and {other_key} are not a certificate and its key"
    for text, message in cases.items():
        path = write_config(tmp_path / "bad.yaml", text)
        with pytest.raises(ConfigError) as caught:
            load_controller_settings(path)
        assert f"{path}{message}" in str(caught.value), text


def test_agent_tls_settings_are_checked_at_load(pki, tmp_path, capsys):
    cert, key = pki.node("gpu-1")
    good = write_config(tmp_path / "agent.yaml", f"""\
node: gpu-1
controller:
  url: https://127.0.0.1:9848
  ca_file: {pki.ca_file}
  cert_file: {cert}
  key_file: {key}
""")
    controller = load_agent_settings(good).controller
    assert controller.client_cert == (str(cert), str(key))
    bad = write_config(tmp_path / "bad-agent.yaml", f"""\
node: gpu-1
controller:
  url: https://127.0.0.1:9848
  ca_file: {tmp_path}/nope.pem
""")
    half = write_config(tmp_path / "half.yaml", f"controller:\n  cert_file: {cert}\n")
    assert check_config([good, bad, half]) == 2
    out = capsys.readouterr()
    assert f"{good}: ok (agent config)" in out.out
    assert f"{bad}:4: controller.ca_file: no such file: {tmp_path}/nope.pem" in out.err
    assert f"{half}:1: controller: give both cert_file and key_file, or neither" in out.err


def test_check_config_tells_a_controller_config_with_tls(pki, tmp_path, capsys):
    cert, key = pki.server()
    path = write_config(tmp_path / "c.yaml", f"tls: {{cert_file: {cert}, key_file: {key}}}\n")
    assert check_config([path]) == 0
    assert "ok (controller config)" in capsys.readouterr().out


# ----------------------------------------------------------------- agent side


def test_the_reporter_reports_over_mutual_tls(serve, pki, tmp_path):
    server = serve(tls_settings(pki, client_certs="required", agent_auth="cert"),
                   agent_auth="cert")
    clock = ManualClock(T0)
    cert, key = pki.node("gpu-node-017")
    reporter = Reporter(server.url, None, "gpu-node-017", {}, clock,
                        EventSpool(tmp_path / "spool", clock=clock), rng=random.Random(0),
                        verify=str(pki.ca_file), cert=(str(cert), str(key)))
    try:
        reporter.report(snapshot(clock))
        assert reporter.failures_total == 0
        assert reporter.last_success_wall == T0
        assert reporter.streaming  # the stream is opened over TLS, the certificate names it
        clock.advance(1.0)
        reporter.report(snapshot(clock))
        assert reporter.failures_total == 0
    finally:
        reporter.close()


def test_the_job_client_takes_a_ca_file(serve, pki, tmp_path):
    server = serve(tls_settings(pki))
    env = {"SN_CONTROLLER_URL": server.url, "SN_JOB": "no-such-job",
           "SN_CA_FILE": str(pki.ca_file)}
    token = tmp_path / "agent.token"
    token.write_text(AGENT + "\n")
    client = JobClient.from_env({**env, "SN_TOKEN_FILE": str(token)})
    try:
        assert client.restore_point() is None  # the controller's 404: no such job
        assert (client.requests_total, client.failures_total) == (1, 0)
    finally:
        client.close()
    untrusting = JobClient.from_env({**env, "SN_CA_FILE": ""})
    try:
        assert untrusting.restore_point() is None
        assert untrusting.requests_total == 0  # refused the controller's certificate
    finally:
        untrusting.close()
    with pytest.raises(ValueError, match="SN_CA_FILE"):
        JobClient.from_env({**env, "SN_CA_FILE": str(tmp_path / "nope.pem")})


# ------------------------------------------------------------ nothing secret on argv


@pytest.mark.parametrize("command", ["agent", "controller", "simulate"])
def test_a_token_goes_on_the_command_line_only_as_a_file(command):
    parser = build_parser()
    subparser = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    options = {o for action in subparser._actions for o in action.option_strings}
    assert {o for o in options if "token" in o or "secret" in o or "key" in o} == \
        {"--token-file"}
    extra = ["--controller", "http://x"] if command == "simulate" else []
    with pytest.raises(SystemExit):  # not an abbreviation of --token-file
        parser.parse_args([command, *extra, "--token", "s3cret-value-0123456789"])


def test_simulate_reports_to_a_tls_controller_with_its_own_ca(serve, pki):
    """``sn-monitor simulate --ca-file``: the fleet verifies the controller's certificate."""
    from sn_monitor.sim.fleet import Fleet, FleetOptions

    server = serve(tls_settings(pki, client_certs=None), agent_auth="token")
    options = FleetOptions(controller=server.url, nodes=4, interval=0.2, duration=1.5,
                           token=ADMIN, ca_file=str(pki.ca_file), jitter=0.0)
    stats = Fleet(options).run()
    assert stats.accepted >= 4
    assert stats.failed == 0
    untrusted = Fleet(FleetOptions(controller=server.url, nodes=1, interval=0.2,
                                   duration=0.5, token=ADMIN, jitter=0.0)).run()
    assert untrusted.accepted == 0
    assert untrusted.connection_errors >= 1
    with pytest.raises(ValueError, match="--ca-file"):
        Fleet(FleetOptions(controller=server.url, ca_file=str(pki.root / "missing.pem")))
