"""Controller cost: ingest throughput and latency, report-to-action latency, RSS per node.

Run with ``python -m bench.controller_bench`` (``make bench``); ``--quick`` for a smoke test.

Everything runs on 127.0.0.1 against a real ``sn-monitor controller`` process (default
rules, no drivers configured, so alerts go to its log), started afresh for each part
with its SQLite store in a temporary directory. The controller is pinned to one core
with ``taskset -c`` and everything else (this process, the load senders) to the other
cores, so "reports/s" means reports/s of one controller core.

The reports are realistic: a simulated 8-GPU H100 node (fake NVML, /sys tree) is
sampled by the agent's own collectors and turned into a wire report by
``build_report``, warmed up until its GPUs run at working temperature. N node names
(``sim-0000``..) share a few such snapshots; per node only the head (node, instance,
sequence), the sample time and the labels differ, and the body is handed to the kernel
as a list of byte slices (``sendmsg``), so a new report costs the sender next to nothing.
Every request carries a new sequence for its node: none is answered as stale.

The load generator is not ``requests`` (~1 ms of Python per request, it would measure
itself): it is 2 forked processes, each with keep-alive sockets driven by ``selectors``,
writing pre-built HTTP/1.1 requests and parsing only the status line and Content-Length.
It costs ~20-40 us of CPU per request, an order of magnitude less than the controller;
its own CPU use is printed next to the controller's, so the headroom can be checked.
``wrk`` with a Lua script would do as well but needs a package and a Lua templating
script; the Python sender keeps the bench dependency-free.

Shared CI machines are noisy, so figures are medians and percentiles of one run, the
load is described next to each figure, and the goals are printed for reference only:
nothing here passes or fails on a number (a rate "NOT HELD" is a result). The exit
status is 1 when something could not be measured: a part raised, the controller never
became healthy, a load sender died, no request was answered, every probe of a kind
failed (listed on stderr at the end, and under "failures" in the results).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import http.client
import json
import math
import multiprocessing
import os
import platform
import pstats
import queue
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

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
from sn_monitor.model import CommandResult, EventRecord, Report, ReportReply
from sn_monitor.rules.spec import load_rules

REPO = Path(__file__).resolve().parent.parent
RULES_DIR = REPO / "sn_monitor" / "rules"
GOALS = {"ingest_per_s": 4000.0, "action_p99_ms": 50.0, "rss_mb_per_1000_nodes": 100.0}
HTTP_TIMEOUT = 5.0
#: How many distinct simulated snapshots the N nodes share (node i uses i % VARIANTS).
VARIANTS = 8
#: The controller config: no drivers (alerts are logged); the cluster-wide rate limit
#: on disruptive actions (10 per 10 min by default) is lifted so that every probe's
#: throttle runs instead of being refused after the tenth.
CONTROLLER_CONFIG = """\
log_level: warning
policy:
  rate_limit:
    actions: 100000
    window: 10m
"""
#: What a probe may run into; it is reported as that probe's error.
PROBE_ERRORS = (OSError, RuntimeError, ValueError, KeyError, http.client.HTTPException,
                msgspec.DecodeError)
_encoder = msgspec.json.Encoder()
_reply_decoder = msgspec.json.Decoder(ReportReply)


# ---------------------------------------------------------------- small helpers


def schedstat_ns(pid: int) -> tuple[int, int] | None:
    """(on-CPU ns, waiting-for-a-CPU ns) of a process's main thread (the event loop)."""
    try:
        on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu), int(waiting)


def steal_ticks(cpu: int | None) -> int | None:
    """Clock ticks the hypervisor gave CPU ``cpu`` (None: all of them) to someone else.

    The ``steal`` column of /proc/stat: time a virtual machine's CPU was ready to run and
    did not, because the host ran another tenant. Over a window, it tells a slow run that
    was the host's doing from one that was ours.
    """
    name = "cpu" if cpu is None else f"cpu{cpu}"
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == name and len(fields) > 8:
                return int(fields[8])
    except (OSError, ValueError):
        return None
    return None


def sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


# ---------------------------------------------------------------- realistic reports


@dataclass
class Templates:
    """Report bodies for N nodes as byte slices; see :meth:`parts`."""

    reports: list[Report]          # the VARIANTS full reports the tails come from
    heads: list[bytes]             # per node: '{"node":..,"instance":..,"sequence":'
    labels: list[bytes]            # per node: the encoded labels object
    mid: bytes                     # ',"agent_version":..,"labels":'
    tails: list[bytes]             # per variant: ',"gpus":[..],...}'
    names: list[str] = field(default_factory=list)

    def parts(self, i: int, sequence: int, sample_time: float) -> list[bytes]:
        return [self.heads[i], str(sequence).encode(), b',"sample_time_seconds":',
                repr(sample_time).encode(), self.mid, self.labels[i],
                self.tails[i % len(self.tails)]]

    def body(self, i: int, sequence: int, sample_time: float) -> bytes:
        return b"".join(self.parts(i, sequence, sample_time))

    def report(self, i: int, sequence: int, sample_time: float) -> Report:
        """The struct that :meth:`body` encodes (for the probes and the checks)."""
        return msgspec.structs.replace(
            self.reports[i % len(self.reports)], node=self.names[i],
            instance=self.instance, sequence=sequence, sample_time_seconds=sample_time,
            labels=node_labels(i))

    instance: str = "bench"


def node_labels(i: int) -> dict[str, str]:
    return {"job": f"job-{i // 32:03d}", "rack": f"rack-{i // 16:04d}",
            "supernode": f"sn-{i // 256:02d}"}


def snapshot_reports(variants: int) -> list[Report]:
    """``variants`` reports of one simulated 8-GPU node at working temperature."""
    from sn_monitor.agent.registry import build_collectors
    from sn_monitor.agent.report import build_report
    from sn_monitor.agent.sampler import Sampler
    from sn_monitor.agent.settings import AgentSettings
    from sn_monitor.clock import SystemClock
    from sn_monitor.sim.node import SimulatedNode

    out: list[Report] = []
    with tempfile.TemporaryDirectory(prefix="sn-cbench-node-") as tmpdir:
        node = SimulatedNode(Path(tmpdir) / "node", gpus=8)
        settings = node.agent_settings(AgentSettings(node="sim"))
        clock = SystemClock()
        sampler = Sampler("sim", build_collectors(settings, node.nvml, clock), clock)
        try:
            for _ in range(150):  # ~5 thermal time constants: GPUs at working temperature
                node.step(1.0)
            sampler.sample()
            for k in range(variants):
                node.step(1.0)
                snap = sampler.sample()
                out.append(build_report(
                    snap, instance="x", sequence=k, labels={}, interval=1.0, events=[],
                    command_results=[], guard_throttled=set(), metrics_port=9847))
        finally:
            sampler.close()
    return out


def build_templates(nodes: int, instance: str, reports: list[Report]) -> Templates:
    tails: list[bytes] = []
    mid = b""
    for report in reports:
        full = _encoder.encode(msgspec.structs.replace(report, labels={"x": "y"}))
        tails.append(full[full.index(b',"gpus":'):])
        mid = full[full.index(b',"agent_version":'):full.index(b',"labels":')] + b',"labels":'
    names = [f"sim-{i:04d}" for i in range(nodes)]
    heads = [b'{"node":' + _encoder.encode(n) + b',"instance":' + _encoder.encode(instance)
             + b',"sequence":' for n in names]
    labels = [_encoder.encode(node_labels(i)) for i in range(nodes)]
    t = Templates(reports=reports, heads=heads, labels=labels, mid=mid, tails=tails,
                  names=names, instance=instance)
    # The slices must make exactly the report they stand for.
    for i in (0, nodes - 1):
        now = time.time()
        decoded = msgspec.json.decode(t.body(i, 7, now), type=Report)
        if decoded != t.report(i, 7, now):
            raise RuntimeError("report template does not round-trip")
    return t


# ---------------------------------------------------------------- the controller


class ControllerProcess:
    """One ``sn-monitor controller`` on 127.0.0.1, pinned to ``core`` when given;
    ``program`` is the ``sn-monitor`` command (:func:`sn_monitor_command`)."""

    def __init__(self, tmp: Path, name: str, core: int | None,
                 program: Sequence[str] | None = None) -> None:
        self.port = free_port()
        self.dir = tmp / name
        self.dir.mkdir(parents=True)
        config = self.dir / "controller.yaml"
        config.write_text(CONTROLLER_CONFIG)
        base = list(program) if program else sn_monitor_command()
        pin = ["taskset", "-c", str(core)] if core is not None else []
        self.command = [*pin, *base, "controller", "--config", str(config),
                        "--listen", f"127.0.0.1:{self.port}",
                        "--state-dir", str(self.dir / "state"), "--rules", str(RULES_DIR),
                        "--log-level", "warning"]
        self.log_path = self.dir / "controller.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, deadline_s: float = 30.0) -> float:
        """Start it and wait for /healthz; seconds it took. RuntimeError if it never did."""
        with self.log_path.open("wb") as log:
            try:
                self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
            except OSError as err:
                raise RuntimeError(f"controller not started: {' '.join(self.command)}: "
                                   f"{err}") from err
        start = time.monotonic()
        while time.monotonic() - start < deadline_s:
            if self.proc.poll() is not None:
                break
            try:
                status, _ = self.get("/healthz")
                if status == 200:
                    return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.1)
        code = self.proc.poll()
        state = (f"exited {code}" if code is not None
                 else f"not healthy within {deadline_s:g} s")
        raise RuntimeError(f"controller {state} ({' '.join(self.command)}): "
                           + self.log_path.read_text(errors="replace")[-2000:])

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HTTP_TIMEOUT)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def get_json(self, path: str) -> Any:
        status, body = self.get(path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {body[:200]!r}")
        return json.loads(body)

    def metrics(self) -> dict[str, float]:
        """The controller's /metrics samples (name{labels} -> value) plus a read time."""
        t = time.monotonic()
        _, body = self.get("/metrics")
        out: dict[str, float] = {"_read_at": (t + time.monotonic()) / 2}
        for line in body.decode(errors="replace").splitlines():
            if not line or line.startswith("#"):
                continue
            if line.startswith(("sn_controller_", "sn_incidents", "sn_actions",
                                "sn_detection", "sn_breaker")):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    continue
        return out

    def rss_kb(self) -> int | None:
        return proc_status_kb(self.pid, "VmRSS")

    def cpu_seconds(self) -> float | None:
        return proc_cpu_seconds(self.pid)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=25)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return None

    def log_tail(self, lines: int = 5) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]


ACCEPTED = 'sn_controller_reports_total{outcome="accepted"}'
STALE = 'sn_controller_reports_total{outcome="stale"}'
INVALID = 'sn_controller_reports_total{outcome="invalid"}'
INGEST = "sn_controller_ingest_seconds"


def histogram_delta(before: dict[str, float], after: dict[str, float],
                    name: str) -> dict[str, float]:
    """p50/p99 (interpolated within buckets: bucket resolution!) and the exact mean."""
    buckets: list[tuple[float, float]] = []
    for key, value in after.items():
        prefix = f'{name}_bucket{{le="'
        if key.startswith(prefix):
            le = key[len(prefix):-2]
            bound = math.inf if le == "+Inf" else float(le)
            buckets.append((bound, value - before.get(key, 0.0)))
    buckets.sort()
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    out = {"count": count, "mean_ms": total / count * 1e3 if count else math.nan}

    def quantile(q: float) -> float:
        rank = q * count
        lower, below = 0.0, 0.0
        for bound, cumulative in buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return math.inf
                share = (rank - below) / (cumulative - below) if cumulative > below else 1.0
                return (lower + (bound - lower) * share) * 1e3
            lower, below = bound, cumulative
        return math.nan

    if count:
        out["p50_ms"] = quantile(0.5)
        out["p99_ms"] = quantile(0.99)
        out["under_1ms_share"] = next((c for b, c in buckets if b == 0.001), math.nan) / count
    return out


# ---------------------------------------------------------------- the load generator


@dataclass
class LoadSpec:
    """What one sender process does.

    ``rate`` None: closed loop (every connection always has a request in flight), for
    ``duration`` seconds or ``rounds`` passes over its nodes. Otherwise an open loop at
    ``rate`` requests/s: request k is due at start + k / rate, and its latency counts
    from that due time (queueing in the sender included, as wrk2 does), so a controller
    that falls behind shows it in the latency instead of slowing the load down.
    """

    port: int
    nodes: list[int]
    connections: int
    start_at: float                # time.monotonic() (system-wide on Linux)
    duration: float
    warmup: float = 0.0            # latencies of requests due before start+warmup are dropped
    rate: float | None = None
    rounds: int | None = None


class _Conn:
    """One keep-alive connection of a sender and the request on it, if any."""

    __slots__ = ("buf", "busy", "due", "request", "retried", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.busy = False       # a request is in flight
        self.due = 0.0          # what its latency counts from
        self.request = b""      # kept until answered: sent again once if the server
        self.retried = False    # closed the connection without answering a byte


def _sender(spec: LoadSpec, templates: Templates, out: Any) -> None:
    """One load process (forked): see :class:`LoadSpec`. Puts a result dict on ``out``.

    The server may close a keep-alive connection at any time: uvicorn closes one idle for
    5 s, and any server may answer ``connection: close``. Such a connection is taken off
    the idle list and the selector at once and replaced by a new one; a request that was
    on it and got no byte of answer (the server closed before reading it) is sent again,
    once, on the replacement. Those are counted (``reconnects``, ``retries``); a request
    that fails anyway counts in ``errors``.
    """
    host = f"127.0.0.1:{spec.port}".encode()
    header = (b"POST /api/v1/reports HTTP/1.1\r\nHost: " + host
              + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n")
    sequences = [0] * len(spec.nodes)
    sel = selectors.DefaultSelector()
    conns: dict[socket.socket, _Conn] = {}
    idle: collections.deque[_Conn] = collections.deque()  # FIFO: every connection in turn
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    reconnects = 0
    retries = 0
    sent = 0
    cursor = 0
    lost: str | None = None  # why the sender could not go on
    cpu0 = time.process_time()

    def connect() -> _Conn:
        sock = socket.create_connection(("127.0.0.1", spec.port), timeout=HTTP_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock)
        conns[sock] = conn
        sel.register(sock, selectors.EVENT_READ)
        return conn

    def drop(conn: _Conn) -> None:
        """Forget a connection the server closed (or that failed): selector, lists, fd."""
        sel.unregister(conn.sock)
        del conns[conn.sock]
        if conn in idle:
            idle.remove(conn)
        conn.sock.close()

    def replace(conn: _Conn) -> _Conn | None:
        """Drop ``conn`` and open another in its place (None: the server refuses)."""
        nonlocal reconnects, lost
        drop(conn)
        try:
            fresh = connect()
        except OSError as err:
            lost = f"reconnecting: {type(err).__name__}: {err}"
            return None
        reconnects += 1
        return fresh

    def transmit(conn: _Conn, request: bytes, due: float) -> bool:
        try:
            conn.sock.sendall(request)
        except OSError:
            return False
        conn.buf, conn.busy, conn.due, conn.request = b"", True, due, request
        return True

    def send(due: float) -> None:
        """The next node's report on the first idle connection (a new one if it was closed)."""
        nonlocal cursor, sent, errors
        k = cursor % len(spec.nodes)
        cursor += 1
        sequences[k] += 1
        parts = templates.parts(spec.nodes[k], 0, 0.0)
        parts[1] = str(sequences[k]).encode()
        parts[3] = repr(time.time()).encode()
        request = b"".join([header % sum(map(len, parts)), *parts])
        if not spec.rate:
            due = time.monotonic()
        sent += 1
        conn = idle.popleft()
        conn.retried = False
        if transmit(conn, request, due):
            return
        fresh = replace(conn)  # closed by the server before we saw it
        if fresh is None or not transmit(fresh, request, due):
            errors += 1
            if fresh is not None:
                idle.append(fresh)

    def closed(conn: _Conn, finished: bool) -> None:
        """The server closed ``conn`` (end of file, or a reset)."""
        nonlocal errors, retries
        if not conn.busy:  # an idle keep-alive connection: not an error
            if finished:
                drop(conn)
            elif (fresh := replace(conn)) is not None:
                idle.append(fresh)
            return
        request, due, retried, answered = conn.request, conn.due, conn.retried, bool(conn.buf)
        fresh = replace(conn)
        if fresh is None:
            errors += 1
            return
        if not answered and not retried and transmit(fresh, request, due):
            fresh.retried = True
            retries += 1
            return
        errors += 1
        idle.append(fresh)

    try:
        for _ in range(spec.connections):
            idle.append(connect())
        sleep_until(spec.start_at)
        start = time.monotonic()
        end = start + spec.duration
        measure_from = start + spec.warmup
        total = None if spec.rounds is None else spec.rounds * len(spec.nodes)
        interval = 1.0 / spec.rate if spec.rate else 0.0
        next_due = start

        while True:
            now = time.monotonic()
            finished = now >= end or (total is not None and sent >= total)
            busy = len(conns) - len(idle)
            if finished and not busy:
                break
            if finished and now >= end + 10.0:  # bounded drain
                errors += busy
                break
            if not finished:
                if spec.rate:
                    while idle and next_due <= now and now < end:
                        send(next_due)
                        next_due += interval
                else:
                    while idle and (total is None or sent < total):
                        send(0.0)
            if not conns:
                lost = lost or "every connection was closed"
                break
            timeout = 0.05
            if spec.rate and not finished:
                timeout = max(0.0, min(timeout, next_due - time.monotonic()))
            for key, _ in sel.select(timeout):
                conn = conns.get(key.fileobj)  # type: ignore[call-overload]
                if conn is None:
                    continue
                try:
                    data = conn.sock.recv(65536)
                except OSError:
                    data = b""
                if not data or not conn.busy:  # closed (or bytes nobody asked for)
                    closed(conn, finished)
                    continue
                buf = conn.buf + data
                conn.buf = buf
                head_end = buf.find(b"\r\n\r\n")
                if head_end < 0:
                    continue
                head = buf[:head_end].lower()
                at = head.find(b"content-length:")
                stop = head.find(b"\r\n", at)
                length = int(head[at + 15:stop if stop >= 0 else None]) if at >= 0 else 0
                if len(buf) < head_end + 4 + length:
                    continue
                done = time.monotonic()
                status = int(buf[9:12])
                statuses[status] = statuses.get(status, 0) + 1
                if conn.due >= measure_from:
                    latencies.append((done - conn.due) * 1e3)
                conn.buf, conn.busy, conn.request = b"", False, b""
                idle.append(conn)
                if b"\r\nconnection: close" in head:  # the server closes it after this
                    closed(conn, finished)
        elapsed = time.monotonic() - start
    except Exception as err:  # noqa: BLE001 - reported, never raised past the process
        out.put({"error": f"{type(err).__name__}: {err}", "sent": sent})
        return
    finally:
        for sock in conns:
            sock.close()
        sel.close()
    result: dict[str, Any] = {
        "sent": sent, "statuses": statuses, "errors": errors, "elapsed": elapsed,
        "reconnects": reconnects, "retries": retries, "latencies_ms": latencies,
        "cpu_s": time.process_time() - cpu0}
    if lost is not None:
        result["error"] = f"the load stopped early: {lost}"
    out.put(result)


class Load:
    """``senders`` forked sender processes over a node range; see :class:`LoadSpec`."""

    def __init__(self, templates: Templates, port: int, nodes: int, senders: int,
                 connections: int, duration: float, warmup: float = 0.0,
                 rate: float | None = None, rounds: int | None = None,
                 node_offset: int = 0) -> None:
        ctx = multiprocessing.get_context("fork")
        self.queue = ctx.Queue()
        self.start_at = time.monotonic() + 0.3
        self.procs = []
        senders = max(1, min(senders, nodes))
        for p in range(senders):
            spec = LoadSpec(port=port, nodes=list(range(node_offset + p, node_offset + nodes,
                                                        senders)),
                            connections=connections, start_at=self.start_at,
                            duration=duration, warmup=warmup,
                            rate=None if rate is None else rate / senders, rounds=rounds)
            self.procs.append(ctx.Process(target=_sender, args=(spec, templates, self.queue),
                                          daemon=True))
        self.deadline = self.start_at + duration + 30.0
        for proc in self.procs:
            proc.start()

    def join(self) -> dict[str, Any]:
        """Wait for every sender (bounded), merge their results, and reap them."""
        results: list[dict[str, Any]] = []
        try:
            for _ in self.procs:
                remaining = max(1.0, self.deadline - time.monotonic())
                results.append(self.queue.get(timeout=remaining))
        except queue.Empty as err:  # a sender hung or died
            results.append({"error": f"sender gave no result: {type(err).__name__}"})
        finally:
            self.kill()
        merged: dict[str, Any] = {"senders": len(self.procs), "sent": 0, "errors": 0,
                                  "reconnects": 0, "retries": 0, "statuses": {},
                                  "cpu_s": 0.0, "latencies_ms": []}
        for r in results:
            if "error" in r:
                merged.setdefault("sender_errors", []).append(r["error"])
            merged["sent"] += r.get("sent", 0)
            merged["errors"] += r.get("errors", 0)
            merged["reconnects"] += r.get("reconnects", 0)
            merged["retries"] += r.get("retries", 0)
            merged["cpu_s"] += r.get("cpu_s", 0.0)
            merged["latencies_ms"].extend(r.get("latencies_ms", []))
            for status, n in r.get("statuses", {}).items():
                merged["statuses"][status] = merged["statuses"].get(status, 0) + n
            merged["elapsed"] = max(merged.get("elapsed", 0.0), r.get("elapsed", 0.0))
        return merged

    def kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)


# ---------------------------------------------------------------- probes (part 3)


class ProbeNode:
    """One node that reports over its own keep-alive connection, acknowledging commands."""

    def __init__(self, port: int, name: str, template: Report, instance: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
        self.conn.connect()
        # http.client writes the headers and the body in two send()s: without NODELAY,
        # Nagle + delayed ACK add up to 40 ms to a round trip.
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.name = name
        self.template = msgspec.structs.replace(template, node=name, instance=instance,
                                                labels={"job": "probe", "rack": "probe"})
        self.sequence = 0
        self.pending_results: list[CommandResult] = []
        self.event_id = 0

    def send(self, hot_gpu: int | None = None, events: Sequence[EventRecord] = ()
             ) -> tuple[float, float, float, ReportReply]:
        """One report; (send wall, send monotonic, reply monotonic, reply)."""
        self.sequence += 1
        gpus = self.template.gpus
        if hot_gpu is not None:
            gpus = [msgspec.structs.replace(g, temperature_celsius=95.0)
                    if g.index == hot_gpu else g for g in gpus]
        report = msgspec.structs.replace(
            self.template, sequence=self.sequence, sample_time_seconds=time.time(),
            gpus=gpus, events=list(events), command_results=self.pending_results)
        body = _encoder.encode(report)
        wall, t0 = time.time(), time.monotonic()
        self.conn.request("POST", "/api/v1/reports", body=body,
                          headers={"Content-Type": "application/json"})
        response = self.conn.getresponse()
        data = response.read()
        t1 = time.monotonic()
        if response.status != 200:
            raise RuntimeError(f"{self.name}: report answered {response.status}: {data[:200]!r}")
        reply = _reply_decoder.decode(data)
        self.pending_results = [CommandResult(id=c.id, ok=True, time_seconds=time.time(),
                                              message="bench ack") for c in reply.commands]
        return wall, t0, t1, reply

    def keep_alive(self, stop: threading.Event, every: float = 1.0) -> None:
        """Cool reports every ``every`` s until ``stop``: no node-lost alert mid-run."""
        while not stop.wait(every):
            self.send()

    def close(self) -> None:
        self.conn.close()


def throttle_probe(ctl: ControllerProcess, node: ProbeNode, stop: threading.Event,
                   out: list[dict[str, Any]]) -> None:
    """gpu-overheat (95 C for 5 s) -> the throttle command in a reply to this node."""
    try:
        node.send()
        time.sleep(0.2)
        node.send()
        wall0, t0, t0_reply, _ = node.send(hot_gpu=3)     # the hold starts here
        due_hi = t0_reply + 5.0                            # server's hold completes in
        due_lo = t0 + 5.0                                  # [due_lo, due_hi]
        early: list[str] = []
        for j in range(1, 5):                              # an agent's 1 s cadence
            sleep_until(t0 + j)
            _, _, _, reply = node.send(hot_gpu=3)
            early += [c.kind for c in reply.commands]
        sleep_until(due_lo - 0.02)
        crossing: float | None = None                      # first report sent after due_hi
        sends = 0
        got: tuple[float, float, float] | None = None
        while time.monotonic() < t0 + 8.0:                 # back to back until it comes
            _, ts, tr, reply = node.send(hot_gpu=3)
            sends += 1
            if crossing is None and ts >= due_hi:
                crossing = ts
            if any(c.kind == "throttle" for c in reply.commands):
                got = (ts, tr, time.time())
                break
        sample: dict[str, Any] = {"node": node.name, "first_rtt_ms": (t0_reply - t0) * 1e3,
                                  "early_commands": early, "polls": sends}
        if got is None:
            sample["error"] = "no throttle command within 3 s of the hold completing"
        else:
            ts, tr, wall_cmd = got
            sample["hold_to_command_ms"] = (tr - due_lo) * 1e3
            sample["hold_to_command_ms_low"] = (tr - due_hi) * 1e3
            sample["crossing_to_command_ms"] = (tr - crossing) * 1e3 if crossing else None
            sample["command_report_rtt_ms"] = (tr - ts) * 1e3
            node.send()  # acknowledge the command (the agent would)
            incidents = ctl.get_json(f"/api/v1/incidents?node={node.name}&limit=20")
            actions = ctl.get_json(f"/api/v1/actions?node={node.name}&limit=50")
            due_wall = wall0 + 5.0
            inc = [i for i in incidents["incidents"] if i["rule"] == "gpu-overheat"]
            act = [a for a in actions["actions"]
                   if a["action"] == "throttle" and a["rule"] == "gpu-overheat"]
            if inc:
                sample["detected_after_due_ms"] = (inc[0]["detected_at"] - due_wall) * 1e3
            if act:
                sample["action_recorded_after_due_ms"] = (act[0]["created_at"] - due_wall) * 1e3
                sample["action_state"] = act[0]["state"]
            sample["command_seen_after_due_ms_wall"] = (wall_cmd - due_wall) * 1e3
        out.append(sample)
        node.keep_alive(stop)
    except PROBE_ERRORS as err:  # a probe failing is reported, the bench goes on
        out.append({"node": node.name, "error": f"{type(err).__name__}: {err}"})


def xid_probe(ctl: ControllerProcess, node: ProbeNode, stop: threading.Event,
              out: list[dict[str, Any]]) -> None:
    """An XID 79 event in a report -> the fatal-xid alert action recorded and done."""
    try:
        node.send()
        time.sleep(0.2)
        node.event_id += 1
        event = EventRecord(id=node.event_id, kind="xid", source="kmsg", time_seconds=time.time(),
                            message="NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', "
                                    "name=<unknown>, GPU has fallen off the bus.",
                            gpu=2, pci_bus_id="00000000:3A:00.0", code=79)
        wall, t0, t1, reply = node.send(events=[event])
        seen: float | None = None
        record: dict[str, Any] | None = None
        polls = 0
        while time.monotonic() < t0 + 3.0:
            polls += 1
            actions = ctl.get_json(f"/api/v1/actions?node={node.name}&limit=20")["actions"]
            alerts = [a for a in actions if a["action"] == "alert" and a["rule"] == "fatal-xid"]
            if alerts and alerts[0]["state"] in ("succeeded", "failed"):
                seen, record = time.monotonic(), alerts[0]
                break
            time.sleep(0.002)
        sample: dict[str, Any] = {"node": node.name, "report_rtt_ms": (t1 - t0) * 1e3,
                                  "events_acknowledged": reply.events_stored_through == event.id,
                                  "polls": polls}
        if record is None or seen is None:
            sample["error"] = "no finished fatal-xid alert within 3 s"
        else:
            sample["alert_recorded_ms"] = (record["created_at"] - wall) * 1e3
            sample["alert_done_ms"] = (record["updated_at"] - wall) * 1e3
            sample["alert_state"] = record["state"]
            sample["alert_seen_by_polling_ms"] = (seen - t0) * 1e3
        out.append(sample)
        node.keep_alive(stop)
    except PROBE_ERRORS as err:
        out.append({"node": node.name, "error": f"{type(err).__name__}: {err}"})


def run_probes(ctl: ControllerProcess, templates: Templates, count: int, start_at: float,
               stop: threading.Event) -> tuple[list[threading.Thread], dict[str, list[Any]]]:
    """``count`` throttle and ``count`` XID probes, 1.2 s apart, on their own nodes."""
    results: dict[str, list[Any]] = {"throttle": [], "xid": []}
    threads: list[threading.Thread] = []
    instance = f"probe-{os.getpid()}-{ctl.port}"
    for k in range(count):
        for kind, offset, fn in (("throttle", 0.0, throttle_probe), ("xid", 0.6, xid_probe)):
            node = ProbeNode(ctl.port, f"probe-{kind}-{k:02d}", templates.reports[0], instance)
            at = start_at + offset + 1.2 * k

            def run(fn: Callable[..., None] = fn, node: ProbeNode = node, at: float = at,
                    sink: list[Any] = results[kind]) -> None:
                sleep_until(at)
                try:
                    if not stop.is_set():
                        fn(ctl, node, stop, sink)
                finally:
                    node.close()

            thread = threading.Thread(target=run, name=f"probe-{kind}-{k}", daemon=True)
            thread.start()
            threads.append(thread)
    return threads, results


# ---------------------------------------------------------------- parts 1, 2, 4


def measure_window(ctl: ControllerProcess, t_from: float, t_to: float) -> dict[str, Any]:
    """Controller counters and CPU between two moments of a running load."""
    sleep_until(t_from)
    m0, cpu0, w0 = ctl.metrics(), ctl.cpu_seconds(), time.monotonic()
    sched0 = schedstat_ns(ctl.pid)
    rss0 = ctl.rss_kb()
    sleep_until(t_to)
    m1, cpu1, w1 = ctl.metrics(), ctl.cpu_seconds(), time.monotonic()
    sched1 = schedstat_ns(ctl.pid)
    loop: dict[str, float] = {}
    if sched0 is not None and sched1 is not None:
        loop = {"on_cpu_percent": (sched1[0] - sched0[0]) / 1e9 / (w1 - w0) * 100,
                "runnable_waiting_percent": (sched1[1] - sched0[1]) / 1e9 / (w1 - w0) * 100}
    span = m1["_read_at"] - m0["_read_at"]
    accepted = m1.get(ACCEPTED, 0.0) - m0.get(ACCEPTED, 0.0)
    return {
        "seconds": span,
        "accepted": accepted,
        "stale": m1.get(STALE, 0.0) - m0.get(STALE, 0.0),
        "invalid": m1.get(INVALID, 0.0) - m0.get(INVALID, 0.0),
        "accepted_per_s": accepted / span if span > 0 else math.nan,
        "controller_cpu_percent": ((cpu1 - cpu0) / (w1 - w0) * 100
                                   if cpu0 is not None and cpu1 is not None else math.nan),
        "ingest_histogram": histogram_delta(m0, m1, INGEST),
        "rss_mb_start": (rss0 or 0) / 1024, "rss_mb_end": (ctl.rss_kb() or 0) / 1024,
        "incidents_open": m1.get("sn_incidents_open"),
        "event_loop_thread": loop,
    }


def part_throughput(tmp: Path, templates: Templates, core: int | None, nodes: int,
                    senders: int, connections: int, warmup: float, window: float,
                    program: Sequence[str] | None = None) -> dict[str, Any]:
    ctl = ControllerProcess(tmp, "throughput", core, program)
    result: dict[str, Any] = {"nodes": nodes, "senders": senders,
                              "connections": senders * connections, "command": ctl.command}
    load: Load | None = None
    try:
        result["healthy_after_s"] = ctl.start()
        load = Load(templates, ctl.port, nodes, senders, connections,
                    duration=warmup + window + 0.5, warmup=warmup)
        result["window"] = measure_window(ctl, load.start_at + warmup,
                                          load.start_at + warmup + window)
        sent = load.join()
        load = None
        result["sender"] = _sender_summary(sent, warmup + window + 0.5)
    except Exception as err:  # noqa: BLE001 - kept with what was measured before it
        result["error"] = f"{type(err).__name__}: {err}"
    finally:
        if load is not None:
            load.kill()
        result["exit_code"] = ctl.stop()
        result["log_tail"] = ctl.log_tail()
    return result


def _sender_summary(sent: dict[str, Any], seconds: float) -> dict[str, Any]:
    lat = sent.pop("latencies_ms")
    sent["latency_ms"] = summary(lat)
    sent["cpu_percent"] = sent["cpu_s"] / seconds * 100 if seconds else math.nan
    sent["per_s"] = sent["sent"] / sent["elapsed"] if sent.get("elapsed") else math.nan
    return sent


def part_rate(tmp: Path, templates: Templates, core: int | None, nodes: int, interval: float,
              senders: int, warmup: float, duration: float, probes: int,
              program: Sequence[str] | None = None) -> dict[str, Any]:
    """Fixed-rate load (each node every ``interval`` s) and, meanwhile, the probes."""
    rate = nodes / interval
    ctl = ControllerProcess(tmp, f"rate-{nodes}", core, program)
    result: dict[str, Any] = {"nodes": nodes, "interval_s": interval, "rate_per_s": rate,
                              "senders": senders}
    load: Load | None = None
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        result["healthy_after_s"] = ctl.start()
        load = Load(templates, ctl.port, nodes, senders, connections=16,
                    duration=warmup + duration, warmup=warmup, rate=rate)
        if probes:
            threads, probe_results = run_probes(ctl, templates, probes,
                                                load.start_at + warmup, stop)
            result["probes"] = probe_results
        result["window"] = measure_window(ctl, load.start_at + warmup,
                                          load.start_at + warmup + duration - 0.2)
        sent = load.join()
        load = None
        result["sender"] = _sender_summary(sent, warmup + duration)
    except Exception as err:  # noqa: BLE001 - kept with what was measured before it
        result["error"] = f"{type(err).__name__}: {err}"
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10.0)
        if load is not None:
            load.kill()
        result["exit_code"] = ctl.stop()
        result["log_tail"] = ctl.log_tail()
    return result


def part_rss(tmp: Path, templates: Templates, core: int | None, levels: Sequence[int],
             senders: int, rounds: int, program: Sequence[str] | None = None
             ) -> dict[str, Any]:
    """VmRSS after ``rounds`` reports from each of 1000, 4096, ... nodes."""
    ctl = ControllerProcess(tmp, "rss", core, program)
    result: dict[str, Any] = {"rounds": rounds, "points": []}
    try:
        result["healthy_after_s"] = ctl.start()
        time.sleep(1.0)
        result["points"].append({"nodes": 0, "rss_mb": (ctl.rss_kb() or 0) / 1024})
        for level in levels:
            load = Load(templates, ctl.port, level, senders, connections=8,
                        duration=120.0, rounds=rounds)
            try:
                sent = load.join()
            finally:
                load.kill()
            time.sleep(1.0)  # a sweep or two; then read
            metrics = ctl.metrics()
            result["points"].append({
                "nodes": level, "rss_mb": (ctl.rss_kb() or 0) / 1024,
                "hwm_mb": (proc_status_kb(ctl.pid, "VmHWM") or 0) / 1024,
                "reports": sent["sent"], "seconds": sent.get("elapsed"),
                "known_nodes": metrics.get("sn_controller_nodes"),
                "incidents_open": metrics.get("sn_incidents_open"),
                "accepted": sent["statuses"].get(200, 0), "errors": sent["errors"],
                **({"sender_errors": sent["sender_errors"]} if "sender_errors" in sent
                   else {}),
            })
        xs = [p["nodes"] for p in result["points"] if p["nodes"] > 0]
        ys = [p["rss_mb"] for p in result["points"] if p["nodes"] > 0]
        if len(xs) >= 2:
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
                     / sum((x - mx) ** 2 for x in xs))
            result["mb_per_1000_nodes_slope"] = slope * 1000
        base = result["points"][0]["rss_mb"]
        for p in result["points"][1:]:
            p["mb_per_1000_over_empty"] = (p["rss_mb"] - base) / p["nodes"] * 1000
    except Exception as err:  # noqa: BLE001 - kept with what was measured before it
        result["error"] = f"{type(err).__name__}: {err}"
    finally:
        result["exit_code"] = ctl.stop()
        result["log_tail"] = ctl.log_tail()
    return result


# ---------------------------------------------------------------- in-process profile


def profile_ingest(tmp: Path, templates: Templates, nodes: int, rounds: int,
                   top: int = 12) -> dict[str, Any]:
    """Per-report CPU of Controller.ingest in-process (no HTTP), split into its steps,
    plus a cProfile of the same loop and the cost of one sweep and one /metrics."""
    from sn_monitor.clock import SystemClock
    from sn_monitor.controller.actions.policy import PolicySettings, RateLimitSettings
    from sn_monitor.controller.actions.routing import build_drivers
    from sn_monitor.controller.api.app import build_app
    from sn_monitor.controller.ingest.decode import decode_report
    from sn_monitor.controller.security.auth import OPEN_ACCESS
    from sn_monitor.controller.service import Controller
    from sn_monitor.controller.settings import ControllerSettings
    from sn_monitor.controller.storage.store import Store

    clock = SystemClock()
    settings = ControllerSettings(policy=PolicySettings(
        rate_limit=RateLimitSettings(actions=100000)))
    store = Store(tmp / "profile.db")
    drivers = build_drivers(settings.drivers, settings.routes, clock)
    controller = Controller(settings, load_rules([RULES_DIR]), clock, store, drivers)
    build_app(controller, None)  # what the process does at start; not timed
    seq = [0] * nodes
    result: dict[str, Any] = {"nodes": nodes, "rounds": rounds}

    def body(i: int) -> bytes:
        seq[i] += 1
        return templates.body(i, seq[i], time.time())

    try:
        for i in range(nodes):  # register (one store write each): not timed
            controller.ingest(body(i), OPEN_ACCESS, "127.0.0.1")
        # 1. the real ingest, timed per call
        total: list[float] = []
        for _ in range(rounds):
            for i in range(nodes):
                b = body(i)
                t0 = time.perf_counter_ns()
                controller.ingest(b, OPEN_ACCESS, "127.0.0.1")
                total.append((time.perf_counter_ns() - t0) / 1e3)
        result["ingest_us"] = summary(total)
        # 2. the same steps one by one (mirrors ReportIntake.ingest, through its parts)
        steps: dict[str, list[float]] = {k: [] for k in (
            "decode", "accept", "rules", "commands", "metrics", "reply_encode")}
        try:
            telemetry = controller.telemetry
            for _ in range(rounds):
                for i in range(nodes):
                    b = body(i)
                    c0 = time.perf_counter_ns()
                    report = decode_report(b)
                    c1 = time.perf_counter_ns()
                    accepted = controller.registry.accept(report)
                    c2 = time.perf_counter_ns()
                    controller.pipeline.handle(controller.engine.observe(accepted.view))
                    c3 = time.perf_counter_ns()
                    commands = controller.drivers.queue.take(report.node)
                    c4 = time.perf_counter_ns()
                    telemetry.ingest.report("accepted")
                    telemetry.ingest.observe((c4 - c0) / 1e9)
                    c5 = time.perf_counter_ns()
                    _encoder.encode(ReportReply(sequence=report.sequence, commands=commands))
                    c6 = time.perf_counter_ns()
                    for name, a, z in (("decode", c0, c1), ("accept", c1, c2),
                                       ("rules", c2, c3), ("commands", c3, c4),
                                       ("metrics", c4, c5), ("reply_encode", c5, c6)):
                        steps[name].append((z - a) / 1e3)
            result["steps_us_median"] = {k: statistics.median(v) for k, v in steps.items()}
            result["steps_us_mean"] = {k: statistics.fmean(v) for k, v in steps.items()}
        except AttributeError as err:
            result["steps_error"] = f"Controller internals changed: {err}"
        # 3. cProfile of the real ingest
        profiler = cProfile.Profile()
        bodies = [body(i) for i in range(nodes)]
        profiler.enable()
        for b in bodies:
            controller.ingest(b, OPEN_ACCESS, "127.0.0.1")
        profiler.disable()
        raw: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        rows = []
        for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
            norm = filename.replace(os.sep, "/")
            short = (norm.split("/sn_monitor/", 1)[1] if "/sn_monitor/" in norm
                     else "/".join(norm.split("/")[-2:]))
            rows.append({"function": f"{short}:{line}({func})", "ncalls": ncalls,
                         "tottime_us_per_report": tottime / nodes * 1e6,
                         "cumtime_us_per_report": cumtime / nodes * 1e6})
        result["profile_top_self"] = sorted(rows, key=lambda r: -r["tottime_us_per_report"])[:top]
        # 4. the periodic work that shares the core with ingest
        sweeps = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            controller.sweep()
            sweeps.append((time.perf_counter_ns() - t0) / 1e6)
        result["sweep_ms"] = summary(sweeps)
        renders = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            controller.metrics()
            renders.append((time.perf_counter_ns() - t0) / 1e6)
        result["metrics_render_ms"] = summary(renders)
    finally:
        controller.close()
        store.close()
    return result


def memory_steady(tmp: Path, templates: Templates, nodes: int, seconds: int,
                  top: int = 6) -> dict[str, Any]:
    """Python heap per node as reports accumulate (in-process, tracemalloc).

    Part 4 measures RSS after a few reports; what a node costs once it has reported for
    longer than the rules' windows (5 min) is what a fleet pays. A ManualClock makes
    ``seconds`` of 1 Hz reports take a few seconds of CPU.
    """
    import gc
    import tracemalloc

    from sn_monitor.clock import ManualClock
    from sn_monitor.controller.actions.routing import build_drivers
    from sn_monitor.controller.security.auth import OPEN_ACCESS
    from sn_monitor.controller.service import Controller
    from sn_monitor.controller.settings import ControllerSettings
    from sn_monitor.controller.storage.store import Store

    clock = ManualClock()
    settings = ControllerSettings()
    store = Store(tmp / "memory.db")
    controller = Controller(settings, load_rules([RULES_DIR]), clock, store,
                            build_drivers(settings.drivers, settings.routes, clock))
    marks = sorted({1, 3, 10, 60, 300, seconds})
    points: list[dict[str, float]] = []
    seq = [0] * nodes
    tracemalloc.start(1)
    try:
        gc.collect()
        base_snapshot = tracemalloc.take_snapshot()
        base = tracemalloc.get_traced_memory()[0]
        for second in range(1, seconds + 1):
            for i in range(nodes):
                seq[i] += 1
                controller.ingest(templates.body(i, seq[i], clock.time()), OPEN_ACCESS, None)
            clock.advance(1.0)
            controller.sweep()
            if second in marks:
                gc.collect()
                points.append({"reports_per_node": second,
                               "kb_per_node": (tracemalloc.get_traced_memory()[0] - base)
                               / nodes / 1024})
        stats = tracemalloc.take_snapshot().compare_to(base_snapshot, "lineno")
        sites = []
        for stat in stats[:top]:
            frame = stat.traceback[0]
            name = frame.filename.replace(os.sep, "/")
            short = (name.split("/sn_monitor/", 1)[1] if "/sn_monitor/" in name
                     else "/".join(name.split("/")[-2:]))
            sites.append({"site": f"{short}:{frame.lineno}",
                          "kb_per_node": stat.size_diff / nodes / 1024,
                          "objects_per_node": stat.count_diff / nodes})
    finally:
        tracemalloc.stop()
        controller.close()
        store.close()
    return {"nodes": nodes, "interval_s": 1.0, "points": points, "top_sites": sites}


# ---------------------------------------------------------------- report


def _probe_stats(samples: list[dict[str, Any]], key: str) -> dict[str, float]:
    return summary([s[key] for s in samples if s.get(key) is not None])


def render(results: dict[str, Any]) -> str:
    """The figures as text; a part that raised before measuring anything is one line."""
    broken = {k for k, v in results.items() if isinstance(v, dict) and set(v) == {"error"}}
    text = _render({k: v for k, v in results.items() if k not in broken})
    if results.get("rate_large", {}).get("skipped"):
        text += f"\n\n(4,096 nodes at a fixed rate: skipped, {results['rate_large']['skipped']})"
    return text + "".join(f"\n\n{k}: ERROR {results[k]['error']}" for k in sorted(broken))


def _render(results: dict[str, Any]) -> str:
    out: list[str] = []
    meta = results["meta"]
    out.append(f"sn-monitor {meta['version']} controller bench  ({meta['mode']}; python "
               f"{meta['python']}; {meta['cpus']} CPUs; load1 at start {meta['load1']}, "
               f"at end {meta.get('load1_end')})")
    out.append(f"controller: {meta['pinning']}")
    out.append(f"reports: {meta['report_bytes']} bytes of JSON each (8 GPUs, "
               f"{meta['ib_ports']} IB ports, {meta['netdevs']} netdevs; {VARIANTS} simulated "
               f"snapshots shared by the nodes); default rules ({meta['rules']})")
    tp = results.get("throughput")
    if tp:
        out.append("")
        w, s = tp.get("window", {}), tp.get("sender", {})
        out.append(f"1. ingest throughput, closed loop: {tp['nodes']} nodes, {tp['senders']} "
                   f"sender processes x {tp['connections'] // max(1, tp['senders'])} keep-alive "
                   f"connections     goal >= {GOALS['ingest_per_s']:g}/s on one core")
        if "error" in tp:
            out.append(f"   ERROR: {tp['error']}")
        if w:
            out.append(f"   accepted {fmt(w['accepted_per_s'], 0)} reports/s over "
                       f"{fmt(w['seconds'], 1)} s (sn_controller_reports_total{{outcome="
                       f"\"accepted\"}} delta; stale {w['stale']:.0f}, invalid "
                       f"{w['invalid']:.0f})")
            out.append(f"   controller CPU {fmt(w['controller_cpu_percent'], 0)} % of one core; "
                       f"senders CPU {fmt(s.get('cpu_percent'), 0)} % (all senders, of one core) "
                       f"-> per report: controller "
                       f"{fmt(w['controller_cpu_percent'] / 100 / w['accepted_per_s'] * 1e6, 0)}"
                       f" us, sender {fmt(s.get('cpu_s', 0) / max(1, s.get('sent', 1)) * 1e6, 0)}"
                       " us")
            loop = w.get("event_loop_thread", {})
            per_report_s = w["controller_cpu_percent"] / 100 / w["accepted_per_s"]
            out.append(f"   event loop thread: on CPU {fmt(loop.get('on_cpu_percent'), 0)} %, "
                       f"runnable but waiting for the core "
                       f"{fmt(loop.get('runnable_waiting_percent'), 0)} % (other tenants)")
            out.append(f"   capacity of one dedicated core (1 / CPU per report): "
                       f"{fmt(1 / per_report_s if per_report_s else math.nan, 0)} reports/s")
            h = w["ingest_histogram"]
            out.append(f"   under saturation: client latency median "
                       f"{fmt(s['latency_ms']['median'])} ms p99 {fmt(s['latency_ms']['p99'])} "
                       f"ms; ingest_seconds mean {fmt(h.get('mean_ms'), 3)} ms; "
                       f"non-200: {_non_200(s)}")
    for key in ("rate_small", "rate_large"):
        rp = results.get(key)
        if not rp or rp.get("skipped"):
            continue
        out.append("")
        out.append(f"2. ingest latency at a fixed rate: {rp['nodes']} nodes every "
                   f"{rp['interval_s']:g} s = {rp['rate_per_s']:g} reports/s "
                   f"(open loop, latency from each request's due time)")
        if "error" in rp:
            out.append(f"   ERROR: {rp['error']}")
        w, s = rp.get("window", {}), rp.get("sender", {})
        if w and s:
            lat = s["latency_ms"]
            h = w["ingest_histogram"]
            held = w["accepted_per_s"] >= 0.97 * rp["rate_per_s"]
            loop = w.get("event_loop_thread", {})
            out.append(f"   accepted {fmt(w['accepted_per_s'], 0)}/s "
                       f"({'held' if held else 'NOT HELD: requests queue without bound'}); "
                       f"controller CPU {fmt(w['controller_cpu_percent'], 0)} % (loop waiting "
                       f"for the core {fmt(loop.get('runnable_waiting_percent'), 0)} %); "
                       f"senders CPU {fmt(s['cpu_percent'], 0)} %; non-200: {_non_200(s)}")
            out.append(f"   {'':<30} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
            out.append(f"   {'client request latency ms':<30} {fmt(lat['median']):>8} "
                       f"{fmt(lat['p90']):>8} {fmt(lat['p99']):>8} {fmt(lat['max']):>8}   "
                       f"(n={lat['n']})")
            out.append(f"   {'controller ingest_seconds ms':<30} {fmt(h.get('p50_ms'), 3):>8} "
                       f"{'':>8} {fmt(h.get('p99_ms'), 3):>8} {'':>8}   mean "
                       f"{fmt(h.get('mean_ms'), 3)} ms (buckets .5/1/2.5/5 ms: "
                       f"interpolated)")
            out.append(f"   RSS {fmt(w['rss_mb_start'], 1)} -> {fmt(w['rss_mb_end'], 1)} MB "
                       f"over the window; open incidents at the end: {w['incidents_open']}")
        probes = rp.get("probes")
        if probes:
            thr = [p for p in probes["throttle"] if "error" not in p]
            xid = [p for p in probes["xid"] if "error" not in p]
            out.append(f"3. report-to-action latency during that load ({len(thr)} throttle, "
                       f"{len(xid)} XID probes; ms; goal p99 <= {GOALS['action_p99_ms']:g})")
            out.append(f"   {'':<56} {'median':>7} {'max':>7}")
            rows = [
                ("gpu-overheat hold complete -> throttle in a reply", thr,
                 "hold_to_command_ms"),
                ("  same, from the first report after the hold", thr,
                 "crossing_to_command_ms"),
                ("  hold complete -> incident detected (server stamp)", thr,
                 "detected_after_due_ms"),
                ("  hold complete -> throttle action recorded (server)", thr,
                 "action_recorded_after_due_ms"),
                ("XID 79 report sent -> alert action recorded (server)", xid,
                 "alert_recorded_ms"),
                ("XID 79 report sent -> alert done (logged; server stamp)", xid,
                 "alert_done_ms"),
                ("XID 79 report sent -> done alert seen by API polling", xid,
                 "alert_seen_by_polling_ms"),
                ("XID 79 report round trip", xid, "report_rtt_ms"),
            ]
            for label, samples, k in rows:
                st = _probe_stats(samples, k)
                out.append(f"   {label:<56} {fmt(st['median'], 1):>7} {fmt(st['max'], 1):>7}"
                           f"   n={st['n']}")
            errs = [p for p in probes["throttle"] + probes["xid"] if "error" in p]
            for p in errs:
                out.append(f"   probe {p['node']}: {p['error']}")
            rtt = _probe_stats(thr, "first_rtt_ms")
            poll = _probe_stats(thr, "command_report_rtt_ms")
            out.append(f"   resolution: the hold starts when the server ingests the first hot "
                       f"report, somewhere in its {fmt(rtt['median'], 1)} ms round trip; "
                       f"figures count from its send (upper bound); the probe polls back to "
                       f"back after the hold (~{fmt(poll['median'], 1)} "
                       "ms per report). A real agent reports every 1 s, so it gets the "
                       "command in the reply to its next report: + up to 1 s.")
    rss = results.get("rss")
    if rss:
        out.append("")
        out.append(f"4. controller RSS (VmRSS) after {rss['rounds']} reports from each node"
                   f"     goal <= {GOALS['rss_mb_per_1000_nodes']:g} MB per 1,000 nodes")
        if "error" in rss:
            out.append(f"   ERROR: {rss['error']}")
    if rss and rss.get("points"):
        out.append(f"   {'nodes':>6} {'RSS MB':>8} {'MB/1000 over empty':>19} "
                   f"{'reports/s':>10} {'open incidents':>15}")
        for p in rss.get("points", []):
            rate = p["reports"] / p["seconds"] if p.get("seconds") else None
            out.append(f"   {p['nodes']:>6} {fmt(p['rss_mb'], 1):>8} "
                       f"{fmt(p.get('mb_per_1000_over_empty'), 1):>19} {fmt(rate, 0):>10} "
                       f"{p.get('incidents_open', '')!s:>15}")
        out.append(f"   slope over the registered levels: "
                   f"{fmt(rss.get('mb_per_1000_nodes_slope'), 1)} MB per 1,000 nodes")
    mem = results.get("memory")
    if mem and "points" in mem:
        out.append(f"   as reports accumulate (in-process, tracemalloc, {mem['nodes']} nodes "
                   f"at 1 Hz on a manual clock): Python heap KB per node")
        out.append("     " + ", ".join(f"{p['reports_per_node']} s: "
                                        f"{fmt(p['kb_per_node'], 0)}" for p in mem["points"])
                   + f"  -> {fmt(mem['points'][-1]['kb_per_node'] * 1000 / 1024, 0)} MB "
                     "per 1,000 nodes in steady state (heap only)")
        out.append("     top growth: " + "; ".join(
            f"{s['site']} {fmt(s['kb_per_node'], 0)} KB ({s['objects_per_node']:.0f} objects)"
            for s in mem["top_sites"][:4]))
    elif mem:
        out.append(f"   steady state: ERROR {mem.get('error')}")
    prof = results.get("profile")
    if prof:
        out.append("")
        out.append(f"5. where an ingest goes: Controller.ingest in-process (no HTTP), "
                   f"{prof['nodes']} nodes x {prof['rounds']} rounds, CPU us per report")
        out.append(f"   ingest() median {fmt(prof['ingest_us']['median'], 1)} us, p99 "
                   f"{fmt(prof['ingest_us']['p99'], 1)} us")
        if "steps_us_median" in prof:
            med, mean = prof["steps_us_median"], prof["steps_us_mean"]
            out.append("   steps (median / mean): " + ", ".join(
                f"{k} {fmt(med[k], 1)}/{fmt(mean[k], 1)}" for k in med))
        tp = results.get("throughput", {}).get("window")
        if tp and tp.get("accepted_per_s"):
            per = tp["controller_cpu_percent"] / 100 / tp["accepted_per_s"] * 1e6
            out.append(f"   controller process CPU per report over HTTP (part 1): {fmt(per, 0)} "
                       f"us -> HTTP + ASGI + event loop + sweep ~ "
                       f"{fmt(per - prof['ingest_us']['median'], 0)} us "
                       f"({fmt(1 - prof['ingest_us']['median'] / per, 2)} of it)")
        out.append(f"   sweep with {prof['nodes']} nodes: {fmt(prof['sweep_ms']['median'])} ms; "
                   f"/metrics render: {fmt(prof['metrics_render_ms']['median'])} ms")
        out.append("   cProfile, top self time (us per report, under the profiler):")
        for row in prof["profile_top_self"][:8]:
            out.append(f"     {fmt(row['tottime_us_per_report'], 1):>6} self "
                       f"{fmt(row['cumtime_us_per_report'], 1):>6} cum  {row['function']}")
    return "\n".join(out)


def _non_200(sender: dict[str, Any]) -> str:
    bad = {k: v for k, v in sender.get("statuses", {}).items() if k != 200}
    text = ", ".join(f"{k}: {v}" for k, v in sorted(bad.items())) or "none"
    if sender.get("errors"):
        text += f"; connection errors {sender['errors']}"
    if sender.get("reconnects"):
        text += (f"; {sender['reconnects']} connections closed by the server and replaced"
                 f" ({sender.get('retries', 0)} requests sent again)")
    if sender.get("sender_errors"):
        text += f"; {sender['sender_errors']}"
    return text


def pick_cores(pin: bool) -> tuple[int | None, set[int] | None, str]:
    """(controller core, cores for this process and the senders, a line saying so)."""
    cores = sorted(os.sched_getaffinity(0))
    if not pin:
        return None, None, "not pinned (--no-pin)"
    if len(cores) < 2:
        return None, None, f"not pinned: only {len(cores)} usable core"
    if shutil.which("taskset") is None:
        return None, set(cores[1:]), "not pinned: no taskset; load generator off core " \
                                     f"{cores[0]}"
    return cores[0], set(cores[1:]), (f"pinned to core {cores[0]} with taskset -c "
                                      f"{cores[0]}; load generator and probes on cores "
                                      f"{','.join(map(str, cores[1:]))}")


def problems(results: dict[str, Any]) -> list[str]:
    """What could not be measured (see :func:`bench.common.finish`). A figure that misses
    its goal (a rate NOT HELD, a slow probe) is a result, not a failure."""
    out: list[str] = []
    for name in ("throughput", "rate_small", "rate_large", "rss", "memory", "profile"):
        part = results.get(name)
        if part is None or part.get("skipped"):
            continue
        if "error" in part:
            out.append(f"{name}: {part['error']}")
        sender = part.get("sender", {})
        for err in sender.get("sender_errors", []):
            out.append(f"{name}: load sender: {err}")
        window = part.get("window")
        if name in ("throughput", "rate_small", "rate_large") and "error" not in part:
            if not window or not window.get("accepted"):
                out.append(f"{name}: the controller accepted no report in the window")
            if not sender.get("latency_ms", {}).get("n"):
                out.append(f"{name}: no answered request to take a latency from")
        for kind, samples in part.get("probes", {}).items():
            if samples and not any("error" not in p for p in samples):
                out.append(f"{name}: every {kind} probe failed: "
                           + "; ".join(sorted({p["error"] for p in samples})))
        for point in part.get("points", []) if name == "rss" else ():
            for err in point.get("sender_errors", []):
                out.append(f"rss: {point['nodes']} nodes: load sender: {err}")
            if point["nodes"] and not point.get("accepted"):
                out.append(f"rss: {point['nodes']} nodes: no report accepted")
        if name == "memory" and "error" not in part and not part.get("points"):
            out.append("memory: no point measured")
        if name == "profile" and "error" not in part and not part["ingest_us"]["n"]:
            out.append("profile: no ingest timed")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controller_bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_args(parser, "a smoke run: short windows, one probe of each kind, two small "
                            "RSS levels, the 4,096-node rate skipped (about half a minute)")
    parser.add_argument("--senders", type=int, default=2, help="load processes (default 2)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin with taskset")
    parser.add_argument("--no-profile", action="store_true", help="skip the in-process part")
    parser.add_argument("--sn-monitor", metavar="COMMAND",
                        help="the sn-monitor command line to run the controller with "
                             "(default: this environment's)")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "controller.json")
    program = sn_monitor_command(args.sn_monitor)

    levels: tuple[int, ...]
    if args.quick:
        tp_warmup, tp_window, rate_s, probes, levels, prof_nodes, prof_rounds = (
            1.0, 3.0, 4.0, 1, (500, 1000), 200, 2)
        memory_nodes, memory_s = 20, 60
    else:
        tp_warmup, tp_window, rate_s, probes, levels, prof_nodes, prof_rounds = (
            2.0, 15.0, 16.0, 8, (1000, 4096, 8192), 1000, 5)
        memory_nodes, memory_s = 30, 330
    controller_core, load_cores, pinning = pick_cores(not args.no_pin)
    if load_cores is not None:
        os.sched_setaffinity(0, load_cores)  # inherited by the forked senders
    variants = snapshot_reports(VARIANTS)
    biggest = max(*levels, 1000 if args.quick else 4096, prof_nodes)
    templates = build_templates(biggest, f"bench-{os.getpid()}", variants)
    sample_body = templates.body(0, 1, time.time())
    results: dict[str, Any] = {
        "meta": {
            "version": __version__,
            "mode": "quick" if args.quick else "full",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load1": round(os.getloadavg()[0], 2),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "goals": GOALS,
            "pinning": pinning,
            "controller_command": program,
            "report_bytes": len(sample_body),
            "ib_ports": len(variants[0].infiniband),
            "netdevs": len(variants[0].network),
            "rules": f"{len(load_rules([RULES_DIR]))} rules from {RULES_DIR.name}/",
            "controller_config": CONTROLLER_CONFIG,
        }
    }
    with tempfile.TemporaryDirectory(prefix="sn-cbench-") as tmpdir:
        tmp = Path(tmpdir)
        parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("throughput", lambda: part_throughput(
                tmp, templates, controller_core, 1000, args.senders, 8,
                warmup=tp_warmup, window=tp_window, program=program)),
            ("rate_small", lambda: part_rate(
                tmp, templates, controller_core, 1000, 2.0, args.senders, warmup=2.0,
                duration=max(rate_s, 1.2 * probes + 7.0), probes=probes, program=program)),
        ]
        if args.quick:
            results["rate_large"] = {"skipped": "--quick"}
        else:
            parts.append(("rate_large", lambda: part_rate(
                tmp, templates, controller_core, 4096, 2.0, args.senders, warmup=2.0,
                duration=rate_s, probes=probes // 2, program=program)))
        parts.append(("rss", lambda: part_rss(tmp, templates, controller_core, levels,
                                              args.senders, rounds=3, program=program)))
        parts.append(("memory", lambda: memory_steady(tmp, templates, memory_nodes,
                                                      memory_s)))
        if not args.no_profile:
            parts.append(("profile", lambda: profile_ingest(tmp, templates, prof_nodes,
                                                            prof_rounds)))
        for name, run in parts:
            print(f"... {name}", file=sys.stderr, flush=True)
            try:
                results[name] = run()
            except Exception as err:  # noqa: BLE001 - one part failing must not hide the rest
                results[name] = {"error": f"{type(err).__name__}: {err}"}
    results["meta"]["load1_end"] = round(os.getloadavg()[0], 2)
    return finish(results, out_path, problems(results), render)


if __name__ == "__main__":
    sys.exit(main())
