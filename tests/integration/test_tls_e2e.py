"""TLS end to end: a controller process serving HTTPS, agent processes with client
certificates, a certificate reload by SIGHUP, and no secret in any process's log.

Certificates come from a throwaway CA (trustme); everything is on 127.0.0.1.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.cluster import Cluster, ClusterTls
from tests.support.tls import Pki, fingerprint, served_fingerprint

pytestmark = pytest.mark.integration


def test_agents_report_over_mutual_tls_and_a_sighup_reloads_the_certificate(tmp_path: Path):
    pki = Pki(tmp_path / "pki")
    cert_file, key_file = pki.server()
    own = pki.node("sim-0")
    tls = ClusterTls(pki.ca_file, cert_file, key_file,
                     settings={"client_certs": "optional", "agent_auth": "cert"},
                     # sim-1 holds sim-0's certificate: its reports name another node
                     agent_certs={"sim-0": own, "sim-1": own}, agent_tokens=False)
    with Cluster(tmp_path / "cluster", nodes=2, tls=tls) as cluster:
        cluster.start_controller()
        for agent in cluster.agents.values():
            agent.start()
        cluster.wait_reporting(["sim-0"])
        impostor = cluster.agents["sim-1"]
        cluster.wait_for(lambda: "cert:sim-0 may not report for node sim-1" in impostor.tail(),
                         30, "sim-1's report refused")
        nodes = {n["name"] for n in cluster.get("/api/v1/nodes")["nodes"]}
        assert nodes == {"sim-0"}

        old = fingerprint(cert_file)
        assert served_fingerprint(cluster.port, pki.ca_file) == old
        renewed = pki.ca.issue_cert("127.0.0.1")
        renewed.cert_chain_pems[0].write_to_path(str(cert_file))
        renewed.private_key_pem.write_to_path(str(key_file))
        new = fingerprint(cert_file)
        assert new != old
        assert cluster.controller.popen is not None
        cluster.controller.popen.send_signal(signal.SIGHUP)
        cluster.wait_for(lambda: served_fingerprint(cluster.port, pki.ca_file) == new, 30,
                         "the new certificate on a new connection")
        assert "TLS certificate reloaded" in cluster.controller.tail(200)
        # the agent's connection is made again, against the new certificate, and goes on
        cluster.agents["sim-0"].kill(signal.SIGTERM)
        cluster.agents["sim-0"].start()
        cluster.wait_reporting(["sim-0"], fresher_than=2.0)
        assert cluster.controller.running


def test_tokens_and_certificates_together_and_no_secret_in_any_log(tmp_path: Path):
    pki = Pki(tmp_path / "pki")
    cert_file, key_file = pki.server()
    tls = ClusterTls(pki.ca_file, cert_file, key_file,
                     settings={"client_certs": "optional", "agent_auth": "both"},
                     agent_certs={"sim-0": pki.node("sim-0"), "sim-1": pki.node("sim-1")})
    with Cluster(tmp_path / "cluster", nodes=2, tls=tls) as cluster:
        cluster.start()
        assert {n["name"] for n in cluster.get("/api/v1/nodes")["nodes"]} == {"sim-0", "sim-1"}
        for agent in cluster.agents.values():
            agent.kill(signal.SIGTERM)
        cluster.controller.kill(signal.SIGTERM)
        operate_token = cluster.operate_token_file.read_text().strip()
        key_lines = [line for path in [key_file, *pki.root.glob("sim-*.key")]
                     for line in path.read_text().splitlines() if "-----" not in line]
        assert key_lines
        leaks = cluster.logs_containing(cluster.agent_token, cluster.admin_token,
                                        operate_token, *key_lines)
        assert leaks == [], f"secrets in {leaks}\n{cluster.logs()}"
        # the logs are there to be searched: they name what happened, not the secrets
        assert "controller serving HTTPS" in cluster.controller.tail(200)
