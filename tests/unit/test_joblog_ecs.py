"""ECS documents of findings and raw lines, checked against ECS 9.4.0's field types.

The findings are recognised from the public corpus (tests/fixtures/joblogs/corpus/: real
log lines from public reports, failures of every category and benign lines); every
document, of a finding or of a raw line, and every document the writer puts in its file,
is checked field by field against tests/fixtures/ecs/fields.yaml (the types ECS
publishes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError, bind, parse_yaml
from sn_monitor.joblog.ecs import (
    ECS_VERSION,
    EVENT_CLASS,
    EcsOutput,
    LineSource,
    finding_document,
    iso_time,
    json_line,
    line_document,
)
from sn_monitor.joblog.ecs_options import EcsOutputOptions
from sn_monitor.joblog.model import CATEGORIES, Finding
from sn_monitor.joblog.recognition import Recognizer, recognise_lines
from tests.support.ecs_fields import FIELDS, TYPES, document_errors, flatten

RECOGNIZER = Recognizer()
READ_AT = 1_765_000_000.25
CORPUS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "joblogs" / "corpus")
                .glob("*.yaml"))
ENTRIES = [entry for path in CORPUS for entry in yaml.safe_load(path.read_text())]
#: Every line of the corpus, failures and benign lines (progress, warnings) alike.
LINES = [str(entry["text"]) for entry in ENTRIES]
TRACEBACK = ["Traceback (most recent call last):", '  File "/job/train.py", line 61, in main',
             "    batch = shard[index]", "IndexError: list index out of range"]
POD = LineSource(node="gpu-node-07", job="llama-70b", orchestrator="kubernetes",
                 pod="llama-70b-worker-3", namespace="training", container="pytorch",
                 stream="stderr")


def real_findings() -> list[Finding]:
    """The findings in the corpus's lines, each read alone, and a traceback's app-bug."""
    found = [f for line in LINES
             for f in recognise_lines(RECOGNIZER, "logs/rank3.log", [line], year=2025)]
    return found + recognise_lines(RECOGNIZER, "logs/rank1.log", TRACEBACK, year=2025)


FINDINGS = real_findings()


def test_the_corpus_gives_findings_of_every_category() -> None:
    assert len(CORPUS) > 1
    assert {f.category for f in FINDINGS} == set(CATEGORIES)


@pytest.mark.parametrize("finding", FINDINGS, ids=lambda f: f"{f.category}-{f.signature}")
def test_a_finding_document_has_only_ecs_fields_of_their_types(finding: Finding) -> None:
    doc = json.loads(json_line(finding_document(finding, POD, read_at=READ_AT)))
    assert document_errors(doc) == []
    assert doc["event"]["kind"] == "alert"
    assert doc["message"] == finding.text
    assert doc["log"]["level"] == finding.severity
    assert doc["rule"]["name"] == finding.signature
    assert doc["sn_monitor"]["category"] == finding.category
    assert doc["sn_monitor"]["root_candidate"] is finding.root_candidate
    assert doc["sn_monitor"]["line"] == finding.line


def test_a_finding_document_carries_its_context() -> None:
    line = ("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, "
            "NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 "
            "milliseconds before timing out.")  # hiyouga/LlamaFactory#7396
    (finding,) = recognise_lines(RECOGNIZER, "logs/rank0.log", [line], year=2025)
    doc = finding_document(finding, POD, read_at=READ_AT)
    fields = dict(flatten(doc))
    assert fields["@timestamp"] == "2025-03-21T02:07:08.408Z"  # the line's own time
    assert fields["event.created"] == iso_time(READ_AT) == "2025-12-06T05:46:40.250Z"
    assert fields["ecs.version"] == ECS_VERSION
    assert fields["log.origin.file.name"] == "ProcessGroupNCCL.cpp"
    assert fields["log.origin.file.line"] == 607
    assert fields["event.category"] == ["network", "process"]
    assert fields["event.type"] == ["info"]
    assert fields["host.name"] == "gpu-node-07"
    assert fields["orchestrator.resource.name"] == "llama-70b-worker-3"
    assert fields["orchestrator.resource.type"] == "pod"
    assert fields["orchestrator.namespace"] == "training"
    assert fields["container.name"] == "pytorch"
    assert fields["sn_monitor.job"] == "llama-70b"
    assert fields["sn_monitor.rank"] == 0
    assert "1580" in fields["sn_monitor.params"].values()  # the collective's sequence number


def test_a_line_without_a_time_is_stamped_when_it_was_read() -> None:
    finding = Finding(file="x.log", line=3, category="segfault", severity="critical",
                      root_candidate=True, rank=None, node="n2", text="Segmentation fault")
    doc = finding_document(finding, LineSource(node="agent-node"), read_at=READ_AT)
    assert doc["@timestamp"] == doc["event"]["created"] == iso_time(READ_AT)
    assert doc["host"] == {"name": "n2"}  # the finding's own node wins over the agent's
    assert "rank" not in doc["sn_monitor"]
    assert "orchestrator" not in doc
    assert document_errors(doc) == []


def test_a_raw_line_is_an_event_without_finding_fields() -> None:
    for text in LINES:
        doc = json.loads(json_line(line_document(text, "/var/log/containers/x.log", POD,
                                                 read_at=READ_AT, logged_at=READ_AT - 1,
                                                 rank=5)))
        assert document_errors(doc) == [], text
        assert doc["message"] == text
        assert doc["event"]["kind"] == "event"
        assert doc["@timestamp"] == iso_time(READ_AT - 1)
        assert {"category", "root_candidate", "params", "line"}.isdisjoint(doc["sn_monitor"])
        assert "level" not in doc["log"]
        assert "rule" not in doc
        assert doc["sn_monitor"]["rank"] == 5


def test_the_check_rejects_what_ecs_would_not_index() -> None:
    """The check itself: an unknown field, a wrong type, a value ECS does not allow."""
    finding = FINDINGS[0]
    doc: dict[str, Any] = finding_document(finding, POD, read_at=READ_AT)
    doc["sn_monitor"]["rank"] = "3"
    doc["host"]["nodename"] = "x"
    doc["event"]["type"] = ["error"]
    doc["ranks"] = 1
    assert {e.split(":")[0] for e in document_errors(doc)} == {
        "event.type", "host.nodename", "ranks", "sn_monitor.rank"}


def test_every_category_has_event_classes_ecs_expects() -> None:
    expected = FIELDS["event.category"]
    assert set(EVENT_CLASS) == set(CATEGORIES)
    for categories, types in EVENT_CLASS.values():
        assert all(t in expected[c] for c in categories for t in types)


def test_the_fixture_names_only_types_the_check_knows() -> None:
    known = {"keyword", "constant_keyword", "match_only_text", "date", "long", "boolean",
             "flattened"}
    assert {spec["type"] for spec in TYPES.values()} <= known
    assert all(name.startswith("sn_monitor.") for name in FIELDS["custom"])
    assert not any(name.startswith("sn_monitor.") for name in FIELDS["ecs"])


def test_every_document_the_writer_writes_is_ecs(tmp_path: Path) -> None:
    options = EcsOutputOptions(path=str(tmp_path / "joblog.ndjson"), raw_lines=True)
    output = EcsOutput(options, POD, ManualClock(start=READ_AT))
    for finding in FINDINGS:
        assert output.finding(finding)
    for text in [*LINES, *TRACEBACK]:
        assert output.line(text, "logs/rank1.log", rank=1)
    assert output.flush() == len(FINDINGS) + len(LINES) + len(TRACEBACK)
    lines = (tmp_path / "joblog.ndjson").read_text().splitlines()
    docs = [json.loads(line) for line in lines]
    assert len(docs) == output.counts.written
    assert [e for doc in docs for e in document_errors(doc)] == []
    assert [d["event"]["kind"] for d in docs].count("alert") == len(FINDINGS)


def test_raw_lines_are_written_only_when_asked(tmp_path: Path) -> None:
    output = EcsOutput(EcsOutputOptions(path=str(tmp_path / "out")), POD, ManualClock())
    assert not output.line("step 1 loss=2.3", "x.log")
    assert output.flush() == 0
    assert not (tmp_path / "out").exists()


def test_a_line_break_in_a_line_stays_inside_its_document() -> None:
    doc = line_document("a\nb", "x", LineSource(), read_at=READ_AT)
    assert json_line(doc).count(b"\n") == 1


def test_undecodable_bytes_and_other_scripts_stay_valid_json() -> None:
    text = b"loss \xff \xe6\x8d\x9f\xe5\xa4\xb1 nan".decode("utf-8", "surrogateescape")
    line = json_line(line_document(text, "x", LineSource(), read_at=READ_AT))
    assert json.loads(line.decode("utf-8"))["message"] == text
    assert "损失".encode() in line  # non-ASCII text written as itself, not escaped


def test_the_options_bind_from_yaml_with_their_line() -> None:
    text = "path: /var/log/sn-monitor/joblog.ndjson\nraw_lines: true\nkeep: -1\n"
    with pytest.raises(ConfigError) as err:
        bind(EcsOutputOptions, parse_yaml(text, "agent.yaml"))
    assert (err.value.key, err.value.line) == ("keep", 3)
    options = bind(EcsOutputOptions, parse_yaml("path: /tmp/x.ndjson\n", "agent.yaml"))
    assert (options.raw_lines, options.max_bytes, options.keep) == (False, 64 << 20, 5)
