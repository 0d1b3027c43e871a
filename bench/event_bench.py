"""A hardware fault to its incident on the fast event path: ``python -m bench.event_bench``.

Issue 34's goal: an XID or a GPU fallen off the bus becomes an incident within 25 ms
(p50) and 100 ms (p99) of the fault, while the controller carries 8,192 nodes reporting
every second, and within 250 ms (p99) in a burst of 1,000 nodes' XIDs within one second.
``--quick`` is a smoke run (512 background nodes, a burst of 100, 4 faults a phase).

Each run starts everything afresh, on a 2-core machine:

- ``sn-monitor controller`` with the packaged rules (``fatal-xid``, ``gpu-fallen-off-bus``
  and ``gpu-lost`` among them; the policy's rate limit lifted, as in ``controller_bench``)
  pinned to core 0 with ``taskset``;
- four probe agents, real ``sn-monitor agent --simulate 8`` processes sampling every
  second (the agent's default, ``interval: 1s``) and reporting to it, pinned to core 1:
  their fake NVML delivers an injected XID through the event set, and the simulated
  driver writes its ``NVRM: Xid`` line to the node's kernel log, as a real one does, so
  the agent's NVML event waiter and its kernel-log follower race for it;
- **idle**: faults injected into the probes through their ``POST /sim/fault`` (in turn
  XID 79, XID 48 and a GPU falling off the bus, each on a GPU of its own), 0.3-0.7 s
  apart (seeded), so they land anywhere in the sampling cycle;
- **loaded**: ``sn-monitor simulate`` with 8,192 nodes reporting every second on core 1
  beside the probes; once it has run 8 s (every node reported, their node-local rules
  taken), as many faults again on the probes' other GPUs;
- **burst**: at simulated second 20 of the same ``simulate`` run its scenario plays XID 79
  on 1,000 of its nodes, 100 every 100 ms, which its nodes send at once in events-only
  reports, as an agent's fast path does.

What is measured, on one clock (the machine's wall clock: the controller dates an
incident's ``detected_at`` with ``time.time()``, the probe's ``/sim/fault`` answers the
``time.time()`` it read just before injecting, and simulate stamps each burst XID's event
with ``time.time()`` when it plays it):

- **injection -> incident**: ``detected_at`` of the first incident on the faulted
  (node, GPU) minus the injection time: p50, p99, max, per phase and over the runs;
- **injection -> alert**, **-> first node-taking action**: ``created_at`` of the
  incident's ``alert`` action record and of its first ``failover``/``reset_gpu``/
  ``reboot`` record (the audit record written before the action runs: the packaged
  rules' node-taking actions wait the controller's ``settle``, 3 s by default, and are
  submitted by the sweep, every 0.5 s);
- **burst**: ``detected_at - observed_at`` of the burst nodes' ``fatal-xid`` incidents
  (``observed_at`` is the event's time, stamped by simulate at injection).

Before the runs, **idle cost**: two more probes reporting side by side to their own
controller, one with the fast path (``events: {fast: true}``, the default) and one
without, no fault injected: their CPU over 60 s (8 s with ``--quick``), from
/proc/PID/stat. The fast path's threads block while nothing happens, so the two should
cost the same.

The load average is printed at the start and the end. Nothing fails on a figure (a
goal missed is a result); the exit status is 1 when something could not be measured: a
process did not start, a fault was never detected, no burst incident was found.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    add_output_args,
    finish,
    fmt,
    free_port,
    loadavg_text,
    pct,
    proc_cpu_seconds,
    results_path,
    sn_monitor_command,
    stop_on_sigterm,
)
from bench.controller_bench import CONTROLLER_CONFIG, ControllerProcess, pick_cores
from sn_monitor import __version__
from sn_monitor.sim.fleet import node_name

PROBES = 4
GPUS = 8
#: What is injected into the probes, in turn (a fault's /sim/fault body, less the GPU).
FAULTS: tuple[dict[str, Any], ...] = (
    {"fault": "xid", "code": 79}, {"fault": "xid", "code": 48}, {"fault": "fall-off-bus"})
#: The packaged rules that open an incident for those faults (the first one wins).
FAULT_RULES = frozenset({"fatal-xid", "gpu-fallen-off-bus", "gpu-lost"})
NODE_TAKING = frozenset({"failover", "reset_gpu", "reboot", "cordon", "evict"})
GOAL_P50_S = 0.025
GOAL_P99_S = 0.100
GOAL_BURST_P99_S = 0.250
#: Seconds simulate runs before the loaded phase's faults (every node has reported).
WARM_S = 8.0
#: Seconds into simulate's run when the burst starts; it lasts one second.
BURST_AT_S = 20.0
#: How long the incidents of a phase may take to show before a fault counts as missed.
COLLECT_S = 20.0
HTTP_TIMEOUT = 10.0


@dataclass
class Injection:
    """One fault put into a probe, and what the controller made of it."""

    node: str
    gpu: int
    fault: str
    injected_at: float
    rule: str | None = None
    detected_s: float | None = None
    alert_s: float | None = None
    action: str | None = None
    action_s: float | None = None


def _http(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    try:
        conn.request(method, path, body=body,
                     headers={"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class ProbeAgent:
    """A real ``sn-monitor agent --simulate 8`` reporting every second, faulted over HTTP."""

    def __init__(self, tmp: Path, index: int | str, controller_port: int, core: int | None,
                 program: Sequence[str], fast: bool = True) -> None:
        self.node = f"probe-{index}"
        self.port = free_port()
        self.dir = tmp / self.node
        self.dir.mkdir(parents=True)
        pin = ["taskset", "-c", str(core)] if core is not None else []
        self.command = [*pin, *program, "agent", "--simulate", str(GPUS), "--node", self.node,
                        "--listen", f"127.0.0.1:{self.port}",
                        "--controller", f"http://127.0.0.1:{controller_port}",
                        "--state-dir", str(self.dir / "state"), "--log-level", "warning"]
        if not fast:
            config = self.dir / "agent.yaml"
            config.write_text("events: {fast: false}\n")
            self.command += ["--config", str(config)]
        self.log_path = self.dir / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def inject(self, gpu: int, fault: dict[str, Any]) -> Injection:
        status, body = _http(self.port, "POST", "/sim/fault",
                             json.dumps({**fault, "gpu": gpu}).encode())
        if status != 200:
            raise RuntimeError(f"{self.node}: /sim/fault answered {status}: {body[:200]!r}")
        name = fault["fault"] + (f" {fault['code']}" if "code" in fault else "")
        return Injection(self.node, gpu, name, float(json.loads(body)["injected_at"]))

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=25)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def idle_cost(tmp: Path, cores: tuple[int | None, int | None], program: Sequence[str],
              seconds: float) -> dict[str, Any]:
    """CPU of two idle probes side by side, the fast path on and off, over ``seconds``.

    The fast path's threads block (NVML's event wait, ``poll()`` on the kernel log) while
    nothing happens: the two must cost the same.
    """
    controller_core, other_core = cores
    controller = ControllerProcess(tmp, "idle-cost", controller_core, program)
    probes = {"on": ProbeAgent(tmp / "idle-cost", "on", controller.port, other_core, program),
              "off": ProbeAgent(tmp / "idle-cost", "off", controller.port, other_core,
                                program, fast=False)}
    try:
        controller.start()
        for probe in probes.values():
            probe.start()
        wait_reported(controller, [p.node for p in probes.values()])
        time.sleep(5.0)  # past start-up: the first samples, the event sets registered
        before = {k: proc_cpu_seconds(p.pid) for k, p in probes.items()}
        time.sleep(seconds)
        after = {k: proc_cpu_seconds(p.pid) for k, p in probes.items()}
    finally:
        for probe in probes.values():
            probe.stop()
        controller.stop()
    out: dict[str, Any] = {"seconds": seconds}
    for key in probes:
        b, a = before[key], after[key]
        if a is None or b is None:
            raise RuntimeError(f"the CPU of the probe with the fast path {key} was not read")
        out[f"cpu_percent_{key}"] = 100 * (a - b) / seconds
    return out


def wait_reported(controller: ControllerProcess, names: Sequence[str],
                  deadline_s: float = 60.0) -> None:
    """Until the controller knows every one of ``names`` (RuntimeError after the deadline)."""
    end = time.monotonic() + deadline_s
    missing = set(names)
    while time.monotonic() < end:
        nodes = controller.get_json("/api/v1/nodes")["nodes"]
        missing = set(names) - {n["name"] for n in nodes}
        if not missing:
            return
        time.sleep(0.2)
    raise RuntimeError(f"never reported to the controller: {sorted(missing)}")


def inject_series(probes: Sequence[ProbeAgent], gpus: Sequence[int], count: int,
                  rng: random.Random) -> list[Injection]:
    """``count`` faults, each on its own (probe, GPU), 0.3-0.7 s apart."""
    subjects = [(p, g) for g in gpus for p in probes][:count]
    out = []
    for k, (probe, gpu) in enumerate(subjects):
        if k:
            time.sleep(rng.uniform(0.3, 0.7))
        out.append(probe.inject(gpu, FAULTS[k % len(FAULTS)]))
    return out


def collect(controller: ControllerProcess, injections: Sequence[Injection],
            deadline_s: float = COLLECT_S) -> None:
    """Fill in each injection's incident and first actions, as far as they came."""
    end = time.monotonic() + deadline_s
    while True:
        for node in sorted({i.node for i in injections}):
            incidents = controller.get_json(f"/api/v1/incidents?node={node}&limit=200")
            actions = controller.get_json(f"/api/v1/actions?node={node}&limit=500")
            for injection in (i for i in injections if i.node == node):
                _match(injection, incidents["incidents"], actions["actions"])
        done = all(i.detected_s is not None and i.alert_s is not None
                   and i.action_s is not None for i in injections)
        if done or time.monotonic() > end:
            return
        time.sleep(0.5)


def _match(injection: Injection, incidents: list[dict[str, Any]],
           actions: list[dict[str, Any]]) -> None:
    mine = sorted((i for i in incidents if i["gpu"] == injection.gpu
                   and i["rule"] in FAULT_RULES), key=lambda i: i["detected_at"])
    if not mine:
        return
    first = mine[0]
    injection.rule = first["rule"]
    injection.detected_s = first["detected_at"] - injection.injected_at
    ids = {i["id"] for i in mine}
    alerts = [a["created_at"] for a in actions if a["incident_id"] in ids
              and a["action"] == "alert"]
    if alerts:
        injection.alert_s = min(alerts) - injection.injected_at
    taking = sorted((a["created_at"], a["action"]) for a in actions
                    if a["incident_id"] in ids and a["action"] in NODE_TAKING)
    if taking:
        injection.action_s = taking[0][0] - injection.injected_at
        injection.action = taking[0][1]


def burst_scenario(first: int, nodes: int, at: float) -> str:
    """XID 79 on ``nodes`` nodes from index ``first``, a tenth of them every 100 ms."""
    step = max(1, nodes // 10)
    lines = ["kind: Scenario", "name: event-bench-burst",
             f"description: XID 79 on {nodes} nodes within one second", "faults:"]
    for k, start in enumerate(range(first, first + nodes, step)):
        last = min(first + nodes, start + step) - 1
        lines.append(f"  - {{at: {at + 0.1 * k:.1f}s, node: {start}-{last}, gpu: 0, "
                     "fault: xid, code: 79}")
    return "\n".join(lines) + "\n"


def burst_latencies(controller: ControllerProcess, names: Sequence[str]) -> list[float]:
    """``detected_at - observed_at`` of each burst node's fatal-xid incident."""
    out = []
    for name in names:
        incidents = controller.get_json(f"/api/v1/incidents?node={name}&limit=20")
        fatal = [i for i in incidents["incidents"] if i["rule"] == "fatal-xid"]
        if fatal:
            first = min(fatal, key=lambda i: i["detected_at"])
            out.append(first["detected_at"] - first["observed_at"])
    return out


def _lines(stream: Any, sink: list[tuple[float, str]]) -> None:
    for line in iter(stream.readline, b""):
        sink.append((time.monotonic(), line.decode(errors="replace")))


def run_once(tmp: Path, index: int, opts: argparse.Namespace, cores: tuple[int | None, int | None],
             program: Sequence[str]) -> dict[str, Any]:
    """One run: fresh controller and probes; the idle phase, then the loaded one and the burst."""
    controller_core, other_core = cores
    rng = random.Random(index)
    controller = ControllerProcess(tmp, f"run{index}", controller_core, program)
    probes = [ProbeAgent(tmp / f"run{index}", k, controller.port, other_core, program)
              for k in range(PROBES)]
    sim: subprocess.Popen[bytes] | None = None
    out: dict[str, Any] = {"run": index}
    try:
        controller.start()
        for probe in probes:
            probe.start()
        wait_reported(controller, [p.node for p in probes])
        time.sleep(2.0)  # a few samples each: the GPUs known, the event sets registered
        idle = inject_series(probes, range(GPUS // 2), opts.faults, rng)
        collect(controller, idle)
        out["idle"] = [asdict(i) for i in idle]

        scenario = tmp / f"run{index}" / "burst.yaml"
        scenario.write_text(burst_scenario(0, opts.burst, BURST_AT_S if not opts.quick
                                           else BURST_AT_S / 2))
        pin = ["taskset", "-c", str(other_core)] if other_core is not None else []
        duration = (BURST_AT_S if not opts.quick else BURST_AT_S / 2) + 6.0
        sim = subprocess.Popen(
            [*pin, *program, "simulate", "--controller", f"http://127.0.0.1:{controller.port}",
             "--nodes", str(opts.background), "--interval", "1s", "--jitter", "0",
             "--scenario", str(scenario), "--duration", f"{duration:g}s", "--json",
             "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        stderr: list[tuple[float, str]] = []
        stdout: list[tuple[float, str]] = []
        readers = [threading.Thread(target=_lines, args=(sim.stderr, stderr), daemon=True),
                   threading.Thread(target=_lines, args=(sim.stdout, stdout), daemon=True)]
        for reader in readers:
            reader.start()
        started = _wait_started(sim, stderr)
        time.sleep(max(0.0, started + (WARM_S if not opts.quick else WARM_S / 2)
                       - time.monotonic()))
        loadavg = loadavg_text()
        loaded = inject_series(probes, range(GPUS // 2, GPUS), opts.faults, rng)
        collect(controller, loaded)
        out["loaded"] = [asdict(i) for i in loaded]
        out["loaded_loadavg"] = loadavg
        if sim.wait(timeout=duration + 120) != 0:
            raise RuntimeError(f"simulate exited {sim.returncode}: "
                               + "".join(line for _, line in stderr)[-1500:])
        for reader in readers:
            reader.join(timeout=5)
        summary = json.loads("".join(line for _, line in stdout))
        out["simulate"] = {k: summary[k] for k in ("sent", "accepted", "not_sent", "refused",
                                                   "events", "failed", "sent_per_second")}
        out["burst"] = burst_latencies(controller, [node_name(k, opts.background)
                                                    for k in range(opts.burst)])
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
            sim.wait(timeout=10)
        for probe in probes:
            probe.stop()
        out["controller_exit"] = controller.stop()
    return out


def _wait_started(sim: subprocess.Popen[bytes], stderr: list[tuple[float, str]],
                  deadline_s: float = 120.0) -> float:
    """When simulate began its run (its "simulating ..." line), monotonic."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and sim.poll() is None:
        started = next((t for t, line in stderr if line.startswith("simulating")), None)
        if started is not None:
            return started
        time.sleep(0.1)
    raise RuntimeError("simulate did not start its run: "
                       + "".join(line for _, line in stderr)[-1500:])


def _figures(values: Sequence[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": pct(values, 50), "p99": pct(values, 99),
            "max": max(values) if values else math.nan}


def summarise(results: dict[str, Any]) -> None:
    """Per phase, over every run: the latencies' figures and whether the goals held."""
    runs = [r for r in results["runs"] if "error" not in r]
    for phase in ("idle", "loaded"):
        injections = [i for r in runs for i in r.get(phase, [])]
        figures: dict[str, Any] = {
            what: _figures([i[key] for i in injections if i[key] is not None])
            for what, key in (("incident", "detected_s"), ("alert", "alert_s"),
                              ("first node-taking action", "action_s"))}
        figures["missed"] = [f"{i['node']} GPU {i['gpu']} ({i['fault']})"
                             for i in injections if i["detected_s"] is None]
        figures["by_run"] = [_figures([i["detected_s"] for i in r.get(phase, [])
                                       if i["detected_s"] is not None]) for r in runs]
        results[phase] = figures
    events = [r["simulate"]["events"] for r in runs if "simulate" in r]
    results["burst"] = {**_figures([v for r in runs for v in r.get("burst", [])]),
                        "by_run": [_figures(r.get("burst", [])) for r in runs],
                        "sent_at_once": sum(e["events_only_sent"] for e in events),
                        "with_next_report": sum(e["events_only_deferred"] for e in events)}
    loaded_runs = results["loaded"]["by_run"]
    results["held"] = {
        "loaded_runs_within_goal": sum(
            1 for f in loaded_runs if f["n"] and f["p50"] <= GOAL_P50_S
            and f["p99"] <= GOAL_P99_S),
        "runs": len(runs),
        "burst_p99_within_goal": bool(results["burst"]["n"])
        and results["burst"]["p99"] <= GOAL_BURST_P99_S,
    }


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [f"fast event path: {meta['runs']} run(s), {meta['faults']} faults a phase on "
             f"{PROBES} probe agents, {meta['background']} background nodes at 1 s, a burst "
             f"of {meta['burst']}; load average {meta['loadavg_start']} -> "
             f"{meta['loadavg_end']}", "",
             f"  {'ms':<50}{'n':>5}{'p50':>9}{'p99':>9}{'max':>9}"]

    def row(label: str, f: dict[str, Any]) -> str:
        return (f"  {label:<50}{f['n']:>5}{fmt(_ms(f['p50']), 1):>9}"
                f"{fmt(_ms(f['p99']), 1):>9}{fmt(_ms(f['max']), 1):>9}")

    for phase, title in (("idle", "idle"), ("loaded", f"{meta['background']} nodes")):
        for what, f in results[phase].items():
            if what in ("missed", "by_run"):
                continue
            lines.append(row(f"{title}: injection -> {what}", f))
        if results[phase]["missed"]:
            lines.append(f"    never detected: {', '.join(results[phase]['missed'])}")
    burst = results["burst"]
    lines.append(row(f"burst of {meta['burst']}: XID -> incident", burst))
    lines.append(f"    the burst's events: {burst['sent_at_once']} sent at once, "
                 f"{burst['with_next_report']} with their node's next report (its earlier "
                 "events unacknowledged, or no connection free)")
    lines.append("")
    for k, f in enumerate(results["loaded"]["by_run"]):
        lines.append(f"  run {k + 1}, loaded: p50 {fmt(_ms(f['p50']), 1)} ms, p99 "
                     f"{fmt(_ms(f['p99']), 1)} ms (n={f['n']}); burst p99 "
                     f"{fmt(_ms(results['burst']['by_run'][k]['p99']), 1)} ms")
    idle = results.get("idle_cost", {})
    if "error" not in idle and idle:
        lines.append(f"  idle probe CPU over {idle['seconds']:g} s, side by side: fast path on "
                     f"{idle['cpu_percent_on']:.2f} %, off {idle['cpu_percent_off']:.2f} % "
                     "of a core")
    held = results["held"]
    lines.append(f"  goal (p50 <= {GOAL_P50_S * 1e3:g} ms, p99 <= {GOAL_P99_S * 1e3:g} ms "
                 f"with the background): {held['loaded_runs_within_goal']} of "
                 f"{held['runs']} runs; burst p99 <= {GOAL_BURST_P99_S * 1e3:g} ms: "
                 f"{'yes' if held['burst_p99_within_goal'] else 'no'}")
    return "\n".join(lines)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or math.isnan(seconds) else seconds * 1e3


def problems(results: dict[str, Any]) -> list[str]:
    out = [f"run {r['run']}: {r['error']}" for r in results["runs"] if "error" in r]
    if "error" in results.get("idle_cost", {}):
        out.append(f"idle cost: {results['idle_cost']['error']}")
    for phase in ("idle", "loaded"):
        if results.get(phase, {}).get("missed"):
            out.append(f"{phase}: faults never detected: {results[phase]['missed']}")
    if not results.get("burst", {}).get("n"):
        out.append("burst: no incident of the burst was found")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.event_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_args(parser, "a smoke run: 512 background nodes, a burst of 100, 4 faults")
    parser.add_argument("--runs", type=int, help="runs (default 5; 1 with --quick)")
    parser.add_argument("--background", type=int, help="simulate's nodes (default 8192)")
    parser.add_argument("--burst", type=int, help="burst nodes (default 1000)")
    parser.add_argument("--faults", type=int, help="faults a phase, at most 16 (default 12)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin with taskset")
    parser.add_argument("--sn-monitor", metavar="COMMAND",
                        help="the sn-monitor command line (default: this environment's)")
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    args.background = args.background or (512 if args.quick else 8192)
    args.burst = min(args.background, args.burst or (100 if args.quick else 1000))
    args.faults = min(PROBES * GPUS // 2, args.faults or (4 if args.quick else 12))
    stop_on_sigterm()
    out_path = results_path(args, "events.json")
    program = sn_monitor_command(args.sn_monitor)
    controller_core, other_cores, pinning = pick_cores(not args.no_pin)
    other = min(other_cores) if other_cores and controller_core is not None else None
    if other_cores is not None:
        os.sched_setaffinity(0, other_cores)
    results: dict[str, Any] = {"meta": {
        "version": __version__, "mode": "quick" if args.quick else "full",
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "pinning": pinning + (f"; probes and simulate on core {other}" if other is not None
                              else ""),
        "runs": args.runs, "background": args.background, "burst": args.burst,
        "faults": args.faults, "loadavg_start": loadavg_text(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "controller_config": CONTROLLER_CONFIG, "sn_monitor_command": program,
    }, "runs": []}
    with tempfile.TemporaryDirectory(prefix="sn-eventbench-") as tmpdir:
        print("... idle cost, the fast path on and off", file=sys.stderr, flush=True)
        try:
            results["idle_cost"] = idle_cost(Path(tmpdir), (controller_core, other), program,
                                             8.0 if args.quick else 60.0)
        except (RuntimeError, OSError) as err:
            results["idle_cost"] = {"error": f"{type(err).__name__}: {err}"}
        for k in range(args.runs):
            print(f"... run {k + 1} of {args.runs}", file=sys.stderr, flush=True)
            try:
                run = run_once(Path(tmpdir), k, args, (controller_core, other), program)
            except Exception as err:  # noqa: BLE001 - one run failing must not hide the rest
                run = {"run": k, "error": f"{type(err).__name__}: {err}"}
            results["runs"].append(run)
    results["meta"]["loadavg_end"] = loadavg_text()
    summarise(results)
    return finish(results, out_path, problems(results), render)


if __name__ == "__main__":
    sys.exit(main())
