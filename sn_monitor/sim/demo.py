"""``sn-monitor demo``: a simulated supernode breaking and recovering, live in the terminal.

One command starts (see :mod:`sn_monitor.sim.supernode`) a controller, N simulated
agents (real agent processes) and a training job over all but two of them, then plays a
scenario (the packaged ``default``, or ``--scenario F``): at each fault's simulated time
(divided by ``--speed``) it breaks a node through the agent's ``POST /sim/fault``, or
freezes / resumes a whole agent for ``node-lost`` / ``node-back``. Twice a second it
reads the controller's API and draws the nodes, the open incidents, the actions and the
job's step and effective training ratio.

The live view keeps each table's id, node and severity columns at any width from 100
columns (the message is cut short with an ellipsis instead), shows the circuit breaker
open (red) and then closed (when), and a ``bottleneck:`` line for each fail-slow
bottleneck the finder names (the ``fail-slow`` scenario plays one).

At the end it prints a summary: each injected fault, when it was detected (from the
injection to the first incident on that node after it), what was done about it, how
long the job's recovery took, the breaker's story, why each node still out of service
is out (the incident that took it out and what it waits for), the topology page's
address and a one-line verdict (``job recovered 2 times, ETTR 0.97, 0 false
evictions``). ``--headless`` prints the summary as JSON, and the exit status is 1 when a
fault that should have been detected was not.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sn_monitor.sim.pace import CLEARED
from sn_monitor.sim.scenario import Scenario, format_seconds
from sn_monitor.sim.supernode import JOB, PortTaken, Supernode, SupernodeError, SupernodeOptions

#: Faults that repair something: nothing to detect, they end an earlier fault.
#: The rule of a job failure's incident, as the controller names it
#: (:data:`sn_monitor.controller.incidents.job_failures.JOB_FAILURE_RULE`; the demo reads
#: the controller over HTTP only).
JOB_FAILURE_RULE = "job-failure"
REPAIRS = frozenset({"cooling-repaired", "ib-port-up", "node-back", "nvml-release",
                     "fabric-ready", "stuck-process-gone", *CLEARED})
#: After the scenario's last fault: at most this long (wall) for detections to land.
GRACE_SECONDS = 20.0
#: At the end, at most this long (wall) for the job to be seen training (a step made).
TRAINING_WAIT_SECONDS = 20.0
#: A node-lost incident this long (wall) after its node was resumed still counts as real.
LOST_SLACK_SECONDS = 2.0
POLL_SECONDS = 0.5
STATE_STYLE = {"healthy": "green", "degraded": "yellow", "cordoned": "magenta",
               "lost": "red"}


@dataclass(frozen=True)
class DemoOptions:
    scenario: Scenario
    nodes: int = 16
    gpus: int = 8
    spares: int = 2
    speed: float = 10.0
    duration: float | None = None
    headless: bool = False
    keep_running: bool = False
    listen: str = "127.0.0.1:9848"
    state_dir: Path | None = None
    #: Rule files or directories (default: the rules packaged with sn-monitor).
    rules: tuple[Path, ...] = ()


@dataclass
class Injection:
    """One fault on one node, as played."""

    at: float
    fault: str
    node: str
    gpu: int | None
    params: dict[str, Any]
    description: str
    #: Which fault of the scenario file it plays, and which of its repeats (0: the
    #: first; a storm's later repeats are more of the same fault, not faults to detect).
    position: int = 0
    repeat: int = 0
    injected_wall: float | None = None
    offset: float | None = None
    result: str = ""
    error: str | None = None

    @property
    def expects_detection(self) -> bool:
        return (self.fault not in REPAIRS and self.repeat == 0
                and self.injected_wall is not None
                and self.error is None and "not delivered" not in self.result)


@dataclass
class Observed:
    """What the last poll of the controller saw, and a few things remembered across polls."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    incidents: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    job: dict[str, Any] | None = None
    health: dict[str, Any] = field(default_factory=dict)
    breaker_reason: str | None = None
    #: Simulated seconds into the scenario when the breaker was seen open, then closed.
    breaker_opened_at: float | None = None
    breaker_closed_at: float | None = None
    error: str | None = None


class Demo:
    def __init__(self, options: DemoOptions, supernode: Supernode) -> None:
        self.options = options
        self.sn = supernode
        self.stop = threading.Event()
        self.started_wall = 0.0
        self.started_mono = 0.0
        self.observed = Observed()
        self.injections: list[Injection] = []
        self._pending: list[tuple[float, Injection]] = []
        self.notes: list[str] = []
        plan = options.scenario.resolve(options.nodes, supernode.names)
        for item in plan:
            for index in item.nodes:
                name = supernode.names[index]
                where = name + (f" GPU {item.gpu}" if item.gpu is not None else "")
                source = item.source
                repeat = (round((item.at - source.at) / source.every)
                          if source.repeats > 1 else 0)
                self._pending.append((item.at, Injection(
                    at=item.at, fault=item.fault, node=name, gpu=item.gpu,
                    params=dict(item.params),
                    description=f"{where}: {source.describe()}", position=source.position,
                    repeat=repeat)))

    # ------------------------------------------------------------------ the timeline

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started_mono

    def _inject_due(self) -> None:
        simulated = self.elapsed * self.options.speed
        while self._pending and self._pending[0][0] <= simulated:
            _, injection = self._pending.pop(0)
            injection.injected_wall = time.time()
            injection.offset = self.elapsed
            try:
                injection.result = self.sn.inject(injection.node, injection.fault,
                                                  injection.gpu, injection.params)
            except (RuntimeError, requests.RequestException, ValueError) as err:
                injection.error = str(err)
            if injection.fault == "node-back" and injection.result == "was not lost":
                continue  # a "*" node-back on a node that was fine: not worth a line
            self.injections.append(injection)
            self._say(f"t={format_seconds(injection.at):>7}  {injection.description}"
                      + (f"  FAILED: {injection.error}" if injection.error else ""))

    def _say(self, line: str) -> None:
        self.notes.append(line)
        if self.options.headless:
            print(line, file=sys.stderr, flush=True)

    def _poll(self) -> None:
        obs = self.observed
        try:
            obs.nodes = self.sn.get("/api/v1/nodes")["nodes"]
            obs.incidents = self.sn.get("/api/v1/incidents", status="open",
                                        limit=200)["incidents"]
            obs.actions = self.sn.get("/api/v1/actions", limit=40)["actions"]
            obs.job = self.sn.get(f"/api/v1/jobs/{JOB}")
            obs.health = self.sn.health()
            obs.error = None
        except (requests.RequestException, ValueError, KeyError) as err:
            obs.error = f"controller unreachable: {err}"
            return
        breaker = obs.health.get("breaker") or {}
        simulated = self.elapsed * self.options.speed
        if breaker.get("open") and (obs.breaker_opened_at is None
                                    or obs.breaker_closed_at is not None):
            obs.breaker_reason = str(breaker.get("reason"))
            obs.breaker_opened_at, obs.breaker_closed_at = simulated, None
            self._say(f"CIRCUIT BREAKER OPEN - evictions and failovers FROZEN: "
                      f"{obs.breaker_reason}")
        elif (not breaker.get("open") and obs.breaker_opened_at is not None
              and obs.breaker_closed_at is None):
            obs.breaker_closed_at = simulated
            self._say(f"circuit breaker closed at t={format_seconds(round(simulated))}: "
                      f"evictions and failovers go on")

    def _undetected_now(self) -> bool:
        """True while an injected fault still waits for its first incident."""
        try:
            incidents = self.sn.get("/api/v1/incidents", limit=1000)["incidents"]
        except (requests.RequestException, ValueError, KeyError):
            return True
        return any(e["detected_at"] is None for e in self._entries(incidents, [], []))

    def run(self, view: Live | None) -> None:
        """Play the scenario; return at its end (or ``--duration``, or a signal)."""
        self.started_wall = time.time()
        self.started_mono = time.monotonic()
        scenario = self.options.scenario
        end = (scenario.duration or (self._pending[-1][0] if self._pending else 0.0)
               ) / self.options.speed
        if self.options.duration is not None:
            end = self.options.duration
        next_poll = 0.0
        grace_until: float | None = None
        while not self.stop.is_set():
            now = self.elapsed
            if now < end:
                self._inject_due()
            if now >= next_poll:
                self._poll()
                next_poll = now + POLL_SECONDS
                if view is not None:
                    view.update(self.render())
            if now >= end:
                if self.options.keep_running:
                    break
                if grace_until is None:
                    grace_until = now + GRACE_SECONDS
                if now >= grace_until or not self._undetected_now():
                    break
            self.stop.wait(0.1)
        if self.options.keep_running and not self.stop.is_set() and view is not None:
            self._say(f"scenario done; everything keeps running (controller {self.sn.url}, "
                      f"/metrics, /api/v1/sd): Ctrl-C to stop")
            while not self.stop.is_set() and view is not None:
                self._poll()
                view.update(self.render())
                self.stop.wait(POLL_SECONDS)

    # ------------------------------------------------------------------ the live view

    def render(self) -> Group:
        obs = self.observed
        opts = self.options
        simulated = self.elapsed * opts.speed
        job = obs.job or {}
        pace = job.get("recent_step_seconds")
        header = Text.assemble(
            ("sn-monitor demo", "bold"),
            f"  scenario {opts.scenario.name}  t={format_seconds(round(simulated))} "
            f"(x{opts.speed:g})  controller {self.sn.url} (page /ui/topology)\n",
            (f"job {JOB}: ", "bold"),
            f"step {job.get('last_step')}  generation {job.get('generation')}  "
            f"state {job.get('state')}  ranks {job.get('ranks_reporting')}  "
            + (f"{pace:.3f} s/step  " if isinstance(pace, int | float) else ""),
            (f"ETTR {ratio(job.get('effective_training_ratio'))}", "bold cyan"),
        )
        parts: list[Any] = [header]
        banner = breaker_banner(obs.breaker_reason, obs.breaker_opened_at,
                                obs.breaker_closed_at)
        if banner is not None:
            parts.append(banner)
        if obs.error:
            parts.append(Text(obs.error, style="red"))
        parts.append(self._grid())
        for line in bottleneck_lines(obs.incidents):
            parts.append(Text(line, style="bold yellow"))
        faults = Text("\n".join(self.notes[-8:]) or "no fault injected yet", style="yellow")
        parts += [incidents_table(obs.incidents), actions_table(obs.actions),
                  Panel(faults, title="injected faults")]
        return Group(*parts)

    def _grid(self) -> Table:
        grid = Table.grid(padding=(0, 1))
        columns = 8
        for _ in range(columns):
            grid.add_column()
        job_nodes = set((self.observed.job or {}).get("nodes") or self.sn.job_nodes)
        cells = []
        for node in self.observed.nodes:
            state = node["state"]
            hot = node.get("hottest_gpu_celsius")
            role = "job" if node["name"] in job_nodes else (
                "spare" if node["name"] in self.sn.spares else "out")
            text = Text(f"{node['name']}\n{state} {role}\n"
                        + (f"{hot:.0f}°C" if isinstance(hot, int | float) else "-"),
                        style=f"bold {STATE_STYLE.get(state, 'white')}")
            cells.append(Panel(text, padding=(0, 1)))
        for start in range(0, len(cells), columns):
            row = cells[start:start + columns]
            grid.add_row(*row, *([""] * (columns - len(row))))
        return grid

    # ------------------------------------------------------------------ the summary

    def _entries(self, incidents: list[dict[str, Any]], actions: list[dict[str, Any]],
                 recoveries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What came of each played fault that expects a detection, and of each repair."""
        played = [i for i in self.injections if i.injected_wall is not None]
        return [_entry(inj, _window_end(inj, played), incidents, actions, recoveries)
                for inj in played if inj.expects_detection or inj.fault in REPAIRS]

    def _lost_windows(self) -> dict[str, list[tuple[float, float]]]:
        """When each node was made silent (wall times, from node-lost to node-back)."""
        windows: dict[str, list[tuple[float, float]]] = {}
        frozen: dict[str, float] = {}
        for inj in self.injections:
            if inj.injected_wall is None or inj.error is not None:
                continue
            if inj.fault == "node-lost":
                frozen.setdefault(inj.node, inj.injected_wall)
            elif inj.fault == "node-back" and inj.node in frozen:
                windows.setdefault(inj.node, []).append(
                    (frozen.pop(inj.node), inj.injected_wall + LOST_SLACK_SECONDS))
        for node, since in frozen.items():
            windows.setdefault(node, []).append((since, float("inf")))
        return windows

    def _nodes_of(self, subject: str) -> list[str]:
        """The nodes an incident is about: the node, or a whole rack's.

        A rule's blast-radius domain (``rack:r03``) stands for the rack's nodes, each of
        which also has its own incident, judged on its own.
        """
        label, _, value = subject.partition(":")
        if not value:
            return [subject]
        return [node for node, labels in self.sn.labels.items() if labels.get(label) == value]

    def _false_alarms(self, incidents: list[dict[str, Any]],
                      actions: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
        """Healthy nodes taken for faulty: (node-lost incidents, evictions).

        A node-lost where nothing was silenced; an eviction of a node no fault was played
        on (before the eviction).
        """
        windows = self._lost_windows()
        false_lost = [f"{i['node']} at {i['detected_at'] - self.started_wall:.1f}s"
                      for i in incidents if i["rule"] == "node-lost" and not any(
                          start - 0.5 <= i["detected_at"] <= end
                          for node in self._nodes_of(i["node"])
                          for start, end in windows.get(node, ()))]
        faulted: dict[str, float] = {}
        for inj in self.injections:
            if inj.injected_wall is not None and inj.expects_detection:
                faulted.setdefault(inj.node, inj.injected_wall)
        return false_lost, false_evictions(actions, faulted)

    def _training(self) -> bool:
        """The job runs and makes steps now (two reads of its step, a moment apart)."""
        deadline = time.monotonic() + TRAINING_WAIT_SECONDS
        first: int | None = None
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                job = self.sn.get(f"/api/v1/jobs/{JOB}")
            except (requests.RequestException, ValueError):
                job = {}
            step = job.get("last_step")
            if job.get("state") == "running" and isinstance(step, int):
                if first is None:
                    first = step
                elif step > first:
                    return True
            self.stop.wait(0.5)
        return False

    def summary(self) -> dict[str, Any]:
        sn = self.sn
        training = self._training()
        try:
            incidents = sn.get("/api/v1/incidents", limit=1000)["incidents"]
            actions = sn.get("/api/v1/actions", limit=1000)["actions"]
            recoveries = sn.get("/api/v1/recoveries", job=JOB, limit=100)["recoveries"]
            job = sn.get(f"/api/v1/jobs/{JOB}")
            health = sn.health()
            nodes = sn.get("/api/v1/nodes")["nodes"]
            repairs = sn.get("/api/v1/remediation", limit=200)["repairs"]
        except (requests.RequestException, ValueError, KeyError) as err:
            return {"error": f"controller unreachable at the end: {err}", "ok": False,
                    "faults": [], "undetected": []}
        entries = self._entries(incidents, actions, recoveries)
        undetected = [f"{e['at']} {e['fault']} on {e['node']}" for e in entries
                      if e["expects_detection"] and e["detected_at"] is None]
        latencies = [e["detection_latency_seconds"] for e in entries
                     if e["detection_latency_seconds"] is not None]
        false_lost, evicted_healthy = self._false_alarms(incidents, actions)
        summary: dict[str, Any] = {
            "scenario": self.options.scenario.name,
            "speed": self.options.speed,
            "nodes": self.options.nodes,
            "gpus_per_node": self.options.gpus,
            "spares": sn.spares,
            "controller": sn.url,
            "state_dir": str(sn.root),
            "wall_seconds": round(self.elapsed, 1),
            "faults": entries,
            "undetected": undetected,
            "detection_latency_seconds": {
                "max": max(latencies) if latencies else None,
                "mean": round(sum(latencies) / len(latencies), 2) if latencies else None},
            "actions": _action_totals(actions),
            "page": page_url(sn.url),
            "breaker": self._breaker_summary(health.get("breaker") or {}),
            "recoveries": [{"id": r["id"], "state": r["state"], "kind": r["kind"],
                            "failed_nodes": r["failed_nodes"],
                            "replacement_nodes": r["replacement_nodes"],
                            "generation": r["generation"],
                            "mttr_seconds": r["mttr_seconds"]} for r in recoveries],
            "job": _job_summary(job, training),
            "out_of_service": out_of_service(nodes, actions, repairs, incidents),
            "bottlenecks": bottlenecks(incidents),
            "job_failures": job_failures(incidents),
            "false_node_lost": false_lost,
            "false_evictions": evicted_healthy,
            "ok": not undetected and not false_lost and not evicted_healthy and training,
        }
        summary["verdict"] = verdict(summary)
        return summary

    def _breaker_summary(self, breaker: dict[str, Any]) -> dict[str, Any]:
        """The breaker at the end (``breaker``: the controller's health) and as polled."""
        obs = self.observed
        closed_at = obs.breaker_closed_at
        if closed_at is None and obs.breaker_opened_at is not None and not breaker.get("open"):
            closed_at = self.elapsed * self.options.speed  # closed since the last poll
        return {"tripped": bool(breaker.get("open")) or obs.breaker_opened_at is not None,
                "open": bool(breaker.get("open")),
                "reason": breaker.get("reason") or obs.breaker_reason,
                "opened_at_seconds": _rounded(obs.breaker_opened_at),
                "closed_at_seconds": _rounded(closed_at)}


# ---------------------------------------------------------------------- the summary's parts


def _action_totals(actions: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """How many actions of each kind ended in each state: ``{"evict": {"succeeded": 2}}``."""
    totals: dict[str, dict[str, int]] = {}
    for act in actions:
        bucket = totals.setdefault(act["action"], {})
        bucket[act["state"]] = bucket.get(act["state"], 0) + 1
    return totals


def job_failures(incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's failures the controller named from its ranks' logs, first first."""
    return [{"id": i["id"], "message": i["message"], "status": i["status"],
             "detected_at": i["detected_at"]}
            for i in sorted(incidents, key=lambda i: i["detected_at"])
            if i["rule"] == JOB_FAILURE_RULE]


def _job_summary(job: dict[str, Any], training: bool) -> dict[str, Any]:
    """The job at the end, as the controller has it, and whether it still trains."""
    ettr = job.get("effective_training_ratio")
    return {"state": job.get("state"), "state_reason": job.get("state_reason"),
            "generation": job.get("generation"),
            "last_step": job.get("last_step"), "nodes": job.get("nodes"),
            "spares": job.get("spares"), "root_cause": job.get("root_cause"),
            "effective_training_ratio": (round(ettr, 3) if isinstance(ettr, int | float)
                                         else ettr),
            "training": training}


# ---------------------------------------------------------------------- what came of a fault


def _window_end(inj: Injection, played: list[Injection]) -> float:
    """The wall time a fault's window ends: at the next fault on its node.

    A repair does not end it (an incident may land just after the repair was injected),
    nor do a storm's repeats.
    """
    assert inj.injected_wall is not None
    later = [o.injected_wall for o in played if o.node == inj.node
             and o.injected_wall is not None and o.injected_wall > inj.injected_wall
             and (o.fault not in REPAIRS or inj.fault in REPAIRS)
             and o.position != inj.position]
    return min(later) if later else float("inf")


def _incidents_of(inj: Injection, incidents: list[dict[str, Any]],
                  until: float) -> list[dict[str, Any]]:
    """The incidents detected in a fault's window, first first.

    An incident of the node's job (one fault on many of its nodes at once: the job's
    own) is the node's too.
    """
    assert inj.injected_wall is not None
    start = inj.injected_wall - 0.5
    return sorted((i for i in incidents if i["node"] in (inj.node, f"job:{JOB}")
                   and start <= i["detected_at"] < until), key=lambda i: i["detected_at"])


def _actions_of(inj: Injection, ids: set[int], actions: list[dict[str, Any]],
                until: float) -> list[dict[str, Any]]:
    """The actions on those incidents, and those on the node for no incident in the window."""
    assert inj.injected_wall is not None
    start = inj.injected_wall
    return [a for a in actions
            if a["incident_id"] in ids or (a["node"] == inj.node and a["incident_id"] is None
                                           and start <= a["created_at"] < until)]


def _entry(inj: Injection, until: float, incidents: list[dict[str, Any]],
           actions: list[dict[str, Any]], recoveries: list[dict[str, Any]]) -> dict[str, Any]:
    """One fault of the summary: when it was detected, the incidents, actions, recoveries."""
    assert inj.injected_wall is not None
    mine = _incidents_of(inj, incidents, until)
    ids = {i["id"] for i in mine}
    done = _actions_of(inj, ids, actions, until)
    counts = Counter(f"{a['action']} {a['state']}" for a in done)
    detected = mine[0]["detected_at"] if mine and inj.expects_detection else None
    return {
        "at": format_seconds(inj.at), "at_seconds": inj.at,
        "wall_offset_seconds": round(inj.offset or 0.0, 2),
        "fault": inj.fault, "node": inj.node, "gpu": inj.gpu,
        "params": inj.params, "result": inj.error or inj.result,
        "expects_detection": inj.expects_detection,
        "detected_at": detected,
        "detection_latency_seconds": (None if detected is None
                                      else round(max(0.0, detected - inj.injected_wall), 2)),
        "incidents": [f"{i['rule']}#{i['id']}" for i in mine],
        "actions": [f"{k} x{n}" if n > 1 else k for k, n in counts.items()],
        "refused": sorted({a["verdict"] for a in done if a["state"] == "refused"}),
        "recoveries": [{"id": r["id"], "state": r["state"],
                        "failed_nodes": r["failed_nodes"],
                        "replacement_nodes": r["replacement_nodes"],
                        "mttr_seconds": r["mttr_seconds"]}
                       for r in recoveries if ids & set(r["incident_ids"])],
    }


# ---------------------------------------------------------------------- views and verdict


def page_url(controller: str) -> str:
    """The controller's topology page (``GET /`` redirects to it)."""
    return f"{controller}/ui/topology"


def ratio(value: object) -> str:
    """An effective training ratio as people read it: ``0.97``, or ``-`` when none yet."""
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def incidents_table(incidents: list[dict[str, Any]], limit: int = 10) -> Table:
    """The open incidents: id, node, rule and severity keep their width.

    The message takes what is left and ends in an ellipsis.
    """
    table = Table(title="open incidents", expand=True, title_justify="left")
    for col in ("id", "node", "rule", "severity"):
        table.add_column(col, no_wrap=True)
    table.add_column("message", ratio=1, no_wrap=True, overflow="ellipsis")
    for inc in incidents[:limit]:
        style = {"critical": "bold red", "warning": "yellow"}.get(inc["severity"], "")
        table.add_row(str(inc["id"]), inc["node"], inc["rule"],
                      Text(inc["severity"], style=style), inc["message"])
    return table


def actions_table(actions: list[dict[str, Any]], limit: int = 10) -> Table:
    """The newest actions: the outcome (or why refused) takes what is left."""
    table = Table(title="actions (newest first)", expand=True, title_justify="left")
    for col in ("action", "node", "rule", "state"):
        table.add_column(col, no_wrap=True)
    table.add_column("outcome", ratio=1, no_wrap=True, overflow="ellipsis")
    for act in sorted(actions, key=lambda a: a["created_at"], reverse=True)[:limit]:
        style = {"succeeded": "green", "refused": "red", "failed": "red"}.get(
            act["state"], "")
        table.add_row(act["action"], act["node"] or "-", act["rule"] or "-",
                      Text(act["state"], style=style),
                      act.get("verdict") or act.get("outcome") or "")
    return table


def breaker_banner(reason: str | None, opened_at: float | None,
                   closed_at: float | None) -> Panel | None:
    """Red while the breaker is open, green once it closed (simulated times)."""
    if opened_at is None:
        return None
    if closed_at is None:
        return Panel(Text(f"CIRCUIT BREAKER OPEN since t={format_seconds(round(opened_at))}: "
                          f"evictions and failovers are FROZEN; a person is paged.\n{reason}",
                          style="bold white on red"))
    return Panel(Text(f"circuit breaker closed at t={format_seconds(round(closed_at))} "
                      f"(open since t={format_seconds(round(opened_at))}: {reason}); "
                      f"evictions and failovers go on", style="bold green"))


def bottleneck_line(incident: dict[str, Any]) -> str:
    """``bottleneck: node N link L (why)`` of a ``fail-slow`` incident."""
    link = str(incident.get("subject") or "").partition("/")[2] or "?"
    why = str(incident["message"]).partition("; ")[2] or incident["message"]
    return f"bottleneck: node {incident['node']} link {link} ({why})"


def bottleneck_lines(incidents: list[dict[str, Any]]) -> list[str]:
    """One line per open fail-slow incident: what the bottleneck finder names."""
    return [bottleneck_line(i) for i in incidents
            if i["rule"] == "fail-slow" and i.get("status", "open") == "open"]


def bottlenecks(incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every bottleneck the finder named during the run (open or resolved since)."""
    return [{"incident": i["id"], "node": i["node"],
             "link": str(i.get("subject") or "").partition("/")[2],
             "status": i["status"], "message": i["message"], "line": bottleneck_line(i)}
            for i in sorted(incidents, key=lambda i: i["detected_at"])
            if i["rule"] == "fail-slow"]


def false_evictions(actions: list[dict[str, Any]], faulted: dict[str, float]) -> list[str]:
    """The nodes evicted with no fault injected on them (before the eviction).

    ``faulted``: node -> the wall time of the first fault played on it.
    """
    return [f"{a['node']} ({a['state']})" for a in actions
            if a["action"] == "evict" and a["state"] == "succeeded" and (
                a["node"] not in faulted or a["created_at"] < faulted[a["node"]] - 0.5)]


#: What took a node out of service.
_TAKEN_OUT = ("cordon", "evict", "failover")


def out_of_service(nodes: list[dict[str, Any]], actions: list[dict[str, Any]],
                   repairs: list[dict[str, Any]],
                   incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node still cordoned or evicted, and why.

    The incident and rule that took it out (a recovery's eviction: the incident that
    started the recovery), and what it waits for: the repair ladder, or a person.
    """
    rule_of = {i["id"]: i["rule"] for i in incidents}
    out = []
    for node in nodes:
        name = node["name"]
        if node["state"] not in ("cordoned", "evicted") and not node.get("cordoned_by_us"):
            continue
        taken = sorted((a for a in actions if a["node"] == name
                        and a["action"] in _TAKEN_OUT and a["state"] == "succeeded"),
                       key=lambda a: a["created_at"])
        last = taken[-1] if taken else None
        repair = next((r for r in repairs if r["node"] == name), None)
        out.append({"node": name, "state": node["state"], "by": _taken_out_by(last, rule_of),
                    "action": last["action"] if last else None,
                    "reason": (last.get("reason") or "") if last else "",
                    "awaits": _awaits(name, last, repair)})
    return out


def _taken_out_by(last: dict[str, Any] | None, rule_of: dict[int, str]) -> str:
    """``rule#incident`` of the action that took a node out (its rule, or who asked)."""
    if last is None:
        return "?"
    incident = last["incident_id"]
    if incident is not None:
        return f"{rule_of.get(incident, last['rule'])}#{incident}"
    return str(last["rule"] or last["requested_by"] or "?")


def _awaits(name: str, last: dict[str, Any] | None, repair: dict[str, Any] | None) -> str:
    """What a node out of service waits for: the repair ladder, or a person."""
    if repair is not None and repair["step"] in ("acting", "waiting", "verifying"):
        awaits = (f"the repair ladder ({repair['rung']} {repair['step']}), then the "
                  "return-to-service check")
    elif last is not None and last["action"] == "cordon":
        awaits = (f"a person: uncordon it once repaired (POST /api/v1/nodes/{name}/"
                  "uncordon), then the return-to-service check")
    else:
        awaits = (f"a person: give it back to the job's spare pool once repaired "
                  f"(POST /api/v1/jobs/{JOB}/spares/{name})")
    if repair is not None and repair["step"] == "replace":
        awaits += "; no rung of the repair ladder cleared its fault"
    return awaits


def verdict(summary: dict[str, Any]) -> str:
    """``job recovered 2 times, ETTR 0.97, 0 false evictions``: the run in one line.

    Counted from the summary (the recoveries done, the job's ratio, the healthy nodes
    evicted), with what went wrong if anything did.
    """
    recovered = sum(1 for r in summary["recoveries"] if r["state"] == "done")
    evicted = len(summary["false_evictions"])
    line = (f"job recovered {recovered} time{'' if recovered == 1 else 's'}, "
            f"ETTR {ratio(summary['job']['effective_training_ratio'])}, "
            f"{evicted} false eviction{'' if evicted == 1 else 's'}")
    if summary["undetected"]:
        line += f", {len(summary['undetected'])} fault(s) NOT DETECTED"
    if summary["false_node_lost"]:
        line += f", {len(summary['false_node_lost'])} healthy node(s) taken for lost"
    if not summary["job"].get("training"):
        line += ", job NOT training at the end"
    return line


def breaker_line(breaker: dict[str, Any]) -> str:
    """The breaker's final state, in one line."""
    if not breaker["tripped"]:
        return "circuit breaker: never tripped"
    reason = str(breaker["reason"]).removeprefix("circuit breaker open: ")
    opened = breaker.get("opened_at_seconds")
    since = f" at t={format_seconds(round(opened))}" if opened is not None else ""
    if breaker["open"]:
        return f"circuit breaker: tripped{since} and still OPEN (evictions frozen): {reason}"
    closed = breaker.get("closed_at_seconds")
    when = f" at t={format_seconds(round(closed))}" if closed is not None else ""
    return f"circuit breaker: tripped{since} ({reason}), closed{when}"


def render_summary(summary: dict[str, Any], console: Console) -> None:
    """The summary as tables; its last lines are the breaker's final state and the verdict."""
    if "error" in summary:
        console.print(f"[red]{summary['error']}[/red]")
        return
    console.print(faults_table(summary))
    for rec in summary["recoveries"]:
        mttr = rec["mttr_seconds"]
        console.print(f"recovery {rec['id'][:8]} ({rec['kind']}): {rec['state']}, "
                      f"{', '.join(rec['failed_nodes'])} -> "
                      f"{', '.join(rec['replacement_nodes']) or '-'}, generation "
                      f"{rec['generation']}" + (f", {mttr:.1f}s" if mttr is not None else ""))
    for item in summary.get("bottlenecks", []):
        slowed = str(item["message"]).partition("; ")[0]  # job J: step time +N % since T
        console.print(Text(f"{item['line']}: {slowed} ({item['status']})", style="yellow"))
    for failure in summary.get("job_failures", []):
        console.print(Text(f"why the job died: {failure['message']}", style="bold yellow"))
    for out in summary.get("out_of_service", []):
        console.print(f"[magenta]{out['node']} is {out['state']}[/magenta]: "
                      f"{out['action'] or 'taken out'} by {out['by']}"
                      + (f" ({out['reason']})" if out["reason"] else "")
                      + f"; awaits {out['awaits']}")
    job = summary["job"]
    reason = f" ({job['state_reason']})" if job.get("state_reason") else ""
    console.print(f"job {JOB}: {job['state']}{reason}, step {job['last_step']}, generation "
                  f"{job['generation']}, effective training ratio "
                  f"{ratio(job['effective_training_ratio'])}")
    _render_outcome(summary, console)


def faults_table(summary: dict[str, Any]) -> Table:
    """The injected faults: when each was detected, its incidents, actions and recovery."""
    table = Table(title=f"scenario {summary['scenario']}: injected faults", expand=True)
    for col in ("at", "node"):
        table.add_column(col, no_wrap=True)
    for col in ("fault", "detected after", "incidents", "actions", "recovery"):
        table.add_column(col, overflow="fold")
    for e in summary["faults"]:
        recs = ", ".join(f"{r['state']}" + (f" in {r['mttr_seconds']:.1f}s"
                                            if r["mttr_seconds"] is not None else "")
                         for r in e["recoveries"])
        fault = e["fault"] + (f" GPU {e['gpu']}" if e["gpu"] is not None else "")
        table.add_row(e["at"], e["node"], fault, _detected(e), ", ".join(e["incidents"]),
                      ", ".join(e["actions"]) + ("\nrefused: " + "; ".join(e["refused"])
                                                 if e["refused"] else ""), recs)
    return table


def _detected(entry: dict[str, Any]) -> Text:
    """The "detected after" cell: the latency, NOT DETECTED, or (repair)."""
    if not entry["expects_detection"]:
        return Text("(repair)", style="dim")
    latency = entry["detection_latency_seconds"]
    if latency is None:
        return Text("NOT DETECTED", style="bold red")
    return Text(f"{latency:.1f}s", style="green")


def _render_outcome(summary: dict[str, Any], console: Console) -> None:
    """The detection latency, what went wrong, the page, the breaker and the verdict."""
    lat = summary["detection_latency_seconds"]
    if lat["max"] is not None:
        console.print(f"detection latency: mean {lat['mean']:.1f}s, max {lat['max']:.1f}s")
    if summary["undetected"]:
        console.print("[bold red]undetected:[/bold red] " + "; ".join(summary["undetected"]))
    for what, key in (("healthy nodes taken for lost", "false_node_lost"),
                      ("healthy nodes evicted", "false_evictions")):
        if summary.get(key):
            console.print(f"[bold red]{what}:[/bold red] " + "; ".join(summary[key]))
    if not summary["job"].get("training"):
        console.print(f"[bold red]job {JOB} is not training at the end[/bold red]")
    console.print(f"topology page: {summary['page']} (served while the demo runs; "
                  "--keep-running keeps it up)")
    breaker = summary["breaker"]
    style = "bold red" if breaker["open"] else ("bold green" if breaker["tripped"] else "")
    console.print(Text(breaker_line(breaker), style=style))
    console.print(Text("verdict: " + summary["verdict"],
                       style="bold green" if summary["ok"] else "bold red"))


def run_demo(options: DemoOptions) -> int:
    """Start the supernode, play the scenario, print the summary; stop everything."""
    console = Console(stderr=options.headless)
    headless = options.headless or not console.is_terminal
    with tempfile.TemporaryDirectory(prefix="sn-demo-") as tmp:
        state_dir = options.state_dir or Path(tmp)
        try:
            sn = Supernode(SupernodeOptions(
                state_dir=state_dir, nodes=options.nodes, gpus=options.gpus,
                spares=options.spares, speed=options.speed, listen=options.listen,
                rules=options.rules))
            demo = Demo(options, sn)
        except SupernodeError as err:
            print(f"sn-monitor demo: {err}", file=sys.stderr)
            return 2
        stop = demo.stop

        def on_signal(*_: object) -> None:
            stop.set()

        previous = {sig: signal.signal(sig, on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            def progress(line: str) -> None:
                print(line, file=sys.stderr, flush=True)

            try:
                sn.start(progress)
            except PortTaken as err:  # as every serving command: exit 2, like a bad flag
                print(f"sn-monitor demo: {err}", file=sys.stderr)
                return 2
            except SupernodeError as err:
                print(f"sn-monitor demo: {err}", file=sys.stderr)
                return 1
            if stop.is_set():
                return 130
            progress(f"topology page: {page_url(sn.url)}")
            progress(f"playing scenario {options.scenario.name} at x{options.speed:g}: "
                     f"{options.scenario.description}")
            if headless:
                demo.run(None)
            else:
                with Live(demo.render(), console=console, refresh_per_second=4,
                          screen=False, transient=True) as live:
                    demo.run(live)
            summary = demo.summary()
            if options.headless:
                print(json.dumps(summary, indent=2))
            else:
                render_summary(summary, console)
            if options.keep_running and headless:
                progress(f"everything keeps running: controller {sn.url} (/metrics, "
                         f"/api/v1/sd); Ctrl-C or SIGTERM to stop")
                stop.wait()
            return 0 if summary.get("ok") else 1
        finally:
            sn.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
