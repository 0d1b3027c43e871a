"""DistributedJob files and API bodies: the good example and the corpus of bad ones."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from sn_monitor.config import ConfigError, parse_yaml
from sn_monitor.controller.jobs.spec import (
    DistributedJob,
    JobSpecError,
    job_from_json,
    job_to_dict,
    load_job,
    load_jobs,
    parse_job,
)
from tests.conftest import expected_messages

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "tests" / "fixtures" / "jobs"
BAD = JOBS / "bad"

MINIMAL = """\
apiVersion: sn-monitor/v1
kind: DistributedJob
metadata: {name: %s}
spec:
  replicas: 2
  nodes: [node-1, node-2]
  checkpoint: {dir: /ckpt}
  control: {command: [/usr/local/bin/job-control, --job, x]}
"""


def _expected() -> list[tuple[str, str]]:
    return expected_messages(BAD)


def test_every_bad_job_has_an_expectation():
    assert {name for name, _ in _expected()} == {p.name for p in BAD.glob("*.yaml")}


@pytest.mark.parametrize(("name", "message"), _expected())
def test_bad_job_names_file_key_and_line(name, message):
    path = BAD / name
    with pytest.raises(ConfigError) as caught:
        load_job(path)
    assert str(caught.value) == f"{path}{message}"


def test_the_design_example_loads():
    job = load_job(JOBS / "trillion.yaml")
    assert job.name == "trillion-model"
    spec = job.spec
    assert spec.replicas == 128
    assert spec.checkpoint_interval == 900.0
    assert spec.max_failures == 40
    assert spec.recovery_strategy == "elastic"
    assert spec.node_selector == {"supernode": "sn0"}
    assert spec.node_names is None
    assert spec.spares == ["node-129", "node-130"]
    assert spec.checkpoint.dir == "/mnt/ckpt/trillion"
    assert spec.checkpoint.marker is None
    assert spec.control.webhook is not None
    assert spec.control.webhook.url == "http://launcher:8080/control"
    assert spec.control.command is None
    assert spec.hang_timeout is None
    assert spec.min_replicas == 1


def test_the_seed_job_file_is_a_whole_job():
    """The file users copy (training.ai/v1, four fields): every other field has a default."""
    job = load_job(ROOT / "deploy" / "jobs" / "minimal.yaml")
    assert job.api_version == "training.ai/v1"
    assert job.name == "trillion-model"
    spec = job.spec
    assert (spec.replicas, spec.checkpoint_interval, spec.max_failures,
            spec.recovery_strategy) == (128, 900.0, 40, "elastic")
    assert spec.nodes is None
    assert spec.nodes_from_progress
    assert spec.node_selector is None
    assert spec.node_names is None
    assert spec.spares == []
    assert spec.checkpoint is None
    assert spec.checkpoint_dir is None
    assert spec.control is None
    assert job_from_json(json.dumps(job_to_dict(job)).encode()) == job


def test_sn_monitor_v1_stays_an_alias():
    assert load_job(JOBS / "trillion.yaml").api_version == "sn-monitor/v1"
    text = (MINIMAL % "aliased").replace("sn-monitor/v1", "training.ai/v1")
    assert parse_job(parse_yaml(text, "a.yaml")).api_version == "training.ai/v1"


def test_kubernetes_control_without_the_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if not installed
    text = (MINIMAL % "k8s").replace(
        "  control: {command: [/usr/local/bin/job-control, --job, x]}\n",
        "  control:\n    kubernetes: {namespace: ml, selector: {app: x}}\n")
    with pytest.raises(ConfigError) as caught:
        parse_job(parse_yaml(text, "k8s.yaml"))
    assert str(caught.value) == (
        "k8s.yaml:9: spec.control.kubernetes: needs the Kubernetes client, which is not "
        "installed: pip install 'sn-monitor[kubernetes]'")


def test_defaults_and_shorthands():
    job = parse_job(parse_yaml(MINIMAL % "small", "small.yaml"))
    assert job.spec.node_names == ["node-1", "node-2"]
    assert job.spec.recovery_strategy == "restart"
    assert job.spec.max_failures == 3
    assert job.spec.checkpoint_interval == 900.0
    assert job.spec.control.command is not None
    assert job.spec.control.command.program == ["/usr/local/bin/job-control", "--job", "x"]


def test_long_forms_and_durations():
    text = (MINIMAL % "long").replace(
        "  control: {command: [/usr/local/bin/job-control, --job, x]}\n",
        "  control:\n    webhook: {url: 'https://launcher/control', secret_file: /etc/key}\n"
        "  checkpointInterval: 15m\n  hangTimeout: 90s\n"
        "  recoveryStrategy: elastic\n  minReplicas: 2\n",
    ).replace("{dir: /ckpt}", "{dir: /ckpt, marker: COMPLETE, keep: 3}")
    job = parse_job(parse_yaml(text, "long.yaml"))
    assert job.spec.checkpoint_interval == 900.0
    assert job.spec.hang_timeout == 90.0
    assert job.spec.checkpoint.marker == "COMPLETE"
    assert job.spec.checkpoint.keep == 3
    assert job.spec.control.webhook is not None
    assert job.spec.control.webhook.secret_file == "/etc/key"


def test_jobs_are_frozen():
    job = load_job(JOBS / "trillion.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.spec.replicas = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("hang", "median", "expected"),
    [(None, None, 120.0), (None, 0.5, 120.0), (None, 30.0, 300.0), ("45s", 30.0, 45.0)],
)
def test_hang_timeout_default_is_max_2m_10_steps(hang, median, expected):
    text = MINIMAL % "hang"
    if hang is not None:
        text += f"  hangTimeout: {hang}\n"
    job = parse_job(parse_yaml(text, "hang.yaml"))
    assert job.spec.effective_hang_timeout(median) == expected


def test_load_jobs_reads_a_directory(tmp_path):
    (tmp_path / "b.yaml").write_text(MINIMAL % "job-b")
    (tmp_path / "a.yml").write_text(MINIMAL % "job-a")
    (tmp_path / "notes.txt").write_text("not a job")
    jobs = load_jobs(tmp_path)
    assert list(jobs) == ["job-a", "job-b"]
    assert all(isinstance(job, DistributedJob) for job in jobs.values())


def test_duplicate_job_names_name_both_files(tmp_path):
    (tmp_path / "one.yaml").write_text(MINIMAL % "same")
    (tmp_path / "two.yaml").write_text(MINIMAL % "same")
    with pytest.raises(ConfigError) as caught:
        load_jobs(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'two.yaml'}:3: metadata.name: duplicate job name 'same' "
        f"(also in {tmp_path / 'one.yaml'})"
    )


def test_a_bad_file_in_the_directory_is_named(tmp_path):
    (tmp_path / "ok.yaml").write_text(MINIMAL % "ok")
    (tmp_path / "bad.yaml").write_text((MINIMAL % "bad").replace("replicas: 2", "replicas: x"))
    with pytest.raises(ConfigError, match=r"bad.yaml:5: spec.replicas: expected an integer"):
        load_jobs(tmp_path)


def test_missing_jobs_directory(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        load_jobs(tmp_path / "nope")


def test_json_round_trip():
    job = load_job(JOBS / "trillion.yaml")
    body = json.dumps(job_to_dict(job)).encode()
    assert job_from_json(body) == job


def test_api_body_may_be_yaml():
    assert job_from_json((MINIMAL % "from-yaml").encode()).name == "from-yaml"


def _body(**spec_changes):
    job = job_to_dict(load_job(JOBS / "trillion.yaml"))
    job["spec"].update(spec_changes)
    return json.dumps(job).encode()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_body(replicas=0), "spec.replicas: must be at least 1, got 0"),
        (_body(recoveryStrategy="retry"),
         "spec.recoveryStrategy: must be one of elastic, restart, manual; got 'retry'"),
        (_body(nodes=["a", 3]), "spec.nodes[1]: expected a node name, got 3"),
        (_body(checkpoint={"dir": "/c", "markr": "X"}),
         "spec.checkpoint.markr: unknown key; did you mean marker? "
         "(known keys: dir, keep, marker)"),
        (b'{"apiVersion": "sn-monitor/v1", "apiVersion": "x"}', "apiVersion: duplicate key"),
        (b'{"apiVersion": ', "invalid JSON: Expecting value (line 1, column 16)"),
        (b"", "the body is empty: send a DistributedJob"),
        (b"\xff\xfe", "the body is not UTF-8 text"),
        (b"[1, 2]", "expected a mapping, got a list"),
    ],
)
def test_api_errors_name_the_key_without_a_line(body, message):
    with pytest.raises(JobSpecError) as caught:
        job_from_json(body)
    assert str(caught.value) == message
    assert caught.value.line is None
