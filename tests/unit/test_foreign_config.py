"""check-config tells other tools' files from sn-monitor's, and checks them with their tools."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sn_monitor.cli import main
from sn_monitor.foreign_config import check, recognise

MANIFEST = """\
apiVersion: v1
kind: ServiceAccount
metadata: {name: sn-agent}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: sn-agent}
rules: []
"""
JOB = """\
apiVersion: training.ai/v1
kind: DistributedJob
metadata: {name: llm}
spec: {replicas: 2}
"""
PROMETHEUS = ("global: {scrape_interval: 15s}\nscrape_configs:\n  - job_name: sn\n"
              "    static_configs: [{targets: ['127.0.0.1:9847']}]\n")
BROKEN_PROMETHEUS = "scrape_configs:\n  - job_name: sn\n    scrape_interval: fortnight\n"
ALERTMANAGER = "route: {receiver: page}\nreceivers: [{name: page}]\n"
RULES = "groups:\n  - name: sn\n    rules:\n      - record: x:y:z\n        expr: up\n"
BROKEN_RULES = "groups:\n  - name: sn\n    rules:\n      - record: x:y:z\n        expr: up{\n"


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("name", "text", "kind"), [
    ("rbac.yaml", MANIFEST, "Kubernetes manifest: ServiceAccount, ClusterRole"),
    ("prometheus.yml", PROMETHEUS, "Prometheus configuration"),
    ("alertmanager.yml", ALERTMANAGER, "Alertmanager configuration"),
    ("recording.yml", RULES, "Prometheus rule file"),
    ("sn-agent.service", "[Unit]\nDescription=x\n", "systemd unit"),
    ("vector.yaml", "sources: {f: {type: file}}\nsinks: {l: {type: loki, inputs: [f]}}\n",
     "Vector configuration"),
    ("filebeat.yml", "filebeat.inputs: [{type: filestream, id: x}]\n", "Filebeat configuration"),
    ("template.json", '{"index_patterns": ["logs-x-*"], "data_stream": {}}',
     "Elasticsearch index template"),
])
def test_other_tools_files_are_told_apart(tmp_path: Path, name: str, text: str,
                                          kind: str) -> None:
    found = recognise(_file(tmp_path, name, text))
    assert found is not None
    assert found.kind == kind


@pytest.mark.parametrize("text", [JOB, "node: gpu-1\n", "- name: r\n  event: xid\n", "",
                                  "a: [unclosed\n", "kind: Scenario\napiVersion: v1\n"])
def test_sn_monitor_files_and_broken_yaml_are_left_to_sn_monitor(tmp_path: Path,
                                                                 text: str) -> None:
    assert recognise(_file(tmp_path, "x.yaml", text)) is None


def test_a_manifest_is_skipped_with_what_it_is(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, "rbac.yaml", MANIFEST)
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: skipped (Kubernetes manifest: ServiceAccount, ClusterRole" in out


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_prometheus_files_are_checked_with_promtool(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    good, rules = _file(tmp_path, "p.yml", PROMETHEUS), _file(tmp_path, "r.yml", RULES)
    assert main(["check-config", str(good), str(rules)]) == 0
    out = capsys.readouterr().out
    assert f"{good}: ok (Prometheus configuration, checked with promtool)" in out
    assert f"{rules}: ok (Prometheus rule file, checked with promtool)" in out
    for text, kind in ((BROKEN_PROMETHEUS, "Prometheus configuration"),
                       (BROKEN_RULES, "Prometheus rule file")):
        bad = _file(tmp_path, "bad.yml", text)
        assert main(["check-config", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"{bad}: {kind}: promtool: "), err


def test_a_tool_not_on_path_skips_the_file(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    found = recognise(_file(tmp_path, "a.yml", ALERTMANAGER))
    assert found is not None
    verdict = check(found)
    assert (verdict.error, verdict.checked) == (None, False)
    assert verdict.summary == "Alertmanager configuration: not checked, amtool is not on PATH"
