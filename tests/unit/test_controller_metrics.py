"""The controller's counters and histograms are there at 0 before their first event.

Prometheus' increase() and rate() see a series' first event only if the series was
scraped before it: a counter created by its first event reads 0 increase after it.
"""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sn_monitor.controller.jobs.views import JobMetric, JobMetrics, RecoveryDuration
from sn_monitor.controller.telemetry.metrics import (
    RECOVERY_BUCKETS,
    ControllerMetrics,
    ControllerState,
)


def _job(failures: int = 0) -> JobMetric:
    return JobMetric(state="running", generation=failures, failures_total=failures,
                     checkpoint_age_seconds=None, effective_training_ratio=None,
                     productive_seconds=0.0, nodes=4, spares=1, median_step_seconds=None,
                     last_step=None)


def _samples(state: ControllerState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(ControllerMetrics(lambda: state).registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_jobs_recovery_histogram_is_there_empty_before_its_first_recovery():
    samples = _samples(ControllerState(jobs=JobMetrics(jobs={"llm": _job()})))
    buckets = {dict(labels)["le"]: v for (name, labels), v in samples.items()
               if name == "sn_recovery_duration_seconds_bucket"}
    assert set(buckets) == {*(str(b) for b in RECOVERY_BUCKETS), "+Inf"}
    assert set(buckets.values()) == {0.0}
    assert samples[("sn_recovery_duration_seconds_count", (("job", "llm"),))] == 0
    assert samples[("sn_recovery_duration_seconds_sum", (("job", "llm"),))] == 0


def test_a_recovery_counts_in_its_jobs_histogram():
    done = RecoveryDuration(id="r1", job="llm", kind="failover", total=25.0, detection=5.0,
                            eviction=5.0, restart=5.0, reload=10.0, finished_at=100.0)
    samples = _samples(ControllerState(jobs=JobMetrics(
        jobs={"llm": _job(1), "idle": _job()}, recoveries=(done,))))
    assert samples[("sn_recovery_duration_seconds_count", (("job", "llm"),))] == 1
    assert samples[("sn_recovery_duration_seconds_bucket", (("job", "llm"), ("le", "30.0")))] == 1
    assert samples[("sn_recovery_duration_seconds_bucket", (("job", "llm"), ("le", "20.0")))] == 0
    assert samples[("sn_recovery_duration_seconds_count", (("job", "idle"),))] == 0


def test_every_action_and_outcome_report_outcome_and_event_kind_starts_at_zero():
    samples = _samples(ControllerState(action_outcomes={("evict", "succeeded"): 2}))
    actions = {dict(labels)["action"] + " " + dict(labels)["outcome"]: v
               for (name, labels), v in samples.items() if name == "sn_actions_total"}
    assert actions["evict succeeded"] == 2
    for key in ("failover succeeded", "restore failed", "evict refused", "reset_gpu held",
                "cordon dry_run", "evict cancelled", "reboot awaiting_approval"):
        assert actions[key] == 0, key
    assert "evict pending" not in actions  # passing states are not outcomes
    reports = {dict(labels)["outcome"]: v for (name, labels), v in samples.items()
               if name == "sn_controller_reports_total"}
    assert reports == {"accepted": 0, "stale": 0, "invalid": 0, "forbidden": 0}
    events = {dict(labels)["kind"]: v for (name, labels), v in samples.items()
              if name == "sn_controller_events_total"}
    assert events["xid"] == 0
    assert events["gpu_lost"] == 0
    assert samples[("sn_detection_latency_seconds_count", ())] == 0
    assert not any(math.isnan(v) for v in samples.values())
