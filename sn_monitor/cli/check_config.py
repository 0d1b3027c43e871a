"""``sn-monitor check-config``: validate config files of every kind, told apart by content.

Other tools' files (Kubernetes manifests, Prometheus and Alertmanager configurations) are
recognised by :mod:`sn_monitor.foreign_config` before any is read as sn-monitor's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from sn_monitor.agent.settings import agent_settings_from
from sn_monitor.cli.exit_status import EXIT_CONFIG
from sn_monitor.cli.options import Commands
from sn_monitor.config import ConfigError, Document, bind, load_yaml


def add_parser(commands: Commands) -> None:
    """``check-config FILE...``."""
    check = commands.add_parser("check-config", help="validate config files (agent, controller, "
                                "rule, job, scenario, token, fleet, XID catalogue, job-log "
                                "signatures); exit 2 on any error",
                                description=_check_config_description(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("files", nargs="+", type=Path, metavar="FILE",
                       help="YAML files of any of the kinds above, mixed")
    check.set_defaults(func=run_check_config)


def run_check_config(args: argparse.Namespace) -> int:
    """Validate the files named on the command line."""
    return check_config(args.files)


#: Keys only a controller config has: how check-config tells the two apart
#: (``remediation`` is in both: the agent's carries out rungs, the controller's climbs).
_CONTROLLER_KEYS = frozenset({"state_dir", "rules", "token_file", "max_body_bytes",
                              "sweep_interval", "policy", "runner", "drivers", "routes",
                              "jobs", "recovery", "settle", "tls", "store", "ha",
                              "xid_catalog"})
_AGENT_KEYS = frozenset({"node", "labels", "labels_from_node", "interval", "controller",
                         "paths", "collectors", "guard"})


def _check_config_description() -> str:
    """``check-config --help``: the kinds of file, told apart as :func:`check_file` does."""
    import textwrap

    def keys(names: frozenset[str]) -> str:
        return textwrap.fill(", ".join(sorted(names)), width=78, initial_indent=" " * 20,
                             subsequent_indent=" " * 20)

    return (
        "Validate each FILE and print 'FILE: ok (kind)', or each error as\n"
        "'FILE:LINE: KEY: what is wrong'. Exit 2 if any file has an error.\n\n"
        "The kind of each file is told from its content, in this order:\n"
        "  scenario file     a mapping with kind: Scenario\n"
        "  XID catalogue     kind: XidCatalog, or an entries: list without a kind\n"
        "  log signatures    kind: JobLogSignatures, or a signatures: list without a kind\n"
        "  job file          kind: DistributedJob\n"
        "  token file        a list whose items have token, token_file or role\n"
        "  rule file         any other list (of rules)\n"
        "  fleet config      a mapping with supernodes:\n"
        "  controller config a mapping with one of the keys only a controller has:\n"
        f"{keys(_CONTROLLER_KEYS)}\n"
        "                    and none of those only an agent has:\n"
        f"{keys(_AGENT_KEYS)}\n"
        "  agent config      any other mapping (an empty file included)\n\n"
        "Other tools' files are told apart first and not read as sn-monitor's:\n"
        "Kubernetes manifests (apiVersion and kind; named and skipped), Prometheus\n"
        "configurations and rule files (checked with promtool), Alertmanager\n"
        "configurations (checked with amtool), Vector and Filebeat configurations\n"
        "(vector validate, filebeat test config) where those tools are on PATH, and\n"
        "Elasticsearch index templates (named and skipped).\n"
        "What a file names that is not on this machine (a token file, a rules\n"
        "directory, the Kubernetes client) is a note, not an error: the daemon\n"
        "that reads the file refuses to start without it.\n\n"
        "Example: sn-monitor check-config /etc/sn-monitor/*.yaml "
        "/etc/sn-monitor/rules/*.yaml")


def check_file(path: Path, notes: list[str] | None = None) -> str:
    """Validate one config file of any kind; return what it was. Raises ConfigError.

    An XID catalogue is told by its ``kind: XidCatalog``, or by an ``entries:`` list
    where the kind was left out (so that the error says the kind is missing). What the
    file names that is not on this machine (a token file, a rules directory) is not
    checked: said in ``notes``.
    """
    from sn_monitor.controller.security.auth import check_token_file
    from sn_monitor.controller.settings import ControllerSettings, check_rules
    from sn_monitor.rules.spec import load_rules

    notes = notes if notes is not None else []
    doc = load_yaml(path)
    if isinstance(doc.data, dict) and doc.data.get("kind") == "Scenario":
        from sn_monitor.sim.scenario import parse_scenario

        parse_scenario(doc)
        return "scenario file"
    catalogue = _check_catalogue(doc)
    if catalogue is not None:
        return catalogue
    if isinstance(doc.data, dict) and doc.data.get("kind") == "DistributedJob":
        from sn_monitor.controller.jobs.spec import parse_job

        parse_job(doc)
        return "job file"
    if isinstance(doc.data, list):
        if any(isinstance(item, dict) and ({"token", "token_file", "role"} & item.keys())
               for item in doc.data):
            notes.extend(f"token_file {name} is not on this machine: not checked"
                         for name in check_token_file(path))
            return "token file"
        load_rules([path])
        return "rule file"
    if isinstance(doc.data, dict) and "supernodes" in doc.data:
        from sn_monitor.fleet.settings import FleetSettings

        bind(FleetSettings, doc)
        return "fleet config"
    if isinstance(doc.data, dict) and _is_controller_config(doc.data):
        notes.extend(check_rules(bind(ControllerSettings, doc), doc))
        return "controller config"
    agent_settings_from(doc)
    return "agent config"


def _check_catalogue(doc: Document) -> str | None:
    """An XID catalogue or a job-log signature catalogue: checked, its kind returned.

    Told by ``kind``, or by its list (``entries:``, ``signatures:``) where the kind was
    left out (so that the error says the kind is missing); None for any other file.
    """
    from sn_monitor.joblog.catalogue import is_signatures_document, parse_catalogue
    from sn_monitor.rules.xid_catalog import is_catalog_document, parse_catalog

    data = doc.data
    if not isinstance(data, dict):
        return None
    if is_catalog_document(data) or ("entries" in data and "kind" not in data):
        parse_catalog(doc)
        return "xid catalog"
    if is_signatures_document(data) or ("signatures" in data and "kind" not in data):
        parse_catalogue(doc)
        return "job-log signatures"
    return None


def _is_controller_config(data: dict[Any, Any]) -> bool:
    """Whether a mapping is a controller config (else it is taken for an agent's).

    A controller-only key and no agent-only key; or a key no agent has that is closest to
    a controller-only key (``sweep_intervall``: the error then suggests ``sweep_interval``,
    not an agent's ``interval``).
    """
    import difflib

    from sn_monitor.agent.settings import AgentSettings

    keys = {key for key in data if isinstance(key, str)}
    if keys & _AGENT_KEYS:
        return False
    if keys & _CONTROLLER_KEYS:
        return True
    agent_keys = {field.name for field in fields(AgentSettings)}
    known = sorted(agent_keys | _CONTROLLER_KEYS)
    return any(set(difflib.get_close_matches(key, known, n=1)) & _CONTROLLER_KEYS
               for key in keys - agent_keys)


def check_config(files: Sequence[Path]) -> int:
    """Validate each file; print every error as ``file:line: key: message``."""
    from sn_monitor.controller.k8s.settings import absent_client_noted
    from sn_monitor.foreign_config import check, recognise

    failed = False
    for path in files:
        found = recognise(path)
        if found is not None:
            verdict = check(found)
            if verdict.error is not None:
                print(f"{path}: {verdict.summary}: {verdict.error}", file=sys.stderr)
                failed = True
            else:
                print(f"{path}: {'ok' if verdict.checked else 'skipped'} ({verdict.summary})")
            continue
        notes: list[str] = []
        try:
            with absent_client_noted(notes):
                kind = check_file(path, notes)
        except ConfigError as err:
            print(err, file=sys.stderr)
            failed = True
        else:
            print(f"{path}: ok ({kind})")
            for note in notes:
                print(f"{path}: note: {note}")
    return EXIT_CONFIG if failed else 0
