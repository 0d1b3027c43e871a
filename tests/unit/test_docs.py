"""The documentation site: its generated reference pages cover what the code has.

The pages come from docs/hooks/reference_pages.py, which the MkDocs hook runs as the
site builds (`make docs`; `make lint` builds it --strict, which fails on a broken link).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sn_monitor.cli import build_parser
from sn_monitor.controller.api.openapi import openapi_document

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / "docs" / "hooks"


@pytest.fixture(scope="module")
def pages() -> Iterator[object]:
    sys.path.insert(0, str(HOOKS))
    try:
        import reference_pages
        yield reference_pages
    finally:
        sys.path.remove(str(HOOKS))


def test_every_subcommand_and_its_options_are_on_the_cli_page(pages) -> None:
    text = pages.cli_page()
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(commands.choices) >= 10
    for name, sub in commands.choices.items():
        assert f"## `sn-monitor {name}`" in text
        for action in sub._actions:
            for option in action.option_strings:
                assert option in text, f"sn-monitor {name} {option}"


def test_the_metrics_page_has_every_family_the_agent_and_controller_serve(pages) -> None:
    text = pages.metrics_page()
    for family in ("sn_gpu_temperature_celsius", "sn_gpu_xid_errors_total", "sn_guard_throttled",
                   "sn_infiniband_port_received_bytes_total", "sn_agent_collector_success",
                   "sn_node_state", "sn_rule_firing", "sn_actions_total",
                   "sn_controller_reports_total", "sn_controller_worker_up",
                   "sn_job_effective_training_ratio", "sn_recovery_duration_seconds",
                   "sn_fleet_supernode_up"):
        assert f"| `{family}` |" in text, family
    assert "_created`" not in text  # client_python's creation times are not families


def test_families_keep_their_labels_when_they_have_no_series_yet(pages) -> None:
    by_name = {f.name: f for f in pages.controller_families()}
    assert by_name["sn_actions_total"].labels == ("action", "outcome")
    assert by_name["sn_controller_events_total"].labels == ("kind",)
    assert by_name["sn_recovery_duration_seconds"].labels == ("job",)
    assert by_name["sn_node_state"].type == "gauge"


def test_the_config_page_has_every_key_with_its_default(pages) -> None:
    text = pages.config_page()
    assert "| `guard.throttle_at` | number | `85.0` |" in text
    assert "| `guard.for` | duration | `5s` |" in text  # the YAML name, not the field's
    assert "| `policy.breaker.enabled` | true or false | `true` |" in text
    assert "| `supernodes[].controllers` | list of string | **required** |" in text
    # computed where it runs: said, never this machine's hostname
    assert "| `node` | string | `$NODE_NAME`" in text
    for key in yaml.safe_load((ROOT / "deploy" / "controller.yaml").read_text()):
        assert f"| `{key}` |" in text, key


def test_the_api_page_has_every_operation(pages) -> None:
    text = pages.api_page()
    for path, item in openapi_document()["paths"].items():
        for method in item:
            assert f"## `{method.upper()} {path}`" in text


def test_the_files_page_lists_every_rule_kind_default_rule_and_fault(pages) -> None:
    from sn_monitor.sim.scenario import FAULT_SPECS

    text = pages.files_page()
    for kind in ("threshold", "baseline", "peers", "event", "heartbeat", "alert"):
        assert f"### `{kind}` rules" in text
    for rule in yaml.safe_load((ROOT / "sn_monitor" / "rules" / "default.yaml").read_text()):
        assert f"| `{rule['name']}` |" in text
    for fault in FAULT_SPECS:
        assert f"| `{fault}` |" in text
    assert "| `spec.checkpointInterval` |" in text


def test_a_repository_path_that_is_not_there_is_named() -> None:
    sys.path.insert(0, str(HOOKS))
    try:
        from reference import missing_paths
    finally:
        sys.path.remove(str(HOOKS))
    text = ("`deploy/agent.yaml`, `sn_monitor/sim/`, `deploy/nothing.yaml`, "
            "`rules/prometheus/*.yml`, `bench/results/x.json`, `tests/gone/`")
    assert missing_paths(text) == ["deploy/nothing.yaml", "tests/gone/"]


def test_every_link_of_the_readme_names_a_page_that_exists() -> None:
    import re

    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 10
    for link in links:
        if "://" not in link:
            assert (ROOT / link).is_file(), link


def _quickstart(path: Path, heading: str) -> list[str]:
    """The commands of the first ``sh`` block after ``heading`` (comments left out)."""
    text = path.read_text()
    block = text[text.index(heading):].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.replace("\\\n", " ").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_quickstart_waits_for_its_incident_and_is_the_same_in_both_places() -> None:
    readme = _quickstart(ROOT / "README.md", "## Quickstart")
    site = _quickstart(ROOT / "docs" / "getting-started" / "index.md", "## A controller, an agent")
    assert [" ".join(c.split()) for c in readme] == [" ".join(c.split()) for c in site]
    fault = next(i for i, c in enumerate(readme) if "/sim/fault" in c)
    ask = max(i for i, c in enumerate(readme) if "/api/v1/incidents" in c)
    # the overheat takes about 45 s to open an incident: asking at once answers []
    assert any("sleep" in c and "incidents" in c and "break" in c for c in readme[fault:ask]), \
        "the quickstart asks for the incident without waiting for it"
    # the daemons start in the background: the first requests must wait for them
    assert all("--retry-connrefused" in c for c in readme if "-XPOST" in c)
