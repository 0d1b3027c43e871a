"""Agent cost on a simulated 8-GPU node: sample CPU, /metrics latency, RSS, node_exporter.

Run with ``python -m bench.agent_bench`` (``make bench``); ``--quick`` for a smoke test.

Everything runs on 127.0.0.1 against a simulated node in a temporary directory (8 H100
GPUs with 18 NVLinks each behind the fake NVML, each running one training process that
the agent attributes from /proc, 8 InfiniBand ports, 4 netdevs). Shared
CI machines are noisy, so every figure is a median (with a tail percentile) and the
comparisons are ratios measured in the same run, with the two sides interleaved. The
goals are printed for reference only: nothing here passes or fails on a number. The
exit status is 1 when something could not be measured (a part raised, the agent never
became healthy, no sample or scrape came back: listed on stderr at the end); a figure
that misses its goal is a result. Without node_exporter the comparison is skipped (said
so), which is not a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import math
import os
import platform
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests
import yaml

from bench.common import (
    add_output_args,
    finish,
    fmt,
    free_port,
    proc_cpu_seconds,
    proc_status_kb,
    results_path,
    sn_monitor_command,
    stop_on_sigterm,
    summary,
)
from sn_monitor import __version__
from sn_monitor.agent.daemon import Agent
from sn_monitor.agent.exposition import TextRenderer
from sn_monitor.agent.registry import COLLECTORS, build_collectors
from sn_monitor.agent.sampler import Sampler
from sn_monitor.agent.settings import (
    AgentSettings,
    AttributionSettings,
    CollectorSettings,
    KubeletAttributionSettings,
    SlurmAttributionSettings,
)
from sn_monitor.clock import SystemClock
from sn_monitor.sim.node import SimulatedNode
from sn_monitor.sim.slurm_jobs import SimJob, write_commands
from tests.support.kubelet import FakeKubelet, pod, serving

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
HOST_SIDE = ("net", "infiniband", "host", "kmsg")
NET_IB = ("net", "infiniband")
#: The collector sets timed in part 1, interleaved cycle by cycle. ``all`` attributes GPU
#: processes from /proc only; ``all+attribution`` also asks both platform sources, the
#: kubelet's pod-resources API (a real gRPC server in this process) at every sample and
#: Slurm's squeue/scontrol (the simulator's) on the source's own thread.
SETS: dict[str, tuple[str, ...]] = {
    "all": tuple(COLLECTORS),
    "all+attribution": tuple(COLLECTORS),
    "host-side": HOST_SIDE,
    "net+ib": NET_IB,
}
#: The Slurm job the bench's GPU processes run in (cgroup v2 path, as slurmd makes it).
BENCH_JOB = SimJob(job_id="1001", name="train", user="alice", uid=1000, partition="gpu",
                   gpus={"bench": tuple(range(8))})
JOB_CGROUP = "/system.slice/slurmstepd.scope/job_1001/step_0/user/task_0"
#: Issue 16's goals: an 8-GPU sample, a scrape of a fresh sample, the agent process's
#: memory, and the CPU per fresh scrape against node_exporter's on the same tree.
GOALS = {"sample_cpu_ms": 3.0, "scrape_ms": 5.0, "rss_mb": 40.0, "scrape_ratio": 1.0,
         "side_by_side_ratio": 1.0}
HTTP_TIMEOUT = 5.0


# ---------------------------------------------------------------- small helpers


def sample_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def count_prefixed(lines: Iterable[str], prefix: str) -> int:
    return sum(1 for line in lines if line.startswith(prefix))


def wait_http(session: requests.Session, url: str, deadline_s: float,
              alive: Callable[[], bool] = lambda: True) -> float | None:
    """Poll ``url`` until it answers 200; seconds it took, or None past the deadline."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if not alive():
            return None
        try:
            if session.get(url, timeout=1.0).status_code == 200:
                return time.monotonic() - start
        except requests.RequestException:
            pass
        time.sleep(0.1)
    return None


def stop_process(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int | None, float]:
    """SIGTERM, wait up to ``timeout``; kill if it is still there. (exit code, seconds)."""
    if proc.poll() is not None:
        return proc.returncode, 0.0
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
        proc.kill()
        proc.wait(timeout=10)
    return code, time.monotonic() - start


def only(settings: AgentSettings, names: Sequence[str]) -> AgentSettings:
    """``settings`` with only the named collectors enabled."""
    switches: dict[str, Any] = {}
    for name in COLLECTORS:
        current = getattr(settings.collectors, name)
        switches[name] = replace(current, enabled=name in names)
    return replace(settings, collectors=CollectorSettings(**switches))


# ---------------------------------------------------------------- 1. sample CPU


class AttributionPlatforms:
    """Both platforms a node's attribution asks, for the bench's agents.

    Slurm: :data:`BENCH_JOB` on every GPU, as the simulator's ``squeue``/``scontrol``
    (put first on this process's ``PATH``, which the agent subprocess inherits); the
    kubelet: a real pod-resources gRPC server with a pod holding the last two GPUs.
    """

    def __init__(self, tmp: Path, uuids: Sequence[str]) -> None:
        self.tmp = tmp
        self.kubelet_socket = tmp / "kubelet.sock"
        bin_dir = write_commands([BENCH_JOB], tmp / "slurm-bin")
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        self.kubelet = FakeKubelet(self.kubelet_socket, [pod(
            "notebook-0", "research", {"jupyter": {"nvidia.com/gpu": list(uuids[-2:])}})])

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        with serving(self.kubelet):
            yield

    def agent_config(self) -> Path:
        """An agent.yaml with both sources on."""
        path = self.tmp / "agent-attribution.yaml"
        path.write_text(yaml.safe_dump({"attribution": {
            "kubelet": {"enabled": True, "socket": str(self.kubelet_socket)},
            "slurm": {"enabled": True, "node": "bench"}}}))
        return path


def with_attribution(settings: AgentSettings, kubelet_socket: Path) -> AgentSettings:
    """``settings`` with both platform sources on (Slurm's commands found on ``PATH``)."""
    return replace(settings, attribution=AttributionSettings(
        kubelet=KubeletAttributionSettings(enabled=True, socket=str(kubelet_socket)),
        slurm=SlurmAttributionSettings(enabled=True, node="bench")))


def bench_sample(node: SimulatedNode, settings: AgentSettings, warmup: int,
                 cycles: int, attributed: AgentSettings) -> dict[str, Any]:
    clock = SystemClock()
    samplers = {
        label: Sampler("bench", build_collectors(
            only(attributed if label == "all+attribution" else settings, names),
            node.nvml, clock), clock)
        for label, names in SETS.items()
    }
    cpu_ns: dict[str, list[int]] = {label: [] for label in samplers}
    wall_ns: dict[str, list[int]] = {label: [] for label in samplers}
    per_collector: dict[str, list[float]] = {name: [] for name in COLLECTORS}
    failures: dict[str, int] = {}
    labels = list(samplers)
    shape: dict[str, Any] = {}
    try:
        for i in range(warmup + cycles):
            node.step(1.0)  # outside the measure: the simulator's cost, not the agent's
            order = labels[i % len(labels):] + labels[:i % len(labels)]
            for label in order:
                w0 = time.perf_counter_ns()
                t0 = time.process_time_ns()
                snap = samplers[label].sample()
                t1 = time.process_time_ns()
                w1 = time.perf_counter_ns()
                for status in snap.collectors:
                    if not status.success:
                        key = f"{label}:{status.name}"
                        failures[key] = failures.get(key, 0) + 1
                if i < warmup:
                    continue
                cpu_ns[label].append(t1 - t0)
                wall_ns[label].append(w1 - w0)
                if label == "all":
                    for status in snap.collectors:
                        per_collector[status.name].append(status.duration_seconds)
                    if not shape:
                        shape = {
                            "gpus": len(snap.gpus),
                            "nvlinks_per_gpu": len(node.gpus[0].nvlinks) if node.gpus else 0,
                            "ib_ports": len(snap.infiniband),
                            "netdevs_reported": len(snap.net),
                            "netdevs_in_tree": len(os.listdir(node.tree.sysfs / "class" / "net")),
                        }
    finally:
        for sampler in samplers.values():
            sampler.close()
    result: dict[str, Any] = {"warmup": warmup, "cycles": cycles, "shape": shape,
                              "failures": failures, "sets": {}}
    for label in labels:
        result["sets"][label] = {
            "collectors": list(SETS[label]),
            "cpu_ms": summary([v / 1e6 for v in cpu_ns[label]]),
            "wall_ms": summary([v / 1e6 for v in wall_ns[label]]),
        }
    result["per_collector_wall_ms"] = {
        name: summary([v * 1e3 for v in values]) for name, values in per_collector.items()
    }
    # Ratio within each cycle (same moment, same noise), then the median of the ratios.
    all_cpu, host_cpu = cpu_ns["all"], cpu_ns["host-side"]
    result["attribution_over_all"] = statistics.median(
        a / b for a, b in zip(cpu_ns["all+attribution"], all_cpu, strict=True) if b
    ) if all_cpu else math.nan
    result["host_side_share_of_all"] = statistics.median(
        h / a for h, a in zip(host_cpu, all_cpu, strict=True) if a
    ) if all_cpu else math.nan
    return result


def profile_samples(node: SimulatedNode, settings: AgentSettings, cycles: int,
                    top: int = 8) -> dict[str, Any]:
    """cProfile ``cycles`` full samples; the sn_monitor/agent functions by cumulative time."""
    clock = SystemClock()
    sampler = Sampler("bench", build_collectors(settings, node.nvml, clock), clock)
    profiler = cProfile.Profile()
    try:
        sampler.sample()
        for _ in range(cycles):
            node.step(1.0)
            profiler.enable()
            sampler.sample()
            profiler.disable()
    finally:
        sampler.close()
    stats = pstats.Stats(profiler)
    rows = []
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = 0.0
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        if func == "sample" and filename.endswith("sampler.py"):
            total = cumtime
        norm = filename.replace(os.sep, "/")
        if "/sn_monitor/" not in norm:
            continue
        where = norm.split("/sn_monitor/", 1)[1]
        rows.append({"function": f"{where}:{line}({func})", "ncalls": ncalls,
                     "tottime_ms_per_sample": tottime / cycles * 1e3,
                     "cumtime_ms_per_sample": cumtime / cycles * 1e3,
                     "in_simulator": where.startswith("sim/")})
    wrappers = ("(sample)", "(_sample)", "(_run)")
    agent_rows = [r for r in rows if not r["in_simulator"]
                  and not r["function"].endswith(wrappers)]
    return {
        "cycles": cycles,
        "profiled_ms_per_sample": total / cycles * 1e3 if cycles else math.nan,
        "top_cumulative": sorted(agent_rows, key=lambda r: -r["cumtime_ms_per_sample"])[:top],
        "top_self": sorted(agent_rows, key=lambda r: -r["tottime_ms_per_sample"])[:top],
        "simulator_self_ms_per_sample": sum(r["tottime_ms_per_sample"]
                                            for r in rows if r["in_simulator"]),
    }


def profile_exposition(exporter: Any, renders: int, top: int = 5) -> dict[str, Any]:
    """CPU of rendering one snapshot's /metrics in-process (no HTTP, no cache), and where
    it goes (cProfile). The server renders once per snapshot; scrapes in between are
    served from memory."""
    source: Callable[[], Iterable[Any]] = exporter.families
    render = TextRenderer().render  # as the server renders: the series' labels kept
    cpu: list[float] = []
    for _ in range(renders):
        t0 = time.process_time_ns()
        body = render(source())
        cpu.append((time.process_time_ns() - t0) / 1e6)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(renders):
        render(source())
    profiler.disable()
    raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        norm = filename.replace(os.sep, "/")
        short = "/".join(norm.split("/")[-2:])
        rows.append({"function": f"{short}:{line}({func})", "ncalls": ncalls,
                     "tottime_ms_per_render": tottime / renders * 1e3,
                     "cumtime_ms_per_render": cumtime / renders * 1e3})
    families: dict[str, int] = {}
    for line in sample_lines(body.decode(errors="replace")):
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for cut in ("sn_gpu_nvlink", "sn_gpu", "sn_infiniband", "sn_network", "sn_host", "sn_"):
            if name.startswith(cut):
                families[cut] = families.get(cut, 0) + 1
                break
    return {
        "renders": renders,
        "cpu_ms": summary(cpu),
        "sample_lines_by_prefix": dict(sorted(families.items(), key=lambda kv: -kv[1])),
        "top_self": sorted(rows, key=lambda r: -r["tottime_ms_per_render"])[:top],
    }


# ---------------------------------------------------------------- 2+4. scrapes


def start_node_exporter(tree_root: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    args = [
        NODE_EXPORTER,
        "--collector.disable-defaults", "--collector.netdev", "--collector.infiniband",
        # 1.5 reads netdev stats over netlink by default, i.e. from the *real* host's
        # interfaces; --no-...netlink makes it read <procfs>/net/dev like we do.
        "--no-collector.netdev.netlink",
        f"--path.procfs={tree_root / 'proc'}", f"--path.sysfs={tree_root / 'sys'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with log_path.open("wb") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def timed_get(session: requests.Session, url: str) -> tuple[float, int, bytes]:
    t0 = time.perf_counter_ns()
    response = session.get(url, timeout=HTTP_TIMEOUT)
    body = response.content
    t1 = time.perf_counter_ns()
    return (t1 - t0) / 1e6, response.status_code, body


def bench_scrapes(node: SimulatedNode, settings: AgentSettings, warmup: int, scrapes: int,
                  tmp: Path) -> dict[str, Any]:
    """Our /metrics (part 2) and node_exporter's (part 4), GETs interleaved one by one."""
    clock = SystemClock()
    agent_settings = replace(settings, node="bench", listen="127.0.0.1:0")
    agent = Agent(agent_settings, build_collectors(agent_settings, node.nvml, clock), clock,
                  before_sample=node.step)
    exporter: subprocess.Popen[bytes] | None = None
    result: dict[str, Any] = {"warmup": warmup, "scrapes": scrapes}
    try:
        agent.tick()  # a sample before each scrape (below); the sampling loop is not started
        agent.http.start()
        targets = {"sn-monitor": f"http://127.0.0.1:{agent.http.port}/metrics"}
        if not os.access(NODE_EXPORTER, os.X_OK):
            result["node_exporter"] = {
                "skipped": f"{NODE_EXPORTER} not found: apt-get install prometheus-node-exporter"
            }
        else:
            port = free_port()
            exporter = start_node_exporter(node.root, port, tmp / "node_exporter.log")
            with requests.Session() as probe:
                took = wait_http(probe, f"http://127.0.0.1:{port}/metrics", 10.0,
                                 alive=lambda: exporter is not None and exporter.poll() is None)
            if took is None:
                log = (tmp / "node_exporter.log").read_text(errors="replace")[-2000:]
                result["node_exporter"] = {"error": f"did not answer within 10 s: {log}"}
            else:
                targets["node_exporter"] = f"http://127.0.0.1:{port}/metrics"
                result["node_exporter_version"] = subprocess.run(
                    [NODE_EXPORTER, "--version"], capture_output=True, text=True, timeout=10,
                    check=False,
                ).stderr.splitlines()[0:1]
        sessions = {name: requests.Session() for name in targets}
        times: dict[str, list[float]] = {name: [] for name in targets}
        bodies: dict[str, bytes] = {}
        errors: dict[str, int] = {name: 0 for name in targets}
        names = list(targets)
        ne_cpu0 = proc_cpu_seconds(exporter.pid) if exporter is not None else None
        try:
            for i in range(warmup + scrapes):
                if i == warmup and exporter is not None:
                    ne_cpu0 = proc_cpu_seconds(exporter.pid)
                agent.tick()  # a fresh snapshot: every scrape formats a new one
                order = names if i % 2 == 0 else names[::-1]
                for name in order:
                    ms, code, body = timed_get(sessions[name], targets[name])
                    if code != 200:
                        errors[name] += 1
                        continue
                    bodies[name] = body
                    if i >= warmup:
                        times[name].append(ms)
        finally:
            for s in sessions.values():
                s.close()
        ne_cpu1 = proc_cpu_seconds(exporter.pid) if exporter is not None else None
        result["exposition"] = profile_exposition(agent.exporter, max(10, scrapes // 3))
        for name in names:
            text = bodies.get(name, b"").decode(errors="replace")
            lines = sample_lines(text)
            prefixes = (("sn_network_", "sn_infiniband_") if name == "sn-monitor"
                        else ("node_network_", "node_infiniband_"))
            result[name] = {
                "url": targets[name],
                "wall_ms": summary(times[name]),
                "non_200": errors[name],
                "response_bytes": len(bodies.get(name, b"")),
                "sample_lines": len(lines),
                "netdev_lines": count_prefixed(lines, prefixes[0]),
                "infiniband_lines": count_prefixed(lines, prefixes[1]),
            }
        if ne_cpu0 is not None and ne_cpu1 is not None and scrapes:
            result["node_exporter"]["cpu_ms_per_scrape_from_proc_stat"] = (
                (ne_cpu1 - ne_cpu0) / scrapes * 1e3
            )
    finally:
        if exporter is not None:
            exit_code, _ = stop_process(exporter, 10.0)
            result.setdefault("node_exporter", {})["exit_code"] = exit_code
        agent.stop()
    return result


# ---------------------------------------------------------------- 5. side by side


def _running(proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
    return lambda: proc.poll() is None


def bench_side_by_side(tree_root: Path, seconds: int, tmp: Path) -> dict[str, Any]:
    """Both as processes on one /proc and /sys tree, each scraped once a second: our
    agent samples the same two sources node_exporter reads (net, InfiniBand) every second,
    so every scrape gets a fresh sample; CPU of each process from /proc over the window."""
    if not os.access(NODE_EXPORTER, os.X_OK):
        return {"skipped": f"{NODE_EXPORTER} not found: apt-get install prometheus-node-exporter"}
    ours_port, theirs_port = free_port(), free_port()
    config = tmp / "side-agent.yaml"
    config.write_text(
        f"node: bench\ninterval: 1s\nlisten: 127.0.0.1:{ours_port}\n"
        f"paths: {{procfs: {tree_root / 'proc'}, sysfs: {tree_root / 'sys'}, "
        f"kmsg: {tmp / 'no-kmsg'}}}\n"
        "collectors: {nvml: {enabled: false}, host: {enabled: false}, "
        "kmsg: {enabled: false}, net: {enabled: true}, infiniband: {enabled: true}}\n"
        "guard: {mode: 'off'}\nlog_level: warning\n")
    with (tmp / "side-agent.log").open("wb") as log:
        ours = subprocess.Popen([*sn_monitor_command(), "agent", "--config", str(config)],
                                stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    theirs = start_node_exporter(tree_root, theirs_port, tmp / "side-node-exporter.log")
    urls = {"sn-monitor": f"http://127.0.0.1:{ours_port}/metrics",
            "node_exporter": f"http://127.0.0.1:{theirs_port}/metrics"}
    procs = {"sn-monitor": ours, "node_exporter": theirs}
    result: dict[str, Any] = {"seconds": seconds}
    try:
        with requests.Session() as session:
            for name, url in urls.items():
                if wait_http(session, url, 20.0, alive=_running(procs[name])) is None:
                    result["error"] = f"{name} did not answer within 20 s"
                    return result
            time.sleep(2.0)  # past start-up (imports, the first layout of the ports)
            cpu0 = {name: proc_cpu_seconds(p.pid) for name, p in procs.items()}
            t0 = time.monotonic()
            ok = dict.fromkeys(urls, 0)
            for k in range(seconds):
                time.sleep(max(0.0, t0 + k + 1 - time.monotonic()))
                for name in (list(urls) if k % 2 == 0 else list(urls)[::-1]):
                    _, code, _ = timed_get(session, urls[name])
                    ok[name] += code == 200
            cpu1 = {name: proc_cpu_seconds(p.pid) for name, p in procs.items()}
        for name in urls:
            before, after = cpu0[name], cpu1[name]
            result[name] = {
                "scrapes_ok": ok[name],
                "cpu_ms_per_scrape": ((after - before) / ok[name] * 1e3
                                      if before is not None and after is not None and ok[name]
                                      else math.nan)}
        theirs_ms = result["node_exporter"]["cpu_ms_per_scrape"]
        result["ratio"] = (result["sn-monitor"]["cpu_ms_per_scrape"] / theirs_ms
                           if theirs_ms else math.nan)
    finally:
        for proc in procs.values():
            stop_process(proc, 10.0)
    return result


# ---------------------------------------------------------------- 3. RSS


def agent_command(port: int, duration: float, config: Path | None = None) -> list[str]:
    return [*sn_monitor_command(), "agent", "--simulate", "8", "--listen", f"127.0.0.1:{port}",
            "--duration", str(duration), "--log-level", "warning",
            *(("--config", str(config), "--node", "bench") if config else ())]


def bench_rss(run_seconds: int, tmp: Path, config: Path | None = None) -> dict[str, Any]:
    """The agent process's memory; ``config`` (attribution on) as its config file."""
    port = free_port()
    command = agent_command(port, 30.0, config)
    log_path = tmp / ("agent-attribution.log" if config else "agent.log")
    result: dict[str, Any] = {"command": " ".join(command), "run_seconds": run_seconds}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        with requests.Session() as session:
            healthy = wait_http(session, f"http://127.0.0.1:{port}/healthz", 20.0,
                                alive=lambda: proc.poll() is None)
            if healthy is None:
                result["error"] = ("agent not healthy within 20 s: "
                                   + log_path.read_text(errors="replace")[-2000:])
                return result
            result["healthy_after_s"] = healthy
            rss_after_start = proc_status_kb(proc.pid, "VmRSS")
            cpu0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
            scrape_ms: list[float] = []
            sizes: list[int] = []
            rss_kb: list[int] = []
            for k in range(run_seconds):
                time.sleep(max(0.0, t0 + k + 1 - time.monotonic()))
                ms, code, body = timed_get(session, f"http://127.0.0.1:{port}/metrics")
                if code == 200:
                    scrape_ms.append(ms)
                    sizes.append(len(body))
                rss = proc_status_kb(proc.pid, "VmRSS")
                if rss is not None:
                    rss_kb.append(rss)
            cpu1, t1 = proc_cpu_seconds(proc.pid), time.monotonic()
            hwm = proc_status_kb(proc.pid, "VmHWM")
        result.update({
            "rss_mb_after_start": (rss_after_start or 0) / 1024,
            "rss_mb_end": rss_kb[-1] / 1024 if rss_kb else math.nan,
            "rss_mb_median": statistics.median(rss_kb) / 1024 if rss_kb else math.nan,
            "hwm_mb": (hwm or 0) / 1024,
            "threads": proc_status_kb(proc.pid, "Threads"),
            "scrapes_ok": len(scrape_ms),
            "scrape_wall_ms": summary(scrape_ms),
            "response_bytes": sizes[-1] if sizes else 0,
            # sampling (incl. the simulator's step) + scrapes, as a share of one core
            "cpu_percent_of_one_core": (
                (cpu1 - cpu0) / (t1 - t0) * 100 if cpu0 is not None and cpu1 is not None
                else math.nan
            ),
        })
        exit_code, took = stop_process(proc, 20.0)
        result["sigterm_exit_code"] = exit_code
        result["sigterm_stop_s"] = took
        result["stopped_within_20s"] = exit_code is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return result


# ---------------------------------------------------------------- report


def _render_rss(rss: dict[str, Any] | None, title: str) -> list[str]:
    out: list[str] = []
    if not rss or set(rss) == {"error"}:
        return out
    out.append("")
    out.append(f"{title} ({rss['command']})     goal <= {GOALS['rss_mb']:g} MB")
    if "error" in rss:
        out.append(f"   ERROR: {rss['error']}")
    else:
        out.append(f"   healthy after {fmt(rss['healthy_after_s'])} s; VmRSS after start "
                   f"{fmt(rss['rss_mb_after_start'], 1)} MB, median over {rss['run_seconds']} "
                   f"s {fmt(rss['rss_mb_median'], 1)} MB, end {fmt(rss['rss_mb_end'], 1)} MB, "
                   f"VmHWM {fmt(rss['hwm_mb'], 1)} MB; threads {rss['threads']}")
        out.append(f"   scrapes once a second: {rss['scrapes_ok']} ok, median "
                   f"{fmt(rss['scrape_wall_ms']['median'])} ms; CPU "
                   f"{fmt(rss['cpu_percent_of_one_core'], 1)} % of one core "
                   f"(sampling incl. simulator step, + scrapes)")
        out.append(f"   SIGTERM: exit code {rss['sigterm_exit_code']} after "
                   f"{fmt(rss['sigterm_stop_s'])} s (limit 20 s)")
    return out


def render(results: dict[str, Any]) -> str:
    out: list[str] = []
    meta = results["meta"]
    out.append(f"sn-monitor {meta['version']} agent bench  ({meta['mode']}; python "
               f"{meta['python']}; {meta['cpus']} CPUs; load1 at start {meta['load1']})")
    for part in ("sample", "profile", "scrape", "rss", "rss_attribution"):
        if set(results.get(part, {})) == {"error"}:  # it raised: nothing else to show
            out.append(f"{part}: ERROR {results[part]['error']}")
    sample = results.get("sample")
    if sample and "error" not in sample:
        shape = sample["shape"]
        out.append(f"simulated node: {shape.get('gpus')} GPUs x {shape.get('nvlinks_per_gpu')} "
                   f"NVLinks, {shape.get('ib_ports')} IB ports, "
                   f"{shape.get('netdevs_in_tree')} netdevs "
                   f"({shape.get('netdevs_reported')} reported: lo is excluded by default)")
        out.append("")
        out.append(f"1. CPU per sample (process_time, {sample['cycles']} cycles after "
                   f"{sample['warmup']} warm-up, sets interleaved)     goal <= "
                   f"{GOALS['sample_cpu_ms']:g} ms CPU")
        out.append(f"   {'collector set':<44} {'cpu med':>8} {'cpu p90':>8} {'wall med':>9}")
        names = {"all": "all collectors (nvml on fake NVML + host-side)",
                 "all+attribution": "all, attribution on (kubelet + Slurm)",
                 "host-side": "host-side (net+infiniband+host+kmsg)",
                 "net+ib": "net+infiniband only"}
        for label, data in sample["sets"].items():
            out.append(f"   {names[label]:<44} {fmt(data['cpu_ms']['median']):>8} "
                       f"{fmt(data['cpu_ms']['p90']):>8} {fmt(data['wall_ms']['median']):>9}  ms")
        out.append(f"   host-side / all (median of per-cycle ratios): "
                   f"{fmt(sample['host_side_share_of_all'], 3)}")
        out.append(f"   attribution on / all (median of per-cycle ratios): "
                   f"{fmt(sample['attribution_over_all'], 3)}")
        out.append("   per collector, CollectorStatus.duration_seconds (SystemClock, wall) in "
                   "the 'all' set:")
        for name, data in sample["per_collector_wall_ms"].items():
            out.append(f"     {name:<12} median {fmt(data['median'], 3):>7} ms   "
                       f"p90 {fmt(data['p90'], 3):>7} ms")
        out.append("   note: the nvml figure is mostly the fake NVML (Python, the simulator's "
                   "cost); real libnvidia-ml calls cost differently.")
        if sample["failures"]:
            out.append(f"   collector failures: {sample['failures']}")
    prof = results.get("profile")
    if prof and "error" not in prof:
        out.append("")
        out.append(f"   cProfile, {prof['cycles']} full samples "
                   f"({fmt(prof['profiled_ms_per_sample'])} ms/sample under the profiler; "
                   f"simulator self time "
                   f"{fmt(prof['simulator_self_ms_per_sample'])} ms/sample)")
        out.append("   top sn_monitor/agent functions by cumulative time (ms per sample):")
        for row in prof["top_cumulative"][:5]:
            out.append(f"     {fmt(row['cumtime_ms_per_sample'], 3):>7} cum "
                       f"{fmt(row['tottime_ms_per_sample'], 3):>7} self  {row['function']}")
    scrape = results.get("scrape")
    if scrape and set(scrape) != {"error"}:
        ne = scrape.get("node_exporter", {})
        out.append("")
        out.append(f"2. /metrics scrape, keep-alive Session, {scrape['scrapes']} GETs after "
                   f"{scrape['warmup']} warm-up (interleaved with node_exporter)     "
                   f"goal <= {GOALS['scrape_ms']:g} ms")
        out.append(f"   {'target':<16} {'med ms':>7} {'p99 ms':>7} {'bytes':>8} {'samples':>8} "
                   f"{'netdev':>7} {'ib':>5}")
        for name in ("sn-monitor", "node_exporter"):
            data = scrape.get(name, {})
            if "wall_ms" not in data:
                continue
            out.append(f"   {name:<16} {fmt(data['wall_ms']['median']):>7} "
                       f"{fmt(data['wall_ms']['p99']):>7} {data['response_bytes']:>8} "
                       f"{data['sample_lines']:>8} {data['netdev_lines']:>7} "
                       f"{data['infiniband_lines']:>5}")
        if "skipped" in ne or "error" in ne:
            out.append(f"   node_exporter: {ne.get('skipped') or ne.get('error')}")
        expo = scrape.get("exposition")
        if expo:
            out.append(f"   sn-monitor /metrics render of one snapshot (TextRenderer, no "
                       f"HTTP): CPU median {fmt(expo['cpu_ms']['median'])} ms")
            lines = ", ".join(f"{k}* {v}" for k, v in expo["sample_lines_by_prefix"].items())
            out.append(f"     sample lines by family: {lines}")
            out.append("     top self time per render (under cProfile): " + "; ".join(
                f"{r['function']} {fmt(r['tottime_ms_per_render'])} ms"
                for r in expo["top_self"][:3]))
        if "cpu_ms_per_scrape_from_proc_stat" in ne:
            out.append(f"   node_exporter CPU per scrape (/proc stat, 10 ms ticks): "
                       f"{fmt(ne['cpu_ms_per_scrape_from_proc_stat'])} ms")
    for part, title in (("rss", "3. agent process"),
                        ("rss_attribution", "3b. agent process, attribution on")):
        out.extend(_render_rss(results.get(part), title))
    ratios = results.get("ratios")
    if ratios:
        out.append("")
        out.append("4. side by side with node_exporter (same run, medians)")
        out.append(f"   scrape median ratio, sn-monitor / node_exporter: "
                   f"{fmt(ratios['scrape_ratio'], 3)}     goal <= {GOALS['scrape_ratio']:g}")
        out.append(f"   fair ratio (net+ib collect CPU + our scrape) / node_exporter scrape: "
                   f"{fmt(ratios['fair_ratio'], 3)}")
        out.append("     (each of our scrapes formats a fresh snapshot; node_exporter reads /sys "
                   "on every scrape, so the fair ratio adds our read cost)")
    side = results.get("side_by_side", {})
    if "ratio" in side:
        out.append("")
        out.append(f"5. side by side, both processes on one tree, one scrape a second for "
                   f"{side['seconds']} s (our agent samples net+ib every second: each scrape "
                   f"is fresh)")
        for name in ("sn-monitor", "node_exporter"):
            out.append(f"   {name:14s} CPU per scrape {fmt(side[name]['cpu_ms_per_scrape'])} ms "
                       f"({side[name]['scrapes_ok']} scrapes)")
        out.append(f"   ratio sn-monitor / node_exporter: {fmt(side['ratio'], 3)}     goal <= "
                   f"{GOALS['side_by_side_ratio']:g}")
    elif "skipped" in side:
        out.append(f"5. side by side: skipped ({side['skipped']})")
    return "\n".join(out)


def problems(results: dict[str, Any]) -> list[str]:
    """What could not be measured (see :func:`bench.common.finish`); a missed goal is not."""
    out = [f"{part}: {results[part]['error']}"
           for part in ("sample", "profile", "scrape", "rss", "rss_attribution",
                        "side_by_side")
           if "error" in results.get(part, {})]
    for label, data in results.get("sample", {}).get("sets", {}).items():
        if not data["cpu_ms"]["n"]:
            out.append(f"sample: no sample of the {label!r} collector set")
    scrape = results.get("scrape", {})
    if "sn-monitor" in scrape and not scrape["sn-monitor"]["wall_ms"]["n"]:
        out.append(f"scrape: no /metrics scrape answered 200 "
                   f"({scrape['sn-monitor']['non_200']} were not)")
    if "error" in scrape.get("node_exporter", {}):  # installed, but it did not answer
        out.append(f"scrape: node_exporter: {scrape['node_exporter']['error']}")
    for part in ("rss", "rss_attribution"):
        rss = results.get(part, {})
        if "error" not in rss and "scrapes_ok" in rss and not rss["scrapes_ok"]:
            out.append(f"{part}: no scrape of the agent process answered 200")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_bench", description=__doc__)
    add_output_args(parser, "few iterations (a smoke run of a few seconds)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile pass")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "agent.json")

    warmup, cycles, scrapes, rss_s, prof_n, side_s = (
        (5, 30, 30, 2, 20, 3) if args.quick else (20, 300, 300, 10, 200, 60)
    )
    results: dict[str, Any] = {
        "meta": {
            "version": __version__,
            "mode": "quick" if args.quick else "full",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load1": round(os.getloadavg()[0], 2),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "goals": GOALS,
        }
    }
    with tempfile.TemporaryDirectory(prefix="sn-bench-") as tmpdir, \
            contextlib.ExitStack() as stack:
        tmp = Path(tmpdir)
        node = SimulatedNode(tmp / "node", gpus=8)
        for gpu in node.gpus:  # a Slurm training job: one process per GPU
            pid = 4000 + gpu.index
            node.tree.add_gpu_process(pid, ["/usr/bin/python3", "train.py"],
                                      uid=BENCH_JOB.uid, cgroup=JOB_CGROUP)
            gpu.set_processes([(pid, 60 * 2**30)])
        settings = node.agent_settings(AgentSettings(node="bench"))
        attribution = AttributionPlatforms(tmp, [gpu.uuid for gpu in node.gpus])
        stack.enter_context(attribution.serving())
        attributed = with_attribution(settings, attribution.kubelet_socket)
        node.step(1.0)
        parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("sample", lambda: bench_sample(node, settings, warmup, cycles, attributed)),
            ("scrape", lambda: bench_scrapes(node, settings, min(20, warmup), scrapes, tmp)),
            ("rss", lambda: bench_rss(rss_s, tmp)),
            ("rss_attribution", lambda: bench_rss(rss_s, tmp, attribution.agent_config())),
            ("side_by_side", lambda: bench_side_by_side(node.root, side_s, tmp)),
        ]
        if not args.no_profile:
            parts.insert(1, ("profile", lambda: profile_samples(node, settings, prof_n)))
        for name, run in parts:
            try:
                results[name] = run()
            except Exception as err:  # noqa: BLE001 - one part failing must not hide the rest
                results[name] = {"error": f"{type(err).__name__}: {err}"}
    ours = results["scrape"].get("sn-monitor", {}).get("wall_ms", {}).get("median")
    theirs = results["scrape"].get("node_exporter", {}).get("wall_ms", {}).get("median")
    if ours is not None and theirs and "sets" in results["sample"]:
        net_ib = results["sample"]["sets"]["net+ib"]["cpu_ms"]["median"]
        results["ratios"] = {"scrape_ratio": ours / theirs,
                             "fair_ratio": (net_ib + ours) / theirs}
    results["meta"]["load1_end"] = round(os.getloadavg()[0], 2)
    return finish(results, out_path, problems(results), render)


if __name__ == "__main__":
    sys.exit(main())
