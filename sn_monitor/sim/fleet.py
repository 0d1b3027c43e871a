"""``sn-monitor simulate``: thousands of simulated agents in one process, against any controller.

The fleet is light enough that 8,192 simulated nodes run beside a controller on a
2-core machine, so it skips what one simulated agent has (a /proc and /sys tree, the
fake NVML, the collectors) and keeps what the controller sees: the reports.

- **Values.** A handful of base reports are made from the GPU model
  (:class:`~sn_monitor.sim.gpu_model.SimulatedGpu`, warmed up to working temperature;
  the InfiniBand ports and interfaces of :mod:`~sn_monitor.sim.node_tree` with their
  error counters at zero). A healthy node's report is one of them with its own head
  (node name, instance, sequence, sample time, labels): the JSON is pre-encoded in
  slices and joined per report, so a report costs the fleet a few microseconds. Nodes
  step through the variants, so values move from one report to the next.
- **Faults.** A node that has been hit by a fault gets its own state
  (:mod:`sn_monitor.sim.fleet_node`): each faulted GPU
  becomes a real ``SimulatedGpu`` (thermal model, power cap, ECC, NVLink, PCIe), stepped
  by the simulated time between its reports, and the same fault handlers as a simulated
  agent's ``POST /sim/fault`` (:data:`sn_monitor.sim.node.FAULTS`) act on it. Its report
  is then encoded from structs (still well under a millisecond). Only faulted nodes pay.
  Fleet-level faults: ``node-lost`` (the node stops reporting), ``node-back``,
  ``straggler`` (every GPU of the node at low utilization).
- **Events and commands.** XIDs (and a GPU falling off the bus) become events numbered
  per node, sent with every report until ``events_stored_through`` covers them. As an
  agent's fast path does, a node sends its new events at once, right after its fault is
  played, in an events-only report (``Report.events_only``), unless its previous report
  still waits for an answer; ``--events-at-next-report`` sends them with its next report
  instead, as agents before the fast path did.
  Commands in a reply are carried out (``throttle`` caps the GPU's power, so the thermal
  model cools it; ``release`` restores the limit) and their results go out with the
  node's next report. There is no local thermal guard: the controller's throttle is
  what cools a simulated GPU.
- **Topology.** Every node is the same simulated HGX H100 (:func:`sn_monitor.sim.hgx.
  simulated_topology`, built once): the templates carry its digest, and a node's first
  report, and the next one after a reply said ``topology_wanted``, carries the topology
  itself (encoded from structs, and asking for an answer on a stream).
- **Node-local rules.** Like an agent, each node says it takes rules; once the reply to
  one of its reports carries the controller's node-local rules, it evaluates them itself
  (:class:`~sn_monitor.agent.rules.NodeRules`, on faulted nodes; a healthy node's values
  fire none, which the templates check) and sends trimmed reports with its findings,
  pre-encoded per rules version as the full ones are. ``--full-reports`` sends full
  reports throughout, as agents before edge rules do, for the controller to evaluate.
- **Sending.** One thread, a few connections (:mod:`sn_monitor.sim.fleet_client`: one
  small state machine each, on one selector), each node reporting every ``interval``
  with jitter, the first reports spread over the first interval so the load is even.
  :meth:`Fleet.run` is the schedule: it plays the faults that fell due, sends the
  reports that fell due on the free connections, and reads the answers. Each
  connection is a reports' stream (:mod:`sn_monitor.report_stream`), as an agent's
  is: reports go out as they fall due, and a node asks for an answer as an
  agent does (its first report, one carrying events or command results, and one every
  :data:`~sn_monitor.report_stream.ASK_EVERY_SECONDS`), so a node waits only for those.
  ``--post-reports`` (or a controller without streams, which answers the upgrade 404)
  posts every report as agents of an earlier version do, one request in flight per
  keep-alive connection: a report due while every connection is busy waits. That wait
  is the *schedule lag*; a report overdue by more than an interval is not sent and
  counted (the fleet or the controller cannot keep up). Latency is from sending a report
  to reading its answer (on a stream, of the reports that asked for one). At the end
  each stream sends one more report that asks, so that the answers count every report
  the streams carried.

The scenario (:mod:`sn_monitor.sim.scenario`) plays on the fleet by node index, in
simulated time: wall time since the start times ``speed``.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import msgspec

from sn_monitor import __version__
from sn_monitor.agent.collectors.infiniband import counter_stem
from sn_monitor.agent.report import is_reported_ib_counter
from sn_monitor.agent.rules import NodeRules
from sn_monitor.clock import SystemClock
from sn_monitor.config import ConfigError
from sn_monitor.model import (
    MAX_EVENTS,
    Command,
    CommandResult,
    EdgeRules,
    HostReport,
    IbPortReport,
    NetReport,
    NodeTopology,
    Report,
    topology_digest,
)
from sn_monitor.rules.series import Trim
from sn_monitor.sim.fleet_client import (
    ControllerAddress,
    FleetStats,
    LoadClient,
    Outgoing,
    Samples,
)
from sn_monitor.sim.fleet_node import (
    IB_ACTIVE,
    FleetNode,
    NodeFaults,
    events_only_report,
    gpu_values,
    remedy,
)
from sn_monitor.sim.gpu_model import H100_SXM, GpuProfile, make_gpus
from sn_monitor.sim.hgx import simulated_topology
from sn_monitor.sim.node import FAULTS, FaultError, SimulatedNode
from sn_monitor.sim.node_tree import DEFAULT_IB_DEVICES, IB_COUNTER_FILES, IB_HW_COUNTER_FILES
from sn_monitor.sim.scenario import (
    FAULT_SPECS,
    NETDEVS,
    PlannedFault,
    Scenario,
    format_seconds,
)

#: Distinct base reports the healthy nodes step through.
VARIANTS = 8
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class FleetOptions:
    """What ``sn-monitor simulate`` was asked to do."""

    controller: str
    nodes: int = 1000
    interval: float = 1.0
    duration: float | None = None
    speed: float = 1.0
    gpus: int = 8
    connections: int = 16
    jitter: float = 0.1
    seed: int = 0
    token: str | None = None
    #: The CA bundle an https controller's certificate must chain to (None: the system's).
    ca_file: str | None = None
    #: The index of the first node: ``--first 256 --nodes 256`` is the second supernode of
    #: 256 nodes (``sim-0256`` .., labels ``supernode: sn01``), for one fleet of several
    #: controllers (a ``simulate`` each).
    first: int = 0
    #: Send full reports throughout (agents of a version before node-local rules).
    full_reports: bool = False
    #: Post every report (agents of a version before the reports' stream).
    post_reports: bool = False
    #: A fault's events go at once in an events-only report, as an agent's fast path
    #: sends them (False: with the node's next report, as agents before it did).
    fast_events: bool = True


def node_name(index: int, nodes: int) -> str:
    """``sim-0007``: zero-padded to at least 4 digits, wider for fleets past 10,000."""
    return f"sim-{index:0{max(4, len(str(nodes - 1)))}d}"


def node_labels(index: int) -> dict[str, str]:
    """A node's labels: 256 nodes a supernode, 8 a rack, 32 a job (the peers group).

    Eight 8-GPU servers fill a liquid-cooled rack (an air-cooled one holds four, as the
    demo's supernode has them).
    """
    return {"job": f"job-{index // 32:03d}", "rack": f"r{index // 8:03d}",
            "supernode": f"sn{index // 256:02d}"}


# ---------------------------------------------------------------- values


def _ib_counters() -> dict[str, int]:
    out: dict[str, int] = {}
    for name in IB_COUNTER_FILES + IB_HW_COUNTER_FILES:
        stem = counter_stem(name)
        if stem is not None and is_reported_ib_counter(stem):
            out[stem] = 0
    return out


def fleet_topology(gpus: int, profile: GpuProfile = H100_SXM, seed: int = 0) -> NodeTopology:
    """The topology every simulated node of the fleet reports (GPUs as in base_reports)."""
    models = make_gpus(gpus, profile, seed=seed)
    return simulated_topology([(g.uuid, g.pci_bus_id, len(g.nvlinks)) for g in models],
                              seed=seed)


def base_reports(gpus: int, variants: int = VARIANTS, profile: GpuProfile = H100_SXM,
                 seed: int = 0, digest: str = "") -> list[Report]:
    """``variants`` reports of one healthy node at working temperature, 2 s apart.

    ``digest``: the topology digest they carry (:func:`fleet_topology`'s).
    """
    models = make_gpus(gpus, profile, seed=seed)
    for gpu in models:
        gpu.step(150.0)  # ~5 thermal time constants
    counters = _ib_counters()
    infiniband = [IbPortReport(device=d, port=1, state=IB_ACTIVE, counters=counters)
                  for d in DEFAULT_IB_DEVICES]
    network = [NetReport(device=d, carrier_up=True, carrier_changes_total=2,
                         receive_errors_total=0, transmit_errors_total=0,
                         receive_drops_total=0, transmit_drops_total=0) for d in NETDEVS]
    out = []
    for _ in range(variants):
        for gpu in models:
            gpu.step(2.0)
        out.append(Report(node="x", instance="x", sequence=0, sample_time_seconds=0.0,
                          agent_version=__version__, gpus=[gpu_values(g) for g in models],
                          infiniband=infiniband, network=network,
                          host=HostReport(processes_stuck=0), topology_digest=digest))
    return out


class _Reply(msgspec.Struct):
    """:class:`~sn_monitor.model.ReportReply`, commands left raw to decode one by one."""

    sequence: int = 0
    events_stored_through: int = -1
    commands: list[msgspec.Raw] = []
    edge_rules: EdgeRules | None = None
    topology_wanted: bool = False


class _CommandId(msgspec.Struct):
    id: str = ""


class Fleet:
    """N simulated agents reporting to one controller; :meth:`run` until stopped."""

    def __init__(self, options: FleetOptions, scenario: Scenario | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        if options.nodes < 1 or options.first < 0 or options.interval <= 0 or options.speed <= 0:
            raise ValueError("nodes, interval and speed must be positive, first not negative")
        self.options = options
        #: Where the reports go (ValueError: not an http(s) URL, or a bad CA file).
        self.address = ControllerAddress.parse(options.controller, options.ca_file)
        self.progress = progress
        self.rng = random.Random(options.seed)
        self.instance = uuid.uuid4().hex
        end = options.first + options.nodes
        self.names = [node_name(options.first + i, end) for i in range(options.nodes)]
        self.plan: list[PlannedFault] = []
        if scenario is not None:
            scenario.check_gpus(options.gpus)
            self.plan = scenario.resolve(options.nodes, self.names)
        self.scenario = scenario
        self.stats = FleetStats()
        self.latency = Samples(self.rng)
        self.lag = Samples(self.rng)
        #: When :meth:`run` started (monotonic): simulated time counts from it.
        self._started = time.monotonic()
        self.elapsed = 0.0
        self.cpu_seconds = 0.0
        self._build_templates()

    # ------------------------------------------------------------ templates

    def _build_templates(self) -> None:
        takes = not self.options.full_reports
        #: The topology every node reports, and its digest (in every template).
        self.topology = fleet_topology(self.options.gpus, seed=self.options.seed)
        self.topology_digest = topology_digest(self.topology)
        self.bases = [msgspec.structs.replace(r, takes_rules=takes)
                      for r in base_reports(self.options.gpus, seed=self.options.seed,
                                            digest=self.topology_digest)]
        #: The tails of the pre-encoded reports by rules version ("": full reports): with
        #: the values the controller's rules read, without them, and one report in how
        #: many carries them (EdgeRules.keep_every).
        whole = [_tail(r) for r in self.bases]
        self.tails: dict[str, tuple[list[bytes], list[bytes], int]] = {"": (whole, whole, 1)}
        self.edge: dict[str, EdgeRules] = {}
        sample = msgspec.structs.replace(self.bases[0], interval_seconds=self.interval_field,
                                         labels={"x": "y"})
        full = _encoder.encode(sample)
        self.mid = full[full.index(b',"agent_version":'):full.index(b',"labels":')] \
            + b',"labels":'
        first_event_id = int(time.time() * 1000)  # ids keep rising across runs
        self.nodes = [
            FleetNode(i, name, b'{"node":' + _encoder.encode(name) + b',"instance":'
                  + _encoder.encode(self.instance) + b',"sequence":',
                  _encoder.encode(node_labels(self.options.first + i)), first_event_id)
            for i, name in enumerate(self.names)]
        # The slices must make exactly the report they stand for.
        body = self.fast_body(self.nodes[-1], 7, 1.5)
        expected = msgspec.structs.replace(
            self.bases[(self.nodes[-1].index + 7) % len(self.bases)], node=self.names[-1],
            instance=self.instance, sequence=7, sample_time_seconds=1.5,
            interval_seconds=self.interval_field,
            labels=node_labels(self.options.first + self.nodes[-1].index))
        if msgspec.json.decode(body, type=Report) != expected:
            raise RuntimeError("report template does not round-trip")

    def _take_rules(self, edge: EdgeRules) -> bool:
        """Templates for nodes evaluating ``edge``; False if a node cannot take it."""
        if edge.version in self.tails:
            return True
        node = self.nodes[0]
        try:
            rules = NodeRules(edge, node.name, {}, SystemClock())
        except ConfigError as err:
            self.stats.note(f"cannot take the node-local rules: {err}")
            return False
        for report in self.bases:  # a healthy node fires none of them
            fired = rules.evaluate(report).findings
            if fired:
                raise RuntimeError(f"a healthy simulated node fires {fired[0].rule}")
        head = {"rules_version": edge.version, "takes_rules": True}
        values, bare = Trim(edge.keep), Trim(())
        every = max(1, round(edge.keep_every / self.options.interval))
        self.edge[edge.version] = edge
        self.tails[edge.version] = (
            [_tail(msgspec.structs.replace(values(r), **head)) for r in self.bases],
            [_tail(msgspec.structs.replace(bare(r), **head)) for r in self.bases], every)
        return True

    @property
    def interval_field(self) -> float:
        return min(3600.0, self.options.interval)

    def fast_body(self, node: FleetNode, sequence: int, now: float) -> bytes:
        values, bare, every = self.tails[node.rules_version]
        tails = values if (node.index + sequence) % every == 0 else bare
        variant = (node.index + sequence) % len(tails)
        return b"".join((node.head, str(sequence).encode(), b',"sample_time_seconds":',
                         repr(now).encode(), self.mid, node.labels, tails[variant]))

    def slow_body(self, node: FleetNode, sequence: int, now: float, sim_now: float
                  ) -> tuple[bytes, int, int]:
        """(body, events sent, results sent) for a node that cannot use the templates.

        One with faults, events or command results, or whose report carries the topology.
        """
        base = self.bases[(node.index + sequence) % len(self.bases)]
        parts: dict[str, Any] = {}
        if node.faults is not None:
            node.faults.advance(sim_now)
            parts = node.faults.report_parts(base)
        if node.topology_due:
            parts["topology"] = self.topology
        events = node.events[:MAX_EVENTS]
        results = node.results[:MAX_EVENTS]
        report = msgspec.structs.replace(
            base, node=node.name, instance=self.instance, sequence=sequence,
            sample_time_seconds=now, interval_seconds=self.interval_field,
            labels=node_labels(self.options.first + node.index), events=events,
            command_results=results, **parts)
        if node.rules_version:
            if node.rules is None or node.rules.version != node.rules_version:
                node.rules = NodeRules(self.edge[node.rules_version], node.name, {},
                                       SystemClock())
            report = node.rules.evaluate(report)
        return _encoder.encode(report), len(events), len(results)

    # ------------------------------------------------------------ faults

    def apply(self, planned: PlannedFault, sim_now: float,
              send_now: Callable[[FleetNode, int], None] | None = None) -> None:
        """Play one scenario fault on its nodes.

        ``send_now``: called with each node that has new events and how many it had
        before, right after its fault (the fast path: its events leave before the next
        node's fault is played).
        """
        if FAULT_SPECS[planned.fault].job_only:
            raise FaultError(f"{planned.fault} acts on the demo's training job: "
                             "sn-monitor demo plays it, simulate has no job")
        for index in planned.nodes:
            node = self.nodes[index]
            events_before = len(node.events)
            if planned.fault == "node-lost":
                node.lost = True
            elif planned.fault == "node-back":
                node.lost = False
            else:
                state = self._faults(node, sim_now)
                try:
                    if planned.fault == "straggler":
                        for g in range(self.options.gpus):
                            state.gpu(g).set_load(planned.params["utilization"])
                    else:
                        handler = FAULTS[planned.fault]
                        handler.apply(cast(SimulatedNode, state), planned.gpu,
                                      dict(planned.params))
                except (TypeError, ValueError, KeyError, IndexError) as err:
                    raise FaultError(f"{planned.fault} on {node.name}: {err}") from None
            if send_now is not None and len(node.events) > events_before:
                send_now(node, events_before)
        who = self.names[planned.nodes[0]]
        if len(planned.nodes) > 1:
            some = ", ".join(self.names[i] for i in planned.nodes[:4])
            who = f"{len(planned.nodes)} nodes ({some}{', ...' if len(planned.nodes) > 4 else ''})"
        gpu = f" GPU {planned.gpu}" if planned.gpu is not None else ""
        self.stats.faults_played.append(
            f"t={format_seconds(planned.at)}: {planned.source.describe()} on {who}{gpu}")

    def _faults(self, node: FleetNode, sim_now: float) -> NodeFaults:
        if node.faults is None:
            node.faults = NodeFaults(node, self.bases[node.index % len(self.bases)],
                                      self.options.gpus, sim_now)
            if node.rules_version:
                # A real agent evaluates its rules on every sample; this node has sent
                # templates until now. Its rules see it once as it is before the fault,
                # so that a counter's increase (ecc-uncorrectable) has a sample before it.
                self.slow_body(node, node.sequence, time.time(), sim_now)
        return node.faults

    def _commands(self, node: FleetNode, raw: list[msgspec.Raw], sim_now: float) -> None:
        for item in raw:
            try:
                command = msgspec.json.decode(item, type=Command)
            except msgspec.ValidationError as err:
                cid = msgspec.json.decode(item, type=_CommandId).id or "unknown"
                self.stats.commands["undecodable"] += 1
                node.results.append(CommandResult(id=cid[:128], ok=False,
                                                  time_seconds=time.time(),
                                                  message=f"not understood: {err}"))
                continue
            self.stats.commands[command.kind] += 1
            node.results.append(self._carry_out(node, command, sim_now))

    def _carry_out(self, node: FleetNode, command: Command, sim_now: float) -> CommandResult:
        now = time.time()
        if command.kind == "checkpoint":
            return CommandResult(id=command.id, ok=True, time_seconds=now,
                                 message="simulated node: no training job to checkpoint")
        gpus = range(self.options.gpus) if command.gpu is None else [command.gpu]
        if any(not 0 <= g < self.options.gpus for g in gpus):
            return CommandResult(id=command.id, ok=False, time_seconds=now,
                                 message=f"no GPU {command.gpu}")
        state = self._faults(node, sim_now)
        state.advance(sim_now)
        if command.kind in ("reset_gpu", "reboot", "verify"):
            return remedy(command, state, now)
        done = []
        for g in gpus:
            model = state.gpu(g)
            default = model.profile.power_default_limit_watts
            if command.kind == "release":
                watts = default
            elif command.power_watts is not None:
                watts = command.power_watts
            else:
                watts = default * (command.power_fraction or 0.7)
            done.append(f"GPU {g} {model.set_power_limit_watts(watts):.0f} W")
        return CommandResult(id=command.id, ok=True, time_seconds=now,
                             message=f"{command.kind}: " + ", ".join(done))

    # ------------------------------------------------------------ the loop

    def run(self, stop: threading.Event | None = None) -> FleetStats:
        """Report until ``duration`` (wall seconds) has passed or ``stop`` is set.

        Each turn of the loop plays the scenario's faults that fell due, lets the
        connections reconnect and time out, sends the reports that fell due on the free
        connections, and reads the answers until the next report is due.
        """
        stop = stop or threading.Event()
        opts = self.options
        cpu0 = time.process_time()
        start = self._started = time.monotonic()
        end = math.inf if opts.duration is None else start + opts.duration
        client = LoadClient(self, self.address, connections=opts.connections,
                            streams=not opts.post_reports, token=opts.token,
                            nodes=self.nodes, stats=self.stats, latency=self.latency,
                            now=start)
        due = self._first_reports(start)
        send_now = partial(self._send_events, client) if opts.fast_events else None
        plan = list(self.plan)
        next_progress = start + 10.0
        last_progress = (start, 0)
        try:
            while not stop.is_set() and (now := time.monotonic()) < end:
                sim_now = (now - start) * opts.speed
                while plan and plan[0].at <= sim_now:
                    self.apply(plan.pop(0), sim_now, send_now)
                client.maintain(now)
                self._send_due(due, client, now)
                client.wait(self._wait_seconds(due if client.free else [], plan, end))
                if self.progress is not None and now >= next_progress:
                    t0, sent0 = last_progress
                    rate = (self.stats.sent - sent0) / max(1e-9, now - t0)
                    self.progress(progress_line(self.stats, self.latency, now - start, rate))
                    last_progress = (now, self.stats.sent)
                    next_progress += 10.0
            client.finish()
        finally:
            self.elapsed = time.monotonic() - start
            self.cpu_seconds = time.process_time() - cpu0
            client.close()
        return self.stats

    def _send_events(self, client: LoadClient, node: FleetNode, earlier: int) -> None:
        """``node``'s new events at once in an events-only report, as an agent sends them.

        Not while ``earlier`` events of it wait for their acknowledgement (an agent waits
        for that answer), nor on no free connection: they go with its next report then.
        Its healthy report waiting for an answer holds nothing back: only the streams
        this fleet shares among nodes make that answer wait behind other nodes'.
        """
        if node.lost or earlier or not client.free:
            self.stats.events_only_deferred += 1
            return
        node.urgent = True
        client.send(node, time.monotonic())
        self.stats.events_only_sent += 1

    def _first_reports(self, start: float) -> list[tuple[float, int]]:
        """When each node reports first (a heap): evenly over the first interval, shuffled."""
        opts = self.options
        offsets = [(k + self.rng.random()) / opts.nodes * opts.interval
                   for k in range(opts.nodes)]
        self.rng.shuffle(offsets)
        due = [(start + offsets[i], i) for i in range(opts.nodes)]
        heapq.heapify(due)
        return due

    def _send_due(self, due: list[tuple[float, int]], client: LoadClient, now: float) -> None:
        """Send the reports that fell due, while a connection is free.

        A report overdue by more than an interval, or whose node's previous report is
        still unanswered, is not sent (counted); a lost node's is skipped.
        """
        while due and due[0][0] < now - self.options.interval:
            _, i = heapq.heappop(due)
            self.stats.not_sent += 1
            heapq.heappush(due, (self._next(now), i))
        while client.free and due and due[0][0] <= now:
            at, i = heapq.heappop(due)
            node = self.nodes[i]
            heapq.heappush(due, (self._next(at), i))
            if node.lost:
                self.stats.lost_skipped += 1
                continue
            if node.in_flight:  # its previous report is still unanswered
                self.stats.not_sent += 1
                continue
            self.lag.add((now - at) * 1e3)
            client.send(node, now)  # in turn: none sits idle

    def _wait_seconds(self, due: list[tuple[float, int]], plan: list[PlannedFault],
                      end: float) -> float:
        """How long to read answers: at most 50 ms, and no later than what comes next.

        What comes next: the next report (``due`` is empty when no connection is free to
        send it), the next fault, the end.
        """
        timeout = 0.05
        if due:
            timeout = max(0.0, min(timeout, due[0][0] - time.monotonic()))
        if plan:
            timeout = max(0.0, min(timeout, self._started + plan[0].at / self.options.speed
                                   - time.monotonic()))
        return max(0.0, min(timeout, end - time.monotonic()))

    def report(self, node: FleetNode, now: float) -> Outgoing:
        """``node``'s next report, at monotonic time ``now`` (:class:`Reporting`)."""
        sim_now = (now - self._started) * self.options.speed
        node.sequence += 1
        wall = time.time()
        topology = node.topology_due
        if node.urgent and node.events:
            node.urgent = False
            report = events_only_report(node, self.instance, wall, self.interval_field,
                                        node_labels(self.options.first + node.index))
            return Outgoing(_encoder.encode(report), len(report.events), 0, False)
        if node.slow:
            body, events, results = self.slow_body(node, node.sequence, wall, sim_now)
            return Outgoing(body, events, results, topology)
        return Outgoing(self.fast_body(node, node.sequence, wall), 0, 0, topology)

    def take_reply(self, node: FleetNode, body: bytes, now: float) -> None:
        """Act on a reply to ``node``'s report, read at monotonic ``now`` (:class:`Reporting`)."""
        self._reply(node, body, (now - self._started) * self.options.speed)

    def _next(self, after: float) -> float:
        jitter = self.options.jitter
        return after + self.options.interval * (1.0 + self.rng.uniform(-jitter, jitter))

    def _reply(self, node: FleetNode, body: bytes, sim_now: float) -> None:
        try:
            reply = msgspec.json.decode(body, type=_Reply)
        except msgspec.DecodeError as err:
            self.stats.note(f"undecodable reply: {err}")
            return
        if reply.events_stored_through >= 0 and node.events:
            kept = [e for e in node.events if e.id > reply.events_stored_through]
            self.stats.events_acknowledged += len(node.events) - len(kept)
            node.events = kept
        if reply.commands:
            self._commands(node, reply.commands, sim_now)
        if reply.edge_rules is not None and self._take_rules(reply.edge_rules):
            node.rules_version = reply.edge_rules.version
        if reply.topology_wanted:
            node.topology_due = True

    # ------------------------------------------------------------ results

    def summary(self) -> dict[str, Any]:
        """Everything :meth:`run` measured, as plain data (``--json``)."""
        s, opts = self.stats, self.options
        seconds = max(1e-9, self.elapsed)
        return {
            "controller": opts.controller, "nodes": opts.nodes, "gpus": opts.gpus,
            "interval_seconds": opts.interval, "speed": opts.speed,
            "connections": opts.connections,
            "scenario": self.scenario.name if self.scenario is not None else None,
            "seconds": round(self.elapsed, 3),
            "sent": s.sent, "accepted": s.accepted,
            "refused": {str(k): v for k, v in sorted(s.refused.items())},
            "failed": {"connection": s.connection_errors, "timeout": s.timeouts,
                       "server": {str(k): v for k, v in sorted(s.server_errors.items())}},
            "not_sent": s.not_sent, "skipped_lost": s.lost_skipped,
            "sent_per_second": round(s.sent / seconds, 1),
            "accepted_per_second": round(s.accepted / seconds, 1),
            "target_per_second": round(opts.nodes / opts.interval, 1),
            "latency_ms": self.latency.summary(),
            "schedule_lag_ms": self.lag.summary(),
            "commands": dict(s.commands),
            "events": {"sent": s.events_sent, "acknowledged": s.events_acknowledged,
                       "events_only_sent": s.events_only_sent,
                       "events_only_deferred": s.events_only_deferred},
            "faults_played": list(s.faults_played),
            "messages": dict(s.messages),
            "simulator_cpu_seconds": round(self.cpu_seconds, 3),
            "simulator_cpu_percent": round(100 * self.cpu_seconds / seconds, 1),
        }


def progress_line(s: FleetStats, latency: Samples, t: float, rate: float) -> str:
    """What ``simulate`` prints every 10 s while it runs."""
    return (f"t={t:5.0f}s  sent {s.sent} ({rate:.0f}/s)  accepted {s.accepted}  "
            f"refused {sum(s.refused.values())}  failed {s.failed}  not sent "
            f"{s.not_sent}  p99 {latency.summary()['p99']} ms")


def _tail(report: Report) -> bytes:
    """What follows the labels in ``report``'s JSON (the part nodes share)."""
    full = _encoder.encode(msgspec.structs.replace(report, labels={"x": "y"}))
    mark = b'"labels":{"x":"y"}'
    return full[full.index(mark) + len(mark):]


def render_summary(summary: dict[str, Any]) -> str:
    """The summary table ``sn-monitor simulate`` prints at the end."""
    s = summary
    lat, lag = s["latency_ms"], s["schedule_lag_ms"]
    refused = sum(s["refused"].values())
    failed = s["failed"]["connection"] + s["failed"]["timeout"] + sum(
        s["failed"]["server"].values())

    def detail(counts: dict[str, int]) -> str:
        return ", ".join(f"{k}: {v}" for k, v in counts.items())

    lines = [
        f"sn-monitor simulate: {s['nodes']} nodes x {s['gpus']} GPUs -> {s['controller']}, "
        f"every {format_seconds(s['interval_seconds'])} ({s['target_per_second']:g} "
        f"reports/s), {s['seconds']:.1f} s"
        + (f", scenario {s['scenario']} at x{s['speed']:g}" if s["scenario"] else ""),
        "",
        f"  {'reports sent':<26}{s['sent']:>10}   {s['sent_per_second']:>9.1f}/s",
        f"  {'accepted (2xx)':<26}{s['accepted']:>10}   {s['accepted_per_second']:>9.1f}/s",
        f"  {'refused (4xx)':<26}{refused:>10}   {detail(s['refused'])}",
        f"  {'failed (5xx, connection)':<26}{failed:>10}   "
        + detail({**s["failed"]["server"], "connection": s["failed"]["connection"],
                  "timeout": s["failed"]["timeout"]}),
        f"  {'not sent (behind)':<26}{s['not_sent']:>10}",
        "",
        f"  {'ms':<26}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
        f"  {'latency':<26}{_ms(lat['p50'])}{_ms(lat['p90'])}{_ms(lat['p99'])}{_ms(lat['max'])}",
        f"  {'schedule lag':<26}{_ms(lag['p50'])}{_ms(lag['p90'])}{_ms(lag['p99'])}"
        f"{_ms(lag['max'])}",
        "",
        f"  commands received: {detail(s['commands']) or 'none'}; events sent "
        f"{s['events']['sent']}, acknowledged {s['events']['acknowledged']}; "
        f"simulator CPU {s['simulator_cpu_percent']:.0f} % of a core",
    ]
    if s["faults_played"]:
        lines.append("  faults played:")
        lines.extend(f"    {f}" for f in s["faults_played"])
    if s["messages"]:
        lines.append("  what the controller said (or what failed):")
        lines.extend(f"    {n} x {m}" for m, n in s["messages"].items())
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{'-' if value is None else f'{value:.1f}':>10}"
