"""The report counters kept without locks expose what prometheus_client's metrics did."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sn_monitor.controller.telemetry.metrics import IngestTally


def test_reports_and_ingest_times_are_exposed_as_a_counter_and_a_histogram():
    tally = IngestTally()
    registry = CollectorRegistry()
    registry.register(tally)
    for outcome in ("accepted", "accepted", "stale", "invalid"):
        tally.report(outcome)
    for seconds in (0.0001, 0.0005, 0.0006, 0.03, 7.0):  # 0.0005 is in its own bucket (le)
        tally.observe(seconds)
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    reports = {s.labels["outcome"]: s.value for s in families["sn_controller_reports"].samples
               if s.name.endswith("_total")}
    assert reports == {"accepted": 2, "stale": 1, "invalid": 1, "forbidden": 0}  # there at 0
    assert tally.count("accepted") == 2
    samples = families["sn_controller_ingest_seconds"].samples
    buckets = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
    assert buckets["0.0005"] == 2
    assert buckets["0.001"] == 3
    assert buckets["0.05"] == 4
    assert buckets["+Inf"] == 5
    (count,) = [s.value for s in samples if s.name.endswith("_count")]
    (total,) = [s.value for s in samples if s.name.endswith("_sum")]
    assert count == 5
    assert abs(total - 7.0312) < 1e-9
