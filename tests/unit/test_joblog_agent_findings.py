"""The agent's job-log reading, recognised: findings as ``log`` events, counters on /metrics.

The real torchrun failures (tests/fixtures/joblogs/torchrun/<mode>: every rank's
stdout/stderr in torchrun's ``--log-dir`` layout, and torchrun's console) are copied
into a directory the agent's ``job_logs`` follows, as a job writes them; one poll of the
reader (on this thread, a manual clock) reads and recognises them. The events must carry
what the controller's triage orders by (category, rank, root candidate, file, line), and
be valid on the wire; the snapshot's counters must reach /metrics.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest
import yaml

from sn_monitor.agent.joblog_series import job_log_families
from sn_monitor.agent.joblogs.build import build_reader
from sn_monitor.agent.joblogs.collector import JobLogCollector
from sn_monitor.agent.joblogs.findings import LogRecognition
from sn_monitor.agent.joblogs.lines import LineContext, LogLine
from sn_monitor.agent.registry import build_collectors
from sn_monitor.agent.report import event_record
from sn_monitor.agent.settings import AgentSettings, agent_settings_from
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.clock import ManualClock
from sn_monitor.config import Duration, parse_yaml
from sn_monitor.joblog.ecs import EcsOutput, LineSource
from sn_monitor.joblog.ecs_options import EcsOutputOptions
from sn_monitor.joblog.recognition import Recognizer
from sn_monitor.joblog.template_settings import TemplateSettings
from sn_monitor.model import EventRecord
from tests.support.ecs_fields import document_errors

TORCHRUN = Path(__file__).parents[1] / "fixtures" / "joblogs" / "torchrun"
RECOGNIZER = Recognizer()
NODE = "gpu-node-3"


def settings_for(directory: Path) -> AgentSettings:
    doc = {"node": NODE, "state_dir": str(directory / "state"), "job_logs": {
        "enabled": True, "from_start": False,
        "files": [{"glob": str(directory / "logs" / "*" / "attempt_*" / "*" / "*.log"),
                   "job": "llm"},
                  {"glob": str(directory / "torchrun.log"), "job": "llm"}]}}
    return agent_settings_from(parse_yaml(yaml.safe_dump(doc), "agent.yaml"))


def replay(mode: str, directory: Path, clock: ManualClock
           ) -> tuple[JobLogCollector, LogRecognition]:
    """The mode's logs written after the agent started following (new files: from start),
    read and recognised by one poll once the glob is expanded again."""
    settings = settings_for(directory)
    recognition = LogRecognition(RECOGNIZER, NODE, clock)
    reader = build_reader(settings.job_logs, clock, directory / "state", recognition.consume)
    reader.poll_once()  # the first scan: nothing there yet
    shutil.copytree(TORCHRUN / mode / "logs", directory / "logs")
    shutil.copy(TORCHRUN / mode / "torchrun.log", directory / "torchrun.log")
    clock.advance(float(settings.job_logs.rescan_interval) + 1.0)
    reader.poll_once()
    return JobLogCollector(reader, recognition), recognition


@pytest.mark.parametrize("mode", ["kill", "exception", "oom", "nan"])
def test_the_first_failing_ranks_finding_becomes_a_log_event(mode: str, tmp_path: Path) -> None:
    clock = ManualClock(1_765_000_000.0)
    _, recognition = replay(mode, tmp_path, clock)
    want = yaml.safe_load((TORCHRUN / mode / "expected.yaml").read_text())
    events = recognition.drain(1000)
    assert events
    assert all(e.kind == "log" and e.source == "joblog" for e in events)
    roots = [e.finding for e in events if e.finding is not None and e.finding.root_candidate
             and e.finding.category == want["category"]]
    assert any(f.rank == want["root_rank"] for f in roots), [
        (e.finding.category, e.finding.rank) for e in events if e.finding]
    assert all(f.job == "llm" and f.line >= 1 and f.file.startswith(str(tmp_path))
               for f in roots)


def test_a_log_event_is_valid_on_the_wire_with_its_finding(tmp_path: Path) -> None:
    clock = ManualClock(1_765_000_000.0)
    _, recognition = replay("kill", tmp_path, clock)
    events = recognition.drain(1000)
    decoder = msgspec.json.Decoder(EventRecord)
    for number, event in enumerate(events, 1):
        record = decoder.decode(msgspec.json.encode(event_record(event, number)))
        assert event.finding is not None
        assert (record.category, record.rank, record.root_candidate, record.line,
                record.job) == (event.finding.category, event.finding.rank,
                                event.finding.root_candidate, event.finding.line, "llm")
        assert record.message == event.message
        assert len(record.params) <= 8


def test_a_traceback_split_across_two_polls_is_one_finding(tmp_path: Path) -> None:
    clock = ManualClock(1_765_000_000.0)
    recognition = LogRecognition(RECOGNIZER, NODE, clock)
    context = LineContext(kind="file", source="file:llm", origin="/job/rank1.log", job="llm")
    lines = ["Traceback (most recent call last):",
             '  File "/job/train.py", line 61, in main', "    batch = shard[index]",
             "IndexError: list index out of range"]
    recognition.consume([LogLine(context, text, read_at=1.0) for text in lines[:2]])
    assert recognition.drain(10) == []
    recognition.consume([LogLine(context, text, read_at=2.0) for text in lines[2:]])
    (event,) = recognition.drain(10)
    assert event.finding is not None
    assert (event.finding.category, event.finding.line) == ("app-bug", 4)
    assert event.time_seconds == 2.0


def test_findings_past_the_bound_drop_the_oldest_and_are_counted() -> None:
    recognition = LogRecognition(RECOGNIZER, NODE, ManualClock(0.0), max_pending=2)
    context = LineContext(kind="file", source="file:llm", origin="/job/rank0.log")
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
           "has a total capacity of 79.11 GiB of which 1.02 GiB is free.")
    recognition.consume([LogLine(context, oom, read_at=float(i)) for i in range(3)])
    assert [e.time_seconds for e in recognition.drain(10)] == [1.0, 2.0]
    found, _, dropped = recognition.counts()
    assert (dict(found), dropped) == ({"cuda-oom": 3}, 1)


def test_the_counters_reach_metrics(tmp_path: Path) -> None:
    clock = ManualClock(1_765_000_000.0)
    collector, _ = replay("kill", tmp_path, clock)
    stats = collector.stats()
    families = {f.name: f for f in job_log_families(
        NodeSnapshot(node=NODE, timestamp_seconds=clock.time(), job_logs=stats))}
    found = dict((labels[0], value) for labels, value in families["sn_agent_log_findings"].samples)
    assert found.get("process-killed", 0) >= 1
    lines = sum(value for _, value in families["sn_agent_log_lines"].samples)
    assert lines == sum(s.lines for s in stats.sources) > 0
    assert list(job_log_families(NodeSnapshot(node=NODE, timestamp_seconds=0.0))) == []


def test_findings_and_template_findings_go_to_the_ecs_output(tmp_path: Path) -> None:
    clock = ManualClock(1_765_000_000.0)
    output = EcsOutput(EcsOutputOptions(path=str(tmp_path / "out" / "findings.jsonl")),
                       LineSource(node=NODE), clock)
    recognition = LogRecognition(
        RECOGNIZER, NODE, clock, output=output,
        templates=TemplateSettings(warmup_lines=3, warmup_seconds=Duration(0.0)))
    context = LineContext(kind="file", source="file:llm", origin="/job/rank0.log", job="llm")
    lines = [f"step {i} loss 2.{i}1 lr 0.0003" for i in range(5)]
    lines.append("[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered")
    recognition.consume([LogLine(context, text, read_at=float(i))
                         for i, text in enumerate(lines)])
    output.flush()
    docs = [json.loads(line) for line in
            (tmp_path / "out" / "findings.jsonl").read_text().splitlines()]
    assert all(document_errors(doc) == [] for doc in docs)
    kinds = [doc["sn_monitor"]["category"] for doc in docs]
    assert "cuda-error" in kinds
    assert "new-template" in kinds
    _, templates, _ = recognition.counts()
    assert dict(templates).get("new-template", 0) >= 1


def test_the_registry_builds_the_job_log_collector_only_when_job_logs_is_on(
        tmp_path: Path) -> None:
    off = {name: {"enabled": False}
           for name in ("nvml", "net", "infiniband", "host", "kmsg", "processes")}
    on_doc = {"node": NODE, "state_dir": str(tmp_path / "state"), "collectors": off,
              "job_logs": {"enabled": True, "files": [
                  {"glob": str(tmp_path / "logs" / "*.log"), "job": "llm"}]}}
    built = build_collectors(agent_settings_from(parse_yaml(yaml.safe_dump(on_doc),
                                                            "agent.yaml")),
                             None, ManualClock(0.0))
    assert [c.name for c in built] == ["joblogs"]
    for collector in built:
        collector.close()
    off_doc = {**on_doc, "job_logs": {"enabled": False}}
    assert build_collectors(agent_settings_from(parse_yaml(yaml.safe_dump(off_doc),
                                                           "agent.yaml")),
                            None, ManualClock(0.0)) == []
