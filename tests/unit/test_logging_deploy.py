"""deploy/logging/: the Vector pipeline, the Filebeat input and the index template, checked here.

No Vector, Filebeat, Elasticsearch or Loki runs on this machine, so these tests check what
can be checked without them: each file parses; every option used is one the tool's
reference documents for that component (the lists below, with where they were read);
the components connect; the Loki labels are few and bounded, computed from the remap's
own lines over real documents; the index template maps every field we write with its
ECS type (tests/fixtures/ecs/fields.yaml); Vector, Filebeat and the template agree on
the files read and the data stream written.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from sn_monitor.clock import ManualClock
from sn_monitor.joblog.ecs import EcsOutput, LineSource
from sn_monitor.joblog.ecs_options import EcsOutputOptions
from sn_monitor.joblog.model import CATEGORIES, SEVERITIES, Finding
from tests.support.ecs_fields import TYPES, flatten

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "logging"
VECTOR = yaml.safe_load((DEPLOY / "vector.yaml").read_text())
FILEBEAT = yaml.safe_load((DEPLOY / "filebeat.yml").read_text())
TEMPLATE = json.loads((DEPLOY / "index-template.json").read_text())

#: Vector 0.57.0's options per component, from github.com/vectordotdev/vector at tag
#: v0.57.0, website/cue/reference/components/{sources,transforms,sinks}/generated/*.cue
#: (only the components we use), plus the options every component of its kind has.
VECTOR_OPTIONS: dict[str, set[str]] = {
    "file": {"acknowledgements", "data_dir", "encoding", "exclude", "file_key", "fingerprint",
             "glob_minimum_cooldown_ms", "host_key", "ignore_checkpoints", "ignore_not_found",
             "ignore_older_secs", "include", "internal_metrics", "line_delimiter",
             "max_line_bytes", "max_read_bytes", "multiline", "offset_key", "oldest_first",
             "read_from", "remove_after_secs", "rotate_wait_secs"},
    "remap": {"drop_on_abort", "drop_on_error", "file", "files", "metric_tag_values",
              "reroute_dropped", "source", "timezone"},
    "loki": {"acknowledgements", "auth", "batch", "compression",
             "dangerously_allow_unconfined_template_resolution", "encoding", "endpoint",
             "labels", "out_of_order_action", "path", "remove_label_fields",
             "remove_structured_metadata_fields", "remove_timestamp", "request",
             "structured_metadata", "tenant_id", "tls"},
    "elasticsearch": {"acknowledgements", "api_version", "auth", "aws", "batch", "bulk",
                      "compression", "dangerously_allow_unconfined_template_resolution",
                      "data_stream", "distribution", "doc_type", "encoding", "endpoint",
                      "endpoints", "id_key", "metrics", "mode", "opensearch_service_type",
                      "pipeline", "query", "request", "request_retry_partial",
                      "suppress_type_name", "tls"},
}
VECTOR_COMMON = {"sources": {"type"}, "transforms": {"type", "inputs"},
                 "sinks": {"type", "inputs", "buffer", "healthcheck", "proxy"}}
#: The same files' nested options and enumerations we rely on.
VECTOR_NESTED = {
    ("elasticsearch", "data_stream"): {"auto_routing", "dataset", "namespace", "sync_fields",
                                       "type"},
    ("elasticsearch", "auth"): {"access_key_id", "assume_role", "credentials_file",
                                "external_id", "imds", "load_timeout_secs", "password",
                                "profile", "region", "secret_access_key", "session_name",
                                "session_token", "strategy", "user"},
    ("loki", "encoding"): {"codec", "except_fields", "only_fields", "timestamp_format", "json"},
}
VECTOR_ENUMS = {
    ("file", "read_from"): {"beginning", "end"},
    ("elasticsearch", "mode"): {"bulk", "data_stream"},
    ("loki", "out_of_order_action"): {"accept", "drop", "rewrite_timestamp"},
}
#: Vector's buffer options (docs: vector.dev/docs/reference/configuration/sinks, buffer).
BUFFER_OPTIONS = {"type", "max_events", "max_size", "when_full"}
#: Fields too many-valued to be Loki labels: one stream per value would follow.
HIGH_CARDINALITY = ("rank", "pod", "resource", "line", "message", "params", "signature",
                    "rule", "path", "timestamp", "created")
#: Filebeat's ndjson parser options: libbeat/reader/readjson/json_config.go (Config and
#: ParserConfig) in github.com/elastic/beats.
NDJSON_OPTIONS = {"message_key", "document_id", "keys_under_root", "overwrite_keys",
                  "add_error_key", "ignore_decoding_error", "expand_keys", "field", "target"}
#: A composable index template's body (Elasticsearch's "create or update index template" API).
TEMPLATE_KEYS = {"index_patterns", "composed_of", "template", "data_stream", "priority",
                 "version", "_meta", "allow_auto_create", "ignore_missing_component_templates",
                 "deprecated"}
#: Elasticsearch's built-in ``logs`` template matches ``logs-*-*`` at priority 100.
BUILT_IN_LOGS_PRIORITY = 100


def components() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for kind in ("sources", "transforms", "sinks"):
        for name, body in VECTOR.get(kind, {}).items():
            yield kind, name, body


def test_vector_uses_only_documented_options() -> None:
    assert set(VECTOR) <= {"data_dir", "sources", "transforms", "sinks"}
    for kind, name, body in components():
        allowed = VECTOR_OPTIONS[body["type"]] | VECTOR_COMMON[kind]
        assert set(body) <= allowed, (name, set(body) - allowed)
        for (type_, option), values in VECTOR_ENUMS.items():
            if body["type"] == type_ and option in body:
                assert body[option] in values, (name, option)
        for (type_, option), options in VECTOR_NESTED.items():
            if body["type"] == type_ and option in body:
                assert set(body[option]) <= options, (name, option)
        if "buffer" in body:
            assert set(body["buffer"]) <= BUFFER_OPTIONS
            assert body["buffer"]["when_full"] == "block"  # bounded, and nothing lost


def test_vector_components_connect() -> None:
    producers = {name for kind, name, _ in components() if kind != "sinks"}
    consumed: set[str] = set()
    for kind, name, body in components():
        if kind != "sources":
            assert body["inputs"], name
            assert set(body["inputs"]) <= producers, name
            consumed.update(body["inputs"])
    assert consumed == producers  # nothing read is left unused
    assert {b["type"] for k, _, b in components() if k == "sinks"} == {"loki", "elasticsearch"}


def remap_source() -> str:
    (remap,) = (b for _, _, b in components() if b["type"] == "remap")
    source: str = remap["source"]
    return source


_META_LINE = re.compile(r'^%(?P<name>\w+) = string\(\.(?P<path>[\w.]+)\) '
                        r'\?\? "(?P<default>[^"]*)"$')


def label_rules() -> dict[str, tuple[str, str]]:
    """The remap's ``%name = string(.path) ?? "default"`` lines: name -> (path, default)."""
    rules = {}
    for line in remap_source().splitlines():
        found = _META_LINE.match(line.strip())
        if found:
            rules[found["name"]] = (found["path"], found["default"])
    return rules


def loki_labels() -> dict[str, str]:
    (loki,) = (b for _, _, b in components() if b["type"] == "loki")
    labels: dict[str, str] = loki["labels"]
    return labels


def test_loki_labels_are_few_and_never_high_cardinality_fields() -> None:
    labels = loki_labels()
    assert set(labels) == {"source", "node", "job", "kind", "category", "level"}
    rules = label_rules()
    for name, value in labels.items():
        used = re.findall(r"\{\{\s*%(\w+)\s*\}\}", value)
        assert all(metadata in rules for metadata in used), name
        paths = [rules[m][0] for m in used]
        assert not any(word in path.split(".") for path in paths for word in HIGH_CARDINALITY)
    assert {path for path, _ in rules.values()} <= set(TYPES)  # fields we really write


def test_vector_reads_fields_the_documents_have() -> None:
    source = remap_source()
    assert 'parse_json!(string!(.message))' in source
    assert '."@timestamp"' in source
    assert "@timestamp" in TYPES


def render_labels(doc: Mapping[str, Any]) -> dict[str, str]:
    """The Loki labels the remap and the sink give ``doc``, read from their own lines."""
    fields = dict(flatten(doc))
    meta = {name: str(fields[path]) if isinstance(fields.get(path), str) else default
            for name, (path, default) in label_rules().items()}
    return {label: re.sub(r"\{\{\s*%(\w+)\s*\}\}", lambda m: meta[m[1]], value)
            for label, value in loki_labels().items()}


def written_documents(tmp_path: Path) -> list[dict[str, Any]]:
    output = EcsOutput(EcsOutputOptions(path=str(tmp_path / "j.ndjson"), raw_lines=True),
                       LineSource(node="gpu-node-07", job="llama-70b"), ManualClock())
    for number, category in enumerate(CATEGORIES):
        output.finding(Finding(file=f"rank{number}.log", line=number + 1, category=category,
                               severity=SEVERITIES[number % 4], root_candidate=True,
                               rank=number, node=f"gpu-node-{number:02d}", text="x"))
    output.line("step 1 loss=2.3", "rank0.log", rank=0)
    output.flush()
    return [json.loads(t) for t in (tmp_path / "j.ndjson").read_text().splitlines()]


def test_loki_label_values_are_bounded_sets(tmp_path: Path) -> None:
    labels = [render_labels(doc) for doc in written_documents(tmp_path)]
    assert {tuple(sorted(x)) for x in labels} == {tuple(sorted(loki_labels()))}
    assert {x["category"] for x in labels} <= {*CATEGORIES, "none"}
    assert {x["level"] for x in labels} <= {*SEVERITIES, "none"}
    assert {x["kind"] for x in labels} == {"alert", "event"}
    assert {x["job"] for x in labels} == {"llama-70b"}
    raw = labels[-1]
    assert (raw["category"], raw["level"], raw["node"]) == ("none", "none", "gpu-node-07")


def test_the_remap_program_runs_on_written_documents(tmp_path: Path) -> None:
    """The remap's VRL compiled and run by pyvrl (VRL in Python: ``pip install pyvrl``).

    Skipped where pyvrl is not installed. It checks the program compiles, gives back each
    document as written with ``@timestamp`` as the event's time, sets the labels the
    Python reading above computes, and fails on a torn line (Vector then drops it).
    """
    pyvrl = pytest.importorskip("pyvrl")
    program = pyvrl.Transform(remap_source() + '\n{"event": ., "meta": %}\n')
    for doc in written_documents(tmp_path):
        result = program.remap({"message": json.dumps(doc), "file": "j.ndjson"})
        event, stamp = dict(result["event"]), result["event"]["timestamp"]
        assert stamp == datetime.datetime.fromisoformat(doc["@timestamp"])
        del event["timestamp"]
        assert event == {k: v for k, v in doc.items() if k != "@timestamp"}
        assert {f"{{{{ %{k} }}}}": v for k, v in result["meta"].items()} == {
            value: render_labels(doc)[label] for label, value in loki_labels().items()
            if value.startswith("{{")}
    with pytest.raises(ValueError, match="parse_json"):
        pyvrl.Transform(remap_source()).remap({"message": '{"torn'})


def template_fields(properties: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    for name, spec in properties.items():
        if "properties" in spec:
            yield from template_fields(spec["properties"], f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", spec["type"]


def test_index_template_maps_every_field_with_its_ecs_type() -> None:
    assert set(TEMPLATE) <= TEMPLATE_KEYS
    mapped = dict(template_fields(TEMPLATE["template"]["mappings"]["properties"]))
    assert mapped == {name: spec["type"] for name, spec in TYPES.items()}


def test_index_template_takes_the_data_stream_from_the_built_in_logs_template() -> None:
    assert TEMPLATE["data_stream"] == {}
    assert TEMPLATE["priority"] > BUILT_IN_LOGS_PRIORITY
    (es,) = (b for _, _, b in components() if b["type"] == "elasticsearch")
    stream = "{type}-{dataset}-{namespace}".format(**es["data_stream"])
    targets = {stream, FILEBEAT["output.elasticsearch"]["index"]}
    assert targets == {"logs-sn_monitor.joblog-default"}
    assert all(any(fnmatch.fnmatchcase(t, p) for p in TEMPLATE["index_patterns"])
               for t in targets)


def test_every_written_field_is_mapped(tmp_path: Path) -> None:
    mapped = dict(template_fields(TEMPLATE["template"]["mappings"]["properties"]))
    for doc in written_documents(tmp_path):
        assert {name for name, _ in flatten(doc)} <= set(mapped)


def test_filebeat_reads_the_agent_files_into_the_data_stream() -> None:
    (source,) = (b for _, _, b in components() if b["type"] == "file")
    (stream,) = FILEBEAT["filebeat.inputs"]
    assert stream["type"] == "filestream"
    assert stream["id"]
    assert stream["paths"] == source["include"]
    (parser,) = stream["parsers"]
    assert set(parser["ndjson"]) <= NDJSON_OPTIONS
    assert parser["ndjson"]["target"] == ""  # the document's fields at the root
    assert parser["ndjson"]["overwrite_keys"] is True
    assert FILEBEAT["setup.template.enabled"] is False  # index-template.json owns the mapping


@pytest.mark.parametrize("name", ["vector.yaml", "filebeat.yml", "index-template.json"])
def test_the_readme_names_each_file(name: str) -> None:
    assert f"`{name}`" in (DEPLOY / "README.md").read_text()
