"""A simulated supernode as real processes: a controller, N agents, one training job.

What ``sn-monitor demo`` runs, on 127.0.0.1, under one state directory:

* ``sn-monitor controller`` with its SQLite store in ``STATE/controller``, the rules
  (the packaged defaults, or ``--rules``) with their holds shortened by the demo's speed,
  a command driver
  for evict / cordon (the launcher, which only records them) and the job's directory;
* one ``sn-monitor agent --simulate G`` per node (``sim-0000`` ...), the real agent code
  on a simulated node whose physics run ``speed`` times faster, on consecutive free
  ports after the controller's, labelled as a real supernode's agents are
  (:func:`node_labels`: supernode ``sn0``, racks of four nodes), so that the
  controller's service discovery, the dashboards' ``$supernode`` and the topology page's
  racks have values;
* a DistributedJob ``demo`` over every node but the last ``spares`` (its spares), run by
  :mod:`sn_monitor.sim.launcher`: one :mod:`sn_monitor.sim.train` rank per node,
  started detached, restarted on the controller's ``restore``. The ranks step at the
  pace the fail-slow faults standing on the job's nodes allow (:mod:`sn_monitor.sim.pace`:
  the supernode writes them to ``STATE/job/pace.json`` as it plays them).

Every child runs in its own session (process group); :meth:`Supernode.close` stops them
all (SIGCONT first, for agents a scenario has frozen, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from sn_monitor.config import parse_duration
from sn_monitor.errors import SnMonitorError
from sn_monitor.rules.spec import packaged_rules, rule_documents
from sn_monitor.sim import launcher
from sn_monitor.sim.fleet import node_name
from sn_monitor.sim.pace import PaceBook
from sn_monitor.sim.slurm_jobs import demo_jobs, write_commands

log = logging.getLogger(__name__)

JOB = "demo"
#: How often one agent may move to another port when another process took its own.
PORT_CONFLICT_RETRIES = 3
#: The shortest hang timeout of the demo's job (wall seconds): a restart's ranks start in
#: seconds on a loaded machine, and a hang is a stall longer than that.
HANG_FLOOR_SECONDS = 15.0
#: The shortest heartbeat timeout of the scaled rules (wall seconds).
HEARTBEAT_FLOOR_SECONDS = 8.0
#: Before the scenario starts, every agent's report at most this old for this long (or
#: at most STEADY_WAIT_SECONDS of waiting): the start of 16 agents and a job's ranks is a
#: burst of CPU, not a fault.
STEADY_AGE_SECONDS = HEARTBEAT_FLOOR_SECONDS / 2
STEADY_FOR_SECONDS = 3.0
STEADY_WAIT_SECONDS = 30.0
#: The fleet-level faults the supernode plays itself (the rest go to POST /sim/fault).
PROCESS_FAULTS = ("node-lost", "node-back", "straggler", "rank-error")
#: The signal that makes a demo rank fail each way (:data:`sn_monitor.sim.train.INJECTED_ERRORS`).
RANK_ERROR_SIGNALS = {"app-bug": signal.SIGUSR1, "ecc-error": signal.SIGUSR2}
#: The supernode's name on every agent (deploy/prometheus/prometheus-demo.yml gives the
#: controller's series the same).
SUPERNODE = "sn0"
#: Nodes a rack: an 8-GPU HGX server draws about 10 kW, four fill an air-cooled rack.
NODES_PER_RACK = 4


class SupernodeError(RuntimeError, SnMonitorError):
    """The supernode could not be started (a port taken, a process that died, ...)."""


class PortTaken(SupernodeError):
    """The controller's address is in use: a bad ``--listen``, not a failure to start."""


@dataclass(frozen=True)
class SupernodeOptions:
    """The size and pace of the simulated supernode."""

    state_dir: Path
    nodes: int = 16
    gpus: int = 8
    spares: int = 2
    speed: float = 10.0
    listen: str = "127.0.0.1:9848"
    step_time: float = 0.1
    checkpoint_every: int = 20
    #: Rule files or directories (default: the rules packaged with sn-monitor).
    rules: tuple[Path, ...] = ()


def node_labels(index: int) -> dict[str, str]:
    """The labels of the supernode's ``index``-th node: ``{supernode: sn0, rack: r00}``.

    Racks fill in node order, :data:`NODES_PER_RACK` nodes each: the job's spares (the
    last nodes) share the last rack.
    """
    return {"supernode": SUPERNODE, "rack": f"r{index // NODES_PER_RACK:02d}"}


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now.

    Probed as the servers bind (uvicorn, like every asyncio server, sets SO_REUSEADDR):
    the sockets a previous run left in TIME_WAIT do not make the port look taken.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections (Linux: ip_local_port_range)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return range(0)
    return range(low, high + 1)


def free_ports(host: str, after: int, count: int) -> list[int]:
    """``count`` consecutive-ish free ports above ``after`` (taken ones are skipped).

    Outside the ephemeral range: between the probe and the agent's bind, an agent
    started earlier could take such a port for its connection to the controller.
    """
    ports: list[int] = []
    ephemeral = ephemeral_ports()
    port = after + 1
    while len(ports) < count:
        if port in ephemeral:
            port = ephemeral.stop
        if port > 65535:
            raise SupernodeError(f"not enough free ports above {after}")
        if port_free(host, port):
            ports.append(port)
        port += 1
    return ports


def scaled_rules(sources: Sequence[Path], speed: float) -> list[dict[str, Any]]:
    """The rules of ``sources`` (files or directories), holds divided by ``speed``.

    ``for`` holds and heartbeat timeouts shrink (never below 1 s, heartbeats never below
    :data:`HEARTBEAT_FLOOR_SECONDS`): the demo compresses time, and a 2-minute straggler
    hold would outlast it; the agents still report once a wall second, and on a busy
    machine a few seconds of silence is load, not a lost node.
    """
    rules: list[dict[str, Any]] = []
    for doc in rule_documents(sources):
        for rule in doc.data or []:
            rule = dict(rule)
            for key, floor in (("for", 1.0), ("heartbeat_timeout", HEARTBEAT_FLOOR_SECONDS)):
                if key in rule:
                    seconds = parse_duration(rule[key])
                    rule[key] = f"{min(seconds, max(floor, seconds / speed)):g}s"
            rules.append(rule)
    return rules


class Child:
    """One child process in its own session, its output in a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None
        self.frozen = False

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv, cwd=self.log_path.parent, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env=self.env)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            return f"(no log: {err})"
        return "\n".join(text.splitlines()[-lines:])


class Supernode:
    """The controller, the agents and the job; start, break, read, close."""

    def __init__(self, options: SupernodeOptions) -> None:
        if options.nodes - options.spares < 1:
            raise SupernodeError(f"{options.nodes} nodes leave no room for a job with "
                                 f"{options.spares} spares")
        self.options = options
        self.root = options.state_dir
        self.root.mkdir(parents=True, exist_ok=True)
        host, _, port = options.listen.rpartition(":")
        self.host = host
        self.port = int(port)
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
        self.names = [node_name(i, options.nodes) for i in range(options.nodes)]
        #: Each node's labels (supernode, rack), as its agent reports them.
        self.labels = {name: node_labels(i) for i, name in enumerate(self.names)}
        self.job_nodes = self.names[:options.nodes - options.spares]
        self.spares = self.names[options.nodes - options.spares:]
        #: The Slurm jobs holding the nodes' GPUs, as the agents' ``squeue`` tells them.
        self.slurm_jobs = demo_jobs(self.job_nodes, self.spares, options.gpus)
        self.job_root = self.root / "job"
        self.launcher_state = self.job_root / "launcher.json"
        self.job_root.mkdir(parents=True, exist_ok=True)
        #: The fail-slow faults standing, which pace the job's ranks.
        self.pace = PaceBook(self.job_root / "pace.json")
        self.session = requests.Session()
        self.agents: dict[str, Child] = {}
        self.agent_urls: dict[str, str] = {}
        self._agent_env: dict[str, str] = dict(os.environ)
        self._port_moves: dict[str, int] = {}
        self.controller: Child | None = None

    # ------------------------------------------------------------------ start

    def _launcher_command(self) -> list[str]:
        return [*launcher.LAUNCHER, "--state", str(self.launcher_state)]

    def _write_config(self) -> Path:
        opts = self.options
        sources = list(opts.rules) or [packaged_rules()]
        rules_dir = self.root / "rules"
        rules_dir.mkdir(exist_ok=True)
        (rules_dir / "default.yaml").write_text(
            yaml.safe_dump(scaled_rules(sources, opts.speed), sort_keys=False))
        jobs_dir = self.root / "jobs"
        jobs_dir.mkdir(exist_ok=True)
        ckpt = self.job_root / "ckpt"
        ckpt.mkdir(parents=True, exist_ok=True)
        (jobs_dir / f"{JOB}.yaml").write_text(yaml.safe_dump({
            "apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
            "metadata": {"name": JOB},
            "spec": {
                "replicas": len(self.job_nodes), "minReplicas": 1,
                "nodes": self.job_nodes, "spares": self.spares,
                "checkpointInterval": "5s", "maxFailures": 20,
                "recoveryStrategy": "restart",
                # a rank that died (rank-error) stops the job's step: 150 simulated
                # seconds of it is a hang (NCCL's own timeout is 10 minutes)
                "hangTimeout": f"{max(HANG_FLOOR_SECONDS, 150.0 / opts.speed):g}s",
                "checkpoint": {"dir": str(ckpt)},
                "control": {"command": {"program": self._launcher_command(),
                                        "timeout": "30s"}},
            },
        }, sort_keys=False))
        breaker_window = max(5.0, 120.0 / opts.speed)
        config = {
            "sweep_interval": "0.5s",
            # as long as the product's default: under load a burst's silences are
            # detected a few seconds apart, and the breaker must count them all before
            # the first eviction runs
            "settle": "3s",
            "policy": {
                "max_unavailable": "50%",
                "rate_limit": {"actions": 1000, "window": "1m"},
                "node_cooldown": "10m",
                "breaker": {"window": f"{breaker_window:g}s", "max_faulted": "20%",
                            "min_faulted": 3, "hold": "1h"},
            },
            "runner": {"retries": 2, "backoff": "0.5s", "timeout": "15s"},
            "drivers": {
                "command": {"program": self._launcher_command(), "timeout": "30s"},
                "agent": {"redeliver_after": "3s"},
            },
            "routes": {"evict": ["command"], "cordon": ["command"],
                       "uncordon": ["command"]},
            # a workload's GPUs idle after 10 simulated minutes, as in production
            "workloads": {"idle_after": f"{600.0 / opts.speed:g}s"},
            "recovery": {"checkpoint_wait": "5s", "scan_interval": "1s",
                         "evict_timeout": "30s", "restore_timeout": "90s",
                         "save_interval": "2s",
                         # the ranks' log lines come from agents on one machine
                         "failure_settle": f"{max(3.0, 30.0 / opts.speed):g}s"},
        }
        path = self.root / "controller.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self, progress: Callable[[str], None] = lambda _: None,
              timeout: float = 90.0) -> None:
        """Start everything; return when every agent reports and every rank trains."""
        opts = self.options
        if not port_free(self.host or "127.0.0.1", self.port):
            raise PortTaken(f"{opts.listen} is taken (another demo or controller?); "
                            "pick another with --listen")
        config = self._write_config()
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        self.controller = Child("controller", [
            sys.executable, "-m", "sn_monitor.cli", "controller", "--config", str(config),
            "--listen", opts.listen, "--state-dir", str(self.root / "controller"),
            "--rules", str(self.root / "rules"), "--jobs", str(self.root / "jobs"),
            "--log-format", "json"], logs / "controller.log")
        self.controller.start()
        progress(f"controller starting on {self.url} (state in {self.root})")
        ports = free_ports("127.0.0.1", self.port, opts.nodes)
        (self.root / "agents").mkdir(exist_ok=True)
        slurm_bin = write_commands(self.slurm_jobs, self.root / "slurm" / "bin")
        self._agent_env = {**os.environ,
                           "PATH": f"{slurm_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        for name, port in zip(self.names, ports, strict=True):
            self.agents[name] = self._agent(name, port)
        self._wait(lambda: self._healthy(self.url, self.controller), timeout,
                   "the controller to answer /healthz")
        for agent in self.agents.values():
            agent.start()
        progress(f"{opts.nodes} simulated agents starting on ports "
                 f"{ports[0]}-{ports[-1]}")
        self._wait(self._all_reporting, timeout, "every agent to report")
        self._idle_slurm_gpus()
        progress(f"starting job {JOB!r} on {len(self.job_nodes)} nodes "
                 f"({len(self.spares)} spares)")
        self._run_launcher(
            "init", "--controller", self.url, "--job", JOB,
            "--checkpoint-dir", str(self.job_root / "ckpt"),
            "--log-dir", str(self.job_root / "logs"), "--flush-interval", "0.5",
            "--", "--steps", "1000000000", "--step-time", f"{opts.step_time:g}",
            "--checkpoint-every", str(opts.checkpoint_every), "--width", "16",
            "--pace-file", str(self.pace.path), "--peers")
        self._run_launcher("start", "--nodes", ",".join(self.job_nodes))

        def training() -> bool:
            job = self.get(f"/api/v1/jobs/{JOB}")
            return bool(job["ranks_reporting"] == len(self.job_nodes) and job["checkpoint"])
        self._wait(training, timeout, "every rank to train and a first checkpoint")
        steady_since: list[float] = []

        def steady() -> bool:
            nodes = self.get("/api/v1/nodes")["nodes"]
            fresh = len(nodes) == len(self.names) and all(
                n["last_report_age_seconds"] is not None
                and n["last_report_age_seconds"] < STEADY_AGE_SECONDS for n in nodes)
            if not fresh:
                steady_since.clear()
                return False
            if not steady_since:
                steady_since.append(time.monotonic())
            return time.monotonic() - steady_since[0] >= STEADY_FOR_SECONDS
        try:
            self._wait(steady, STEADY_WAIT_SECONDS, "every agent reporting steadily")
        except SupernodeError:
            progress("the agents report unevenly (a busy machine): starting anyway")

    def _idle_slurm_gpus(self) -> None:
        """Hold the GPUs of the idle Slurm jobs at 0 utilization."""
        for job in self.slurm_jobs:
            for node, indices in job.gpus.items():
                for index in indices if job.idle else ():
                    self._post_fault(node, {"fault": "load", "gpu": index, "utilization": 0.0})

    def _run_launcher(self, *args: str) -> None:
        done = subprocess.run([*self._launcher_command(), *args], capture_output=True,
                              text=True, timeout=60, check=False, cwd=self.root)
        if done.returncode != 0:
            raise SupernodeError(f"launcher {args[0]} failed: {done.stdout}{done.stderr}")

    def _healthy(self, url: str, child: Child | None) -> bool:
        if child is not None and not child.running:
            raise SupernodeError(f"{child.name} exited; the end of its log "
                                 f"({child.log_path}):\n{child.tail()}")
        try:
            return self.session.get(f"{url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _agent(self, name: str, port: int) -> Child:
        """The agent child of node ``name``, to listen on ``port`` (not started)."""
        opts = self.options
        self.agent_urls[name] = f"http://127.0.0.1:{port}"
        agent_config = self.root / "agents" / f"{name}.yaml"
        agent_config.write_text(yaml.safe_dump({
            "labels": self.labels[name],
            "attribution": {"slurm": {"enabled": True, "node": name, "refresh": "2s"}},
            # the ranks' logs on this node, as launcher.start_ranks names them
            "job_logs": {"enabled": True, "files": [{
                "glob": str(self.job_root / "logs" / f"gen*-rank*-{name}.log"), "job": JOB,
                "rank_pattern": r"gen\d+-rank(?P<rank>\d+)-"}]}}))
        return Child(name, [
            sys.executable, "-m", "sn_monitor.cli", "agent", "--simulate", str(opts.gpus),
            "--config", str(agent_config),
            "--controller", self.url, "--node", name, "--listen", f"127.0.0.1:{port}",
            "--state-dir", str(self.root / "agents" / name),
            "--sim-speed", f"{opts.speed:g}", "--log-format", "json",
            "--log-level", "warning"], self.root / "logs" / f"{name}.log", self._agent_env)

    def _moved_after_port_conflict(self, agent: Child) -> bool:
        """Start ``agent`` again on another port if another process took its port.

        The free ports are probed before the agents bind them: a second demo or
        controller starting on this machine at the same time can bind one in between.
        That agent exits at once; it moves (at most :data:`PORT_CONFLICT_RETRIES` times)
        instead of failing the whole start.
        """
        port = int(self.agent_urls[agent.name].rsplit(":", 1)[1])
        tries = self._port_moves.get(agent.name, 0)
        if port_free("127.0.0.1", port) or tries >= PORT_CONFLICT_RETRIES:
            return False
        highest = max(int(url.rsplit(":", 1)[1]) for url in self.agent_urls.values())
        self._port_moves[agent.name] = tries + 1
        moved = self._agent(agent.name, free_ports("127.0.0.1", highest, 1)[0])
        log.warning("agent %s: port %d was taken by another process; moving it to %s",
                    agent.name, port, self.agent_urls[agent.name])
        self.agents[agent.name] = moved
        moved.start()
        return True

    def _all_reporting(self) -> bool:
        for agent in list(self.agents.values()):
            if not agent.running and not self._moved_after_port_conflict(agent):
                raise SupernodeError(f"agent {agent.name} exited; the end of its log "
                                     f"({agent.log_path}):\n{agent.tail()}")
        nodes = {n["name"] for n in self.get("/api/v1/nodes")["nodes"]}
        return set(self.names) <= nodes

    def _wait(self, probe: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if probe():
                    return
            except (requests.RequestException, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise SupernodeError(f"waited {timeout:g}s for {what}; logs in "
                                     f"{self.root / 'logs'}")
            time.sleep(0.25)

    # ------------------------------------------------------------------ faults

    def inject(self, node: str, fault: str, gpu: int | None,
               params: dict[str, Any]) -> str:
        """Break (or repair) one node; return what was done. RuntimeError on failure."""
        agent = self.agents[node]
        if fault == "node-lost":
            agent.signal_group(signal.SIGSTOP)
            agent.frozen = True
            return "agent frozen (SIGSTOP): no more reports"
        if fault == "node-back":
            if not agent.frozen:
                return "was not lost"
            agent.signal_group(signal.SIGCONT)
            agent.frozen = False
            return "agent resumed (SIGCONT)"
        if agent.frozen:
            return "node is lost: fault not delivered"
        if fault == "rank-error":
            error = str(params.get("error", "app-bug"))
            rank = launcher.signal_rank(self.launcher_state, node, RANK_ERROR_SIGNALS[error])
            if rank is None:
                return "no rank of the job on this node: fault not delivered"
            return f"rank {rank} fails at its next step ({error})"
        if fault == "straggler":
            for index in range(self.options.gpus):
                self._post_fault(node, {"fault": "load", "gpu": index,
                                        "utilization": params.get("utilization", 0.3)})
            return f"every GPU held at {params.get('utilization', 0.3):g} utilization"
        body: dict[str, Any] = {"fault": fault, **{k: v for k, v in params.items()
                                                    if v is not None}}
        if gpu is not None:
            body["gpu"] = gpu
        result = self._post_fault(node, body)
        self.pace.play(node, fault, gpu, body)
        return result

    def _post_fault(self, node: str, body: dict[str, Any]) -> str:
        reply = self.session.post(f"{self.agent_urls[node]}/sim/fault", json=body, timeout=10)
        doc = reply.json()
        if reply.status_code != 200:
            raise RuntimeError(f"{node}: {doc.get('error', reply.text)}")
        return str(doc.get("result", "injected"))

    # ------------------------------------------------------------------ reading

    def get(self, path: str, **params: Any) -> Any:
        reply = self.session.get(f"{self.url}{path}", params=params or None, timeout=5)
        reply.raise_for_status()
        return reply.json()

    def health(self) -> dict[str, Any]:
        reply = self.session.get(f"{self.url}/healthz", timeout=5)
        return dict(reply.json())

    def launcher_calls(self) -> list[dict[str, Any]]:
        return list(launcher.load(self.launcher_state).get("calls", []))

    # ------------------------------------------------------------------ stop

    def close(self) -> None:
        """Stop every process this supernode started (ranks, agents, controller)."""
        with contextlib.suppress(OSError, ValueError):
            launcher.kill_ranks(launcher.load(self.launcher_state).get("all_pids", []))
        children = [*self.agents.values(), *([self.controller] if self.controller else [])]
        for child in children:
            if child.frozen:
                child.signal_group(signal.SIGCONT)
            child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in children:
            if child.popen is None:
                continue
            try:
                child.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.signal_group(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.popen.wait(timeout=5)
        # A rank restored while we were stopping: once more, now the controller is gone.
        with contextlib.suppress(OSError, ValueError):
            launcher.kill_ranks(launcher.load(self.launcher_state).get("all_pids", []))
        self.session.close()


def dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, default=str)
