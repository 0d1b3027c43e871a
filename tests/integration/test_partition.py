"""A network partition: six agents as separate hosts, the link to a third of them cut.

Each agent runs in its own network namespace (``ip netns``), joined to the root namespace
by a veth pair whose root end is on a bridge; the controller listens on the bridge's
address, on a private /24 the test picks among those not in use. Cutting the root end of
two veths (``ip link set ... down``) is a partition: those agents keep running and
sampling, but nothing reaches the controller. The controller must see them lost, open
the circuit breaker (2 of 6 nodes faulted together is over its 30 %) and evict nobody
(the command driver's log stays empty, as in cluster.py); once the links are back, the
agents report again and their node-lost incidents close by themselves.

The test creates every namespace, link and address it uses and removes them all on the
way out, failed or not. It skips, saying why, where it cannot: not root, no ``ip``, or a
kernel that refuses ``ip netns add`` (a container without CAP_NET_ADMIN). The node-lost
rule here has a 4 s heartbeat timeout (short, yet longer than a report delayed on a
busy two-core machine), so the whole test takes well under a minute.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import RULES, Cluster

pytestmark = pytest.mark.integration

AGENTS = 6
CUT = ("sim-1", "sim-4")  # a third of them
WAIT = 30.0
PARTITION_RULES = """\
- name: node-lost
  description: The partition test's heartbeat rule (the shipped one waits 10 s).
  heartbeat_timeout: 4s
  severity: critical
  actions: [alert, failover]
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20,
                          check=check)


def _unused_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no address or route of this host overlaps."""
    taken: list[ipaddress.IPv4Network] = []
    for line in (_ip("-4", "-o", "addr", "show").stdout.splitlines()
                 + _ip("-4", "route", "show", "table", "all").stdout.splitlines()):
        for word in line.split():
            with contextlib.suppress(ValueError):
                if word[0].isdigit():
                    taken.append(ipaddress.IPv4Network(word, strict=False))
    pool = list(ipaddress.IPv4Network("10.200.0.0/13").subnets(new_prefix=24))
    random.shuffle(pool)
    for net in pool:
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    pytest.skip("no free private /24 in 10.200.0.0/13 on this host")


@dataclass
class Net:
    """What the test made: a bridge, and per agent a namespace and a veth pair."""

    prefix: str
    subnet: ipaddress.IPv4Network
    bridge: str = ""
    namespaces: dict[str, str] = field(default_factory=dict)  # node -> netns
    root_ends: dict[str, str] = field(default_factory=dict)   # node -> veth in root ns
    addresses: dict[str, str] = field(default_factory=dict)   # node -> its address

    @property
    def controller_address(self) -> str:
        return str(self.subnet.network_address + 1)

    def add_host(self, node: str, index: int) -> None:
        ns, root_end, inner = (f"{self.prefix}-{index}", f"{self.prefix}h{index}",
                               f"{self.prefix}n{index}")
        _ip("netns", "add", ns)
        self.namespaces[node] = ns
        _ip("link", "add", root_end, "type", "veth", "peer", "name", inner)
        self.root_ends[node] = root_end
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", root_end, "master", self.bridge)
        _ip("link", "set", root_end, "up")
        address = str(self.subnet.network_address + 10 + index)
        _ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", inner)
        _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.addresses[node] = address

    def cut(self, node: str) -> None:
        _ip("link", "set", self.root_ends[node], "down")

    def mend(self, node: str) -> None:
        _ip("link", "set", self.root_ends[node], "up")

    def remove(self) -> list[str]:
        """Delete everything made (a netns takes its veth end along); what failed."""
        problems = []
        for ns in self.namespaces.values():
            done = _ip("netns", "del", ns, check=False)
            if done.returncode:
                problems.append(f"netns del {ns}: {done.stderr.strip()}")
        for root_end in self.root_ends.values():
            if _ip("link", "show", root_end, check=False).returncode == 0:
                _ip("link", "del", root_end, check=False)
        if self.bridge:
            done = _ip("link", "del", self.bridge, check=False)
            if done.returncode:
                problems.append(f"link del {self.bridge}: {done.stderr.strip()}")
        return problems


def _can_make_namespaces(prefix: str) -> str | None:
    """None if ``ip netns add`` works here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"{prefix}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"the kernel refused 'ip netns add': {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@pytest.fixture
def net() -> Iterator[Net]:
    prefix = f"snp{os.getpid() % 100000}"
    why = _can_make_namespaces(prefix)
    if why is not None:
        pytest.skip(why)
    made = Net(prefix=prefix, subnet=_unused_subnet())
    try:
        made.bridge = f"{prefix}br"
        _ip("link", "add", made.bridge, "type", "bridge")
        _ip("addr", "add", f"{made.controller_address}/{made.subnet.prefixlen}",
            "dev", made.bridge)
        _ip("link", "set", made.bridge, "up")
        for index in range(AGENTS):
            made.add_host(f"sim-{index}", index)
        yield made
    finally:
        problems = made.remove()
        assert not problems, f"could not remove what the test made: {problems}"


def _place(c: Cluster, net: Net) -> None:
    """Move the controller onto the bridge and each agent into its namespace."""
    c.url = f"http://{net.controller_address}:{c.port}"
    c.urls = [c.url]
    argv = c.controller.argv
    argv[argv.index("--listen") + 1] = f"{net.controller_address}:{c.port}"
    argv[argv.index(str(RULES))] = str(c.root / "partition-rules")
    for name, agent in c.agents.items():
        address = net.addresses[name]
        args = agent.argv
        args[args.index("--controller") + 1] = c.url
        args[args.index("--listen") + 1] = f"{address}:{agent.port}"
        agent.argv = ["ip", "netns", "exec", net.namespaces[name], *args]
        agent.url = f"http://{address}:{agent.port}"


def _open(c: Cluster, rule: str, node: str) -> dict[str, Any] | None:
    found = [i for i in c.incidents(status="open", node=node) if i["rule"] == rule]
    return found[0] if found else None


def test_a_partitioned_third_is_lost_the_breaker_holds_and_it_heals(
        net: Net, tmp_path: Path) -> None:
    rules = tmp_path / "partition-rules"
    rules.mkdir()
    (rules / "partition.yaml").write_text(PARTITION_RULES)
    config = {"settle": "3s",
              "policy": {"breaker": {"window": "30s", "max_faulted": "30%", "min_faulted": 2,
                                     "hold": "10m"}}}
    with Cluster(tmp_path, nodes=AGENTS, gpus=2, config=config) as c:
        _place(c, net)
        c.start(timeout=60)
        # each agent reaches the controller from its own namespace's address
        seen = {g["labels"]["node"]: g["targets"][0].rsplit(":", 1)[0]
                for g in c.get("/api/v1/sd")}
        assert seen == net.addresses, seen

        for name in CUT:
            net.cut(name)

        def all_lost() -> bool:
            return all(_open(c, "node-lost", n) for n in CUT)
        c.wait_for(all_lost, WAIT, f"node-lost incidents for {', '.join(CUT)}")
        health = c.wait_for(lambda: (h := c.get("/healthz"))["breaker"]["open"] and h, WAIT,
                            "the circuit breaker open")
        # "2 of 6 nodes faulted" (more if a report of another node came late meanwhile)
        faulted = re.search(r"(\d+) of (\d+) nodes faulted", health["breaker"]["reason"])
        assert faulted is not None, health
        assert int(faulted[1]) >= len(CUT), health
        assert int(faulted[2]) == AGENTS, health

        def decided() -> list[dict[str, Any]] | None:
            acts = [a for a in c.actions() if a["action"] in ("evict", "failover")
                    and a["node"] in CUT]
            return acts if len(acts) == 2 * len(CUT) and all(
                a["state"] not in ("pending", "running") for a in acts) else None
        c.wait_for(decided, WAIT, "evict and failover decided for the cut nodes")
        for a in c.actions():
            if a["action"] in ("evict", "failover"):
                assert a["state"] == "refused", a
                assert a["verdict"].startswith("circuit breaker open"), a
        assert c.script_calls() == []
        states = {n["name"]: n["state"] for n in c.get("/api/v1/nodes")["nodes"]}
        assert {name for name, state in states.items() if state == "lost"} >= set(CUT)
        for name in CUT:  # cut off, not dead: still sampling on their side
            assert c.agents[name].running, f"{name} died during the partition"

        for name in CUT:
            net.mend(name)

        def healed() -> bool:
            closed = {i["node"] for i in c.incidents(status="closed")
                      if i["rule"] == "node-lost"}
            return set(CUT) <= closed and not any(_open(c, "node-lost", n) for n in CUT)
        c.wait_for(healed, WAIT, "the node-lost incidents closing once the links are back")
        c.wait_reporting(list(c.agents), WAIT)

        def all_healthy() -> dict[str, str] | None:
            states = {n["name"]: n["state"] for n in c.get("/api/v1/nodes")["nodes"]}
            return states if set(states.values()) == {"healthy"} else None
        c.wait_for(all_healthy, WAIT, "every node healthy again")
        assert c.script_calls() == [], "a node was evicted or failed over"
