"""The controller's own metrics: state gauges from a custom collector, latencies as histograms.

State (node states, firing rules, open incidents, action outcomes) is read from the
controller when Prometheus scrapes; latencies are observed as they happen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sn_monitor import __version__

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0)
INGEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True)
class ControllerState:
    """What the state collector formats."""

    node_states: Mapping[str, str] = field(default_factory=dict)
    firing: tuple[tuple[str, str], ...] = ()
    open_incidents: int | None = None
    action_outcomes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    breaker_open: bool = False
    store_up: bool = True


class ControllerStateCollector(Collector):
    """Formats a :class:`ControllerState` taken at scrape time."""

    def __init__(self, source: Callable[[], ControllerState]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        state = self._source()
        info = GaugeMetricFamily("sn_controller_info", "The controller's version.",
                                 labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info
        nodes = GaugeMetricFamily("sn_node_state", "1 for each node's current state.",
                                  labels=["node", "state"])
        for node, value in sorted(state.node_states.items()):
            nodes.add_metric([node, value], 1.0)
        yield nodes
        yield GaugeMetricFamily("sn_controller_nodes", "Nodes the controller knows.",
                                value=len(state.node_states))
        firing = GaugeMetricFamily("sn_rule_firing",
                                   "1 while a rule fires on a node (any subject of it).",
                                   labels=["rule", "node"])
        for rule, node in sorted(set(state.firing)):
            firing.add_metric([rule, node], 1.0)
        yield firing
        if state.open_incidents is not None:
            yield GaugeMetricFamily("sn_incidents_open", "Incidents not yet resolved.",
                                    value=state.open_incidents)
        actions = CounterMetricFamily("sn_actions", "Actions by outcome.",
                                      labels=["action", "outcome"])
        for (action, outcome), count in sorted(state.action_outcomes.items()):
            actions.add_metric([action, outcome], float(count))
        yield actions
        yield GaugeMetricFamily("sn_breaker_open",
                                "1 while the circuit breaker freezes evictions.",
                                value=1.0 if state.breaker_open else 0.0)
        yield GaugeMetricFamily("sn_controller_store_up",
                                "1 while the store takes writes (0: the controller refuses "
                                "to act without an audit record).",
                                value=1.0 if state.store_up else 0.0)


class ControllerMetrics:
    """The controller's registry: the state collector plus event histograms."""

    def __init__(self, state: Callable[[], ControllerState]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ControllerStateCollector(state))
        self.detection_latency = Histogram(
            "sn_detection_latency_seconds",
            "From the fault first seen by the agent to the rule firing on the controller.",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.ingest_seconds = Histogram(
            "sn_controller_ingest_seconds", "Time to decode, check and evaluate one report.",
            buckets=INGEST_BUCKETS, registry=self.registry,
        )
        self.reports = Counter(
            "sn_controller_reports", "Reports received, by outcome.", ["outcome"],
            registry=self.registry,
        )
        self.events = Counter(
            "sn_controller_events", "Agent events stored, by kind.", ["kind"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
