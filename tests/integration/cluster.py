"""A controller and N simulated agents as real processes on 127.0.0.1, for end-to-end tests.

Everything lives under one directory (a pytest ``tmp_path``): the controller's config,
token files, state directory and rules come from the repository's ``rules/``; each
process writes its stdout and stderr to its own log file there, so a failed wait can
quote the end of every log. Ports are free ones picked at start. Every wait is bounded;
:meth:`Cluster.close` kills whatever is still running (call it from a ``finally`` or a
fixture's teardown).

The action scripts (``drivers.command`` and ``drivers.job``) are small Python programs
that append their ``SN_*`` environment, one JSON object a line, to ``evict.log`` /
``job.log``: :meth:`Cluster.script_calls` reads them back.

With :class:`ClusterTls` the controller serves HTTPS (and verifies client certificates),
and each agent named in it reports with its own client certificate.

With :class:`ClusterHa` there are two controllers (``controller`` and ``controller-b``)
sharing a PostgreSQL store, one active by the lease; agents know both. ``url`` then
follows the active one (:meth:`Cluster.find_active`).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "sn_monitor" / "rules"
T = TypeVar("T")

#: What the action scripts run: append the SN_ variables as one JSON line, then succeed.
SCRIPT = """\
import json, os, sys
record = {k: v for k, v in os.environ.items() if k.startswith("SN_")}
line = json.dumps(record, sort_keys=True) + "\\n"
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
try:
    os.write(fd, line.encode())
finally:
    os.close(fd)
print(f"{record.get('SN_ACTION')} {record.get('SN_NODE')} done")
"""


def metric_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample ``name`` whose labels include ``labels``."""
    for found, value in metric_samples(text).get(name, []):
        if all(found.get(k) == v for k, v in labels.items()):
            return value
    return None


class Process:
    """One child process with its output in a log file; start, kill, restart."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        #: The environment to start it with (None: this process's).
        self.env: dict[str, str] | None = None

    def start(self) -> None:
        assert self.popen is None or self.popen.poll() is not None, f"{self.name} is running"
        with self.log_path.open("ab") as log:
            log.write(f"----- start {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env=self.env,
            )

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 15.0) -> int | None:
        """Send ``sig`` and wait for the exit; SIGKILL if it is still there after ``timeout``."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)
        return self.popen.returncode

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            return f"(no log: {err})"
        return "\n".join(text.splitlines()[-lines:])


class Agent(Process):
    """A simulated agent: ``url`` serves /metrics, /healthz and POST /sim/fault."""

    def __init__(self, name: str, argv: list[str], log_path: Path, port: int) -> None:
        super().__init__(name, argv, log_path)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def lost_its_port(self) -> bool:
        """It exited because another process took its port between free_port() and bind."""
        return not self.running and "address already in use" in self.tail(3).lower()

    def rebind(self) -> None:
        """Take another free port (the next start listens there)."""
        at = self.argv.index("--listen") + 1
        self.port = free_port()
        self.argv[at] = f"127.0.0.1:{self.port}"
        self.url = f"http://127.0.0.1:{self.port}"

    def fault(self, fault: str, gpu: int | None = None, **params: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"fault": fault, **params}
        if gpu is not None:
            body["gpu"] = gpu
        reply = requests.post(f"{self.url}/sim/fault", json=body, timeout=10)
        assert reply.status_code == 200, f"{self.name} /sim/fault {body}: {reply.text}"
        return dict(reply.json())

    def metrics(self) -> str:
        return requests.get(f"{self.url}/metrics", timeout=10).text


@dataclass
class ClusterTls:
    """The controller's certificate, the CA of everything, the agents' certificates."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    #: More of the controller's ``tls:`` (``client_certs``, ``agent_auth``).
    settings: dict[str, Any] = field(default_factory=dict)
    #: Node name -> the client certificate and key its agent reports with.
    agent_certs: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    #: False: the agents have no bearer token (their certificates identify them).
    agent_tokens: bool = True


@dataclass
class ClusterHa:
    """Two controllers on one PostgreSQL database (``dsn``), leased in it.

    The lease times are short so that a test sees a take-over in seconds.
    """

    dsn: str
    lease_duration: str = "4s"
    renew_deadline: str = "3s"
    retry_period: str = "0.5s"


class Cluster:
    """A controller and ``nodes`` simulated agents (``sim-0`` ... ``sim-N``)."""

    def __init__(self, root: Path, *, nodes: int = 4, config: dict[str, Any] | None = None,
                 gpus: int = 8, sim_speed: float = 10.0,
                 routes: dict[str, list[str]] | None = None,
                 jobs_dir: Path | None = None, rules: list[Path] | None = None,
                 agent_labels: dict[str, str] | None = None,
                 agent_config: dict[str, Any] | None = None,
                 tls: ClusterTls | None = None, ha: ClusterHa | None = None) -> None:
        """``config`` is merged into the defaults below; ``routes`` replaces theirs
        (leave checkpoint/restore/failover out to send them to each job's own
        ``spec.control``); ``jobs_dir`` is the controller's ``--jobs`` directory;
        ``rules`` are rule files or directories loaded after the repository's;
        ``agent_labels`` are every agent's ``labels`` (supernode, rack); ``agent_config``
        more of every agent's config (``remediation``); ``tls``: the
        controller serves HTTPS (see :class:`ClusterTls`); ``ha``: two controllers
        (see :class:`ClusterHa`)."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.ha = ha
        #: Every controller's URL (two with ``ha``), in the agents' order.
        self.urls = [self.url]
        if ha is not None:
            self.urls.append(f"{scheme}://127.0.0.1:{free_port()}")
        #: What requests to the controller verify its certificate with.
        self.verify: bool | str = str(tls.ca_file) if tls else True
        self.state_dir = root / "controller-state"
        self.evict_log = root / "evict.log"
        self.job_log = root / "job.log"
        script = root / "action.py"
        script.write_text(SCRIPT)

        agent_token, self.admin_token = secrets.token_hex(16), secrets.token_hex(16)
        self.agent_token = agent_token
        (root / "agent.token").write_text(agent_token + "\n")
        (root / "admin.token").write_text(self.admin_token + "\n")
        #: A token of role operate (for Alertmanager's webhook), and the file holding it.
        self.operate_token_file = root / "operate.token"
        self.operate_token_file.write_text(secrets.token_hex(16) + "\n")
        (root / "tokens.yaml").write_text(yaml.safe_dump([
            {"name": "sim-agents", "role": "agent", "token_file": str(root / "agent.token"),
             "nodes": ["sim-*"]},
            {"name": "e2e-tests", "role": "admin", "token_file": str(root / "admin.token")},
            {"name": "operators", "role": "operate",
             "token_file": str(self.operate_token_file)},
        ]))
        settings: dict[str, Any] = {
            "sweep_interval": "0.5s",
            "settle": "1s",
            "log_format": "json",
            "policy": {
                "max_unavailable": "100%",
                "rate_limit": {"actions": 1000, "window": "1m"},
                "node_cooldown": "30m",
                "breaker": {"window": "30s", "max_faulted": "40%", "min_faulted": 2,
                            "hold": "10m"},
            },
            "runner": {"retries": 2, "backoff": "0.5s", "timeout": "15s"},
            "drivers": {
                "command": {"program": [sys.executable, str(script), str(self.evict_log)],
                            "timeout": "20s"},
                "job": {"command": {"program": [sys.executable, str(script),
                                                str(self.job_log)], "timeout": "20s"}},
                "agent": {"redeliver_after": "3s"},
            },
            "routes": {"evict": ["command"], "cordon": ["command"], "uncordon": ["command"],
                       "failover": ["job"], "checkpoint": ["job"], "restore": ["job"]},
        }
        if tls is not None:
            settings["tls"] = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file),
                               "client_ca_file": str(tls.ca_file), **tls.settings}
        if ha is not None:
            (root / "store.dsn").write_text(ha.dsn + "\n")
            settings["store"] = {"backend": "postgresql", "dsn_file": str(root / "store.dsn")}
            settings["ha"] = {"lease": "postgresql", "lease_duration": ha.lease_duration,
                              "renew_deadline": ha.renew_deadline,
                              "retry_period": ha.retry_period}
        _merge(settings, config or {})
        if routes is not None:
            settings["routes"] = routes
        self.config_path = root / "controller.yaml"
        self.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))

        def controller(name: str, url: str) -> Process:
            port = url.rsplit(":", 1)[1]
            return Process(name, [
                sys.executable, "-m", "sn_monitor.cli", "controller",
                "--config", str(self.config_path), "--listen", f"127.0.0.1:{port}",
                "--state-dir", str(self.state_dir), "--rules", str(RULES),
                *[arg for path in rules or () for arg in ("--rules", str(path))],
                "--token-file", str(root / "tokens.yaml"), "--log-format", "json",
                *(["--jobs", str(jobs_dir)] if jobs_dir is not None else []),
            ], root / f"{name}.log")
        self.controller = controller("controller", self.urls[0])
        #: Every controller process, in the order of ``urls``.
        self.controllers = [self.controller]
        if ha is not None:
            self.controllers.append(controller("controller-b", self.urls[1]))
        #: More text for :meth:`logs` (a test's own processes): each returns a section.
        self.log_sources: list[Callable[[], str]] = []
        self.agents: dict[str, Agent] = {}
        config_file: list[str] = []
        if agent_labels or agent_config:
            (root / "agent.yaml").write_text(yaml.safe_dump(
                {"labels": agent_labels or {}, **(agent_config or {})}))
            config_file = ["--config", str(root / "agent.yaml")]
        for i in range(nodes):
            name, port = f"sim-{i}", free_port()
            config_args = config_file
            if tls is not None:
                config_args = ["--config", str(root / f"{name}.yaml")]
                reach: dict[str, str] = {"ca_file": str(tls.ca_file)}
                if name in tls.agent_certs:
                    cert, key = tls.agent_certs[name]
                    reach.update(cert_file=str(cert), key_file=str(key))
                (root / f"{name}.yaml").write_text(yaml.safe_dump(
                    {"labels": agent_labels or {}, "controller": reach, **(agent_config or {})}))
            with_token = tls is None or tls.agent_tokens
            self.agents[name] = Agent(name, [
                sys.executable, "-m", "sn_monitor.cli", "agent", "--simulate", str(gpus),
                *[arg for url in self.urls for arg in ("--controller", url)],
                *(["--token-file", str(root / "agent.token")] if with_token else []),
                "--node", name, "--listen", f"127.0.0.1:{port}",
                "--state-dir", str(root / f"{name}-state"),
                "--sim-speed", f"{sim_speed:g}", "--log-format", "json", *config_args,
            ], root / f"{name}.log", port)

    # ------------------------------------------------------------------ lifecycle

    @property
    def processes(self) -> list[Process]:
        return [*self.controllers, *self.agents.values()]

    def start(self, timeout: float = 60.0) -> Cluster:
        """Start the controller and every agent; return when every agent has reported."""
        self.start_controller(timeout)
        for agent in self.agents.values():
            agent.start()
        for agent in self.agents.values():
            self.wait_for(lambda a=agent: self._started(a), timeout,  # type: ignore[misc]
                          f"agent {agent.name} healthy on {agent.url}")
        self.wait_reporting(list(self.agents), timeout)
        return self

    def start_controller(self, timeout: float = 60.0) -> None:
        """Start the controller(s); with ``ha``, return once one of them is active."""
        for proc in self.controllers:
            if not proc.running:
                proc.start()
        if self.ha is None:
            self.wait_for(lambda: self._healthy(self.controller), timeout,
                          f"controller healthy on {self.url}")
            return
        for proc in self.controllers:
            self.wait_for(lambda p=proc: self._healthy(p, "/livez"),  # type: ignore[misc]
                          timeout,
                          f"{proc.name} alive")
        self.find_active(timeout)

    def url_of(self, proc: Process) -> str:
        """A controller process's URL (an agent's: its own)."""
        if isinstance(proc, Agent):
            return proc.url
        return self.urls[self.controllers.index(proc)]

    def find_active(self, timeout: float = 30.0) -> Process:
        """Wait until exactly one controller is ready; point ``url`` at it; return it."""
        def one_ready() -> Process | None:
            ready = [p for p in self.controllers if p.running and self._ready(p)]
            return ready[0] if len(ready) == 1 else None
        active = self.wait_for(one_ready, timeout, "exactly one active controller")
        assert active is not None  # wait_for returns only what is truthy
        self.url = self.url_of(active)
        return active

    def _ready(self, proc: Process) -> bool:
        try:
            return requests.get(f"{self.url_of(proc)}/readyz", timeout=2,
                                verify=self.verify).status_code == 200
        except requests.RequestException:
            return False

    def _started(self, agent: Agent, attempts: int = 3) -> bool:
        """Healthy; an agent whose port was taken before it bound it starts on another."""
        for _ in range(attempts):
            if not agent.lost_its_port():
                break
            agent.rebind()
            agent.start()  # healthy, or lost its port again, at one of wait_for's next polls
        return self._healthy(agent)

    def _healthy(self, proc: Process, path: str = "/healthz") -> bool:
        url = self.url_of(proc)
        if not proc.running:
            raise AssertionError(f"{proc.name} exited with {proc.popen and proc.popen.poll()}"
                                 f"\n{self.logs()}")
        try:
            return requests.get(f"{url}{path}", timeout=2,
                                verify=True if isinstance(proc, Agent) else self.verify
                                ).status_code == 200
        except requests.RequestException:
            return False

    def wait_reporting(self, names: list[str], timeout: float = 60.0,
                       fresher_than: float = 3.0) -> None:
        """Wait until the controller has a report younger than ``fresher_than`` from each."""
        def fresh() -> bool:
            nodes = {n["name"]: n for n in self.get("/api/v1/nodes")["nodes"]}
            return all(name in nodes and nodes[name]["last_report_age_seconds"] is not None
                       and nodes[name]["last_report_age_seconds"] < fresher_than
                       for name in names)
        self.wait_for(fresh, timeout, f"fresh reports from {', '.join(names)}")

    def close(self) -> None:
        """Kill every process still running (SIGTERM first, briefly, then SIGKILL)."""
        for proc in self.processes:
            if proc.running and proc.popen is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.processes:
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=5)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ waits and logs

    def logs(self, lines: int = 25) -> str:
        parts = []
        for proc in self.processes:
            state = "running" if proc.running else (
                f"exited {proc.popen.returncode}" if proc.popen else "not started")
            parts.append(f"===== {proc.name} ({state}), last {lines} lines of {proc.log_path}"
                         f"\n{proc.tail(lines)}")
        for path in (self.evict_log, self.job_log):
            text = path.read_text() if path.exists() else "(empty)"
            parts.append(f"===== {path.name}\n{text.strip()}")
        for source in self.log_sources:
            try:
                parts.append(source())
            except Exception as err:  # noqa: BLE001 - a broken source must not hide the others
                parts.append(f"===== (log source failed: {err!r})")
        return "\n".join(parts)

    def logs_containing(self, *needles: str) -> list[str]:
        """``file:line`` of every line of every process's log that holds one of ``needles``."""
        found = []
        for proc in self.processes:
            if not proc.log_path.exists():
                continue
            text = proc.log_path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), 1):
                if any(needle in line for needle in needles):
                    found.append(f"{proc.log_path.name}:{number}")
        return found

    def wait_for(self, probe: Callable[[], T], timeout: float, what: str,
                 interval: float = 0.25) -> T:
        """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds.

        A probe that raises a connection error counts as not yet; the last value and the
        end of every process's log are in the failure message.
        """
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                value = probe()
            except (requests.RequestException, ValueError) as err:
                value, last = None, f"{type(err).__name__}: {err}"
            else:
                last = value
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"waited {timeout:g}s for {what}; last: {last!r}\n"
                                     f"{self.logs()}")
            time.sleep(interval)

    # ------------------------------------------------------------------ the API

    def get(self, path: str, **params: Any) -> Any:
        reply = requests.get(f"{self.url}{path}", params=params or None, timeout=10,
                             headers={"Authorization": f"Bearer {self.admin_token}"},
                             verify=self.verify)
        reply.raise_for_status()
        return reply.json()

    def incidents(self, **params: Any) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/incidents", limit=1000, **params)["incidents"])

    def actions(self, **params: Any) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/actions", limit=1000, **params)["actions"])

    def incident_actions(self, incident_id: int) -> list[dict[str, Any]]:
        return list(self.get(f"/api/v1/incidents/{incident_id}")["actions"])

    def controller_metrics(self) -> str:
        return requests.get(f"{self.url}/metrics", timeout=10, verify=self.verify).text

    def sweeps(self) -> int:
        """The sweeps the controller has done since it started."""
        return int(metric_value(self.controller_metrics(), "sn_controller_sweeps_total") or 0)

    def wait_sweeps(self, count: int, timeout: float, what: str) -> None:
        """Wait until the controller has done ``count`` sweeps more than now: whatever a
        sweep decides (heartbeats, settled actions, recoveries) is decided for the state
        it was in now."""
        target = self.sweeps() + count
        self.wait_for(lambda: self.sweeps() >= target, timeout, f"{count} sweeps: {what}")

    def wait_settled(self, timeout: float, what: str) -> None:
        """Wait until no action is settling, queued for the store's writer, pending or
        running: every action the findings so far asked for is decided (the positive
        signal a test waits on instead of sleeping past the settle time)."""
        def settled() -> bool:
            text = self.controller_metrics()
            return (metric_value(text, "sn_controller_actions_settling") == 0
                    and metric_value(text, "sn_controller_store_queue_writes") == 0
                    and not [a for a in self.actions()
                             if a["state"] in ("pending", "running")])
        self.wait_for(settled, timeout, f"every action decided: {what}")

    def script_calls(self, log: Path | None = None) -> list[dict[str, str]]:
        """What the action scripts ran: one dict of SN_ variables per call."""
        paths = [log] if log is not None else [self.evict_log, self.job_log]
        calls = []
        for path in paths:
            if path.exists():
                calls += [json.loads(line) for line in path.read_text().splitlines() if line]
        return calls


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


__all__ = ["Agent", "Cluster", "ClusterTls", "Process", "free_port", "metric_samples",
           "metric_value"]
