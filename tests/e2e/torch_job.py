"""A real torchrun job (``examples/pytorch/``) on a test ``Cluster``: for the e2e test and
the MTTR benchmark.

Each simulated node of the job is an ``sn-monitor agent --simulate`` (the Cluster's) and
a torchrun agent with one rank, started by ``examples/pytorch/launcher.py``, the job's
``spec.control`` command. ``kill_node`` is a node dying: its torchrun agent and rank,
then its sn-monitor agent, SIGKILLed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from sn_monitor.sim.launcher import load
from tests.integration.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "pytorch"
LAUNCHER = [sys.executable, str(EXAMPLE / "launcher.py")]
TRAIN = EXAMPLE / "train.py"
#: Evictions to the Cluster's command script; checkpoint / restore to the job's launcher.
ROUTES = {"evict": ["command"], "cordon": ["command"], "uncordon": ["command"]}
CONFIG: dict[str, Any] = {
    "policy": {"breaker": {"window": "5s", "max_faulted": "100%", "min_faulted": 1000}},
    "recovery": {"checkpoint_wait": "15s", "scan_interval": "1s", "evict_timeout": "30s",
                 "restore_timeout": "120s"},
}


class TorchJob:
    """A DistributedJob of torchrun agents, its launcher state and its files."""

    def __init__(self, c: Cluster, name: str, nodes: list[str], spares: list[str], *,
                 steps: int, checkpoint_every: int, step_time: float,
                 first_generation_args: str = "", checkpoint_interval: str = "30s",
                 max_failures: int = 3, restore: str = "warm") -> None:
        self.c = c
        self.name = name
        self.nodes = nodes
        self.spares = spares
        self.root = c.root / f"torch-{name}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.ckpt = self.root / "ckpt"
        self.state_path = self.root / "launcher.json"
        self.timeline_path = self.root / "timeline.jsonl"
        self.weights = self.root / "final-weights.pt"
        self.spec: dict[str, Any] = {
            "apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
            "metadata": {"name": name},
            "spec": {"replicas": len(nodes), "nodes": nodes, "spares": spares,
                     "checkpointInterval": checkpoint_interval, "maxFailures": max_failures,
                     "recoveryStrategy": "restart", "hangTimeout": "120s",
                     "checkpoint": {"dir": str(self.ckpt)},
                     "control": {"command": {
                         "program": [*LAUNCHER, "--state", str(self.state_path)],
                         "timeout": "60s"}}},
        }
        self.launcher("init", "--controller", c.url, "--job", name,
                      "--token-file", str(c.root / "agent.token"),
                      "--checkpoint-dir", str(self.ckpt), "--log-dir", str(self.root / "logs"),
                      "--flush-interval", "0.5", "--restore", restore,
                      f"--first-generation-args={first_generation_args}", "--",
                      "--steps", str(steps), "--checkpoint-every", str(checkpoint_every),
                      "--step-time", str(step_time), "--timeline", str(self.timeline_path),
                      "--final-weights", str(self.weights))
        c.log_sources.append(self.logs)

    def launcher(self, *args: str) -> str:
        done = subprocess.run([*LAUNCHER, "--state", str(self.state_path), *args],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"launcher {args[0]}: {done.stdout}{done.stderr}"
        return done.stdout

    def post(self) -> None:
        reply = requests.post(f"{self.c.url}/api/v1/jobs", json=self.spec, timeout=10,
                              headers={"Authorization": f"Bearer {self.c.admin_token}"})
        assert reply.status_code == 201, reply.text

    def start(self) -> None:
        self.launcher("start", "--nodes", ",".join(self.nodes),
                      "--spares", ",".join(self.spares))

    def kill_node(self, node: str) -> None:
        """The node dies: its torchrun agent and rank, then its sn-monitor agent."""
        self.launcher("kill-node", node)
        self.c.agents[node].kill(signal.SIGKILL)

    def close(self) -> None:
        """SIGKILL every torchrun agent this job started, and their ranks."""
        subprocess.run([*LAUNCHER, "--state", str(self.state_path), "kill-all"],
                       capture_output=True, timeout=60, check=False)

    # ------------------------------------------------------------------ reading

    def get(self) -> dict[str, Any]:
        return dict(self.c.get(f"/api/v1/jobs/{self.name}"))

    def state(self) -> dict[str, Any]:
        return load(self.state_path)

    def recoveries(self) -> list[dict[str, Any]]:
        return list(self.c.get("/api/v1/recoveries", job=self.name)["recoveries"])

    def timeline(self) -> list[dict[str, Any]]:
        if not self.timeline_path.exists():
            return []
        return [json.loads(line) for line in self.timeline_path.read_text().splitlines()
                if line.strip()]

    def marks(self, generation: int | None) -> dict[str, dict[str, Any]]:
        """Rank 0's milestones in ``generation`` (the last of each kind)."""
        return {m["event"]: m for m in self.timeline() if m.get("generation") == generation}

    def logs(self) -> str:
        state = self.state()
        parts = [f"===== torch job {self.name}: generation {state.get('generation')}, calls "
                 + json.dumps([{k: c.get(k) for k in ("action", "action_id", "duplicate")}
                               for c in state.get("calls", [])])]
        for agent in state.get("agents", []):
            path = Path(agent["log"])
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"===== {path.name}\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ waits

    def wait_checkpoint(self, step: int, timeout: float) -> dict[str, Any]:
        """The controller knows a complete checkpoint at ``step`` or later."""
        def probe() -> dict[str, Any]:
            doc = self.get()
            point = doc.get("checkpoint")
            return doc if point is not None and point["step"] >= step else {}
        return self.c.wait_for(probe, timeout, f"job {self.name}: a checkpoint >= {step}")

    def wait_recovery(self, state: str, timeout: float,
                      after: set[str] | None = None) -> dict[str, Any]:
        def probe() -> dict[str, Any]:
            found = [r for r in self.recoveries() if r["id"] not in (after or set())]
            return found[0] if found and found[0]["state"] == state else {}
        return self.c.wait_for(probe, timeout, f"job {self.name}: a recovery {state}")

    def wait_mark(self, event: str, generation: int, timeout: float
                  ) -> dict[str, Any]:
        return self.c.wait_for(lambda: self.marks(generation).get(event, {}), timeout,
                               f"job {self.name}: rank 0 of generation {generation} {event}")
