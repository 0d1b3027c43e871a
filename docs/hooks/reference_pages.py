"""The reference pages of the site, written from the code that is their truth.

Each function returns one page's Markdown: the command line from the argument parser,
the config keys from the settings dataclasses the one config loader fills, the metric
families from the agent's and the controller's real collectors run on a simulated node,
the API from the controller's OpenAPI document, and the rule, job and scenario files
from their dataclasses and the packaged rules. ``reference.py`` (the MkDocs hook) adds
them to the site as it builds; nothing here is written to the repository, so nothing
can go stale.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import inspect
import json
import re
import tempfile
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from sn_monitor.config import Duration

#: Width of the ``--help`` text on the CLI page (a terminal's, not the reader's).
HELP_WIDTH = 80


# ------------------------------------------------------------------------ helpers


def _cell(text: str) -> str:
    """``text`` fit for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


#: A reST role (``:mod:`x` ``): Markdown has none, the backquoted name stays.
REST_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc):(?=`)")


def _markdown(text: str) -> str:
    """ReST inline markup as Markdown: roles dropped, double backquotes made single."""
    return REST_ROLE.sub("", text).replace("``", "`")


def _doc(obj: object) -> str:
    """An object's docstring as Markdown prose."""
    return _markdown(inspect.getdoc(obj) or "")


# ------------------------------------------------------------------------ the CLI


def cli_page() -> str:
    """Every subcommand: its one-line help in a table, then its whole ``--help``."""
    from sn_monitor.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in commands._choices_actions}
    lines = ["# Command line", "",
             "This page answers: which subcommands does `sn-monitor` have, and what does each "
             "option do? It is generated from the argument parser as the site builds: each "
             "section is the command's own `--help`. Every command exits 2 on a usage or "
             "config error, with a message that says what is wrong (a config error names "
             "the file, the key and the line).", ""]
    lines += _table(["command", "what it does"],
                    ([f"[`sn-monitor {name}`](#sn-monitor-{name})", helps.get(name, "")]
                     for name in commands.choices))
    for name, sub in commands.choices.items():
        formatter = sub.formatter_class
        sub.formatter_class = functools.partial(formatter, width=HELP_WIDTH)
        lines += ["", f"## `sn-monitor {name}` {{#sn-monitor-{name}}}", "",
                  _cell(helps.get(name, "")), "", "```text", sub.format_help().rstrip(),
                  "```"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ settings


def _type_name(tp: Any) -> str:
    """A settings type as a reader says it: ``duration``, ``list of string``, ``a | b``."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        options = [o for o in get_args(tp) if o is not type(None)]
        return " or ".join(_type_name(o) for o in options)
    if origin is Literal:
        values = get_args(tp)
        return f"`{values[0]}`" if len(values) == 1 else \
            "one of " + ", ".join(f"`{v}`" for v in values)
    if origin is list:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        key, value = get_args(tp)
        return f"mapping of {_type_name(key)} to {_type_name(value)}"
    if tp is Duration:
        return "duration"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    names = {str: "string", int: "integer", float: "number", bool: "true or false"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _seconds(value: float) -> str:
    if value >= 3600 and value % 3600 == 0:
        return f"{value / 3600:g}h"
    if value >= 60 and value % 60 == 0:
        return f"{value / 60:g}m"
    return f"{value:g}s"


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif inspect.isfunction(field.default_factory) and \
            field.default_factory.__name__ != "<lambda>":
        # computed where it runs (the hostname): what its docstring says, not this machine's
        return _markdown((inspect.getdoc(field.default_factory) or "").split("\n")[0])
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "**required**"
    if value is None:
        return "unset"
    if dataclasses.is_dataclass(value):
        return "its keys'"
    if isinstance(value, Duration):
        return f"`{_seconds(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "empty"
    if isinstance(value, list | dict | tuple) and not value:
        return "none"
    if isinstance(value, list) and all(dataclasses.is_dataclass(v) for v in value):
        names = sorted({str(getattr(v, "name", type(v).__name__)) for v in value})
        return f"{len(value)} built in ({', '.join(f'`{n}`' for n in names)})"
    return f"`{json.dumps(value) if isinstance(value, list | dict) else value}`"


def _check(field: dataclasses.Field[Any]) -> str:
    """What a field's ``check`` allows, when its docstring says (``A check for ...: X``)."""
    check = field.metadata.get("check")
    text = (check.__doc__ or "") if check is not None else ""
    if not text.startswith("A check for"):
        return ""
    return _markdown(text.split(":", 1)[1].strip().rstrip("."))


@functools.cache
def _field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines above each field of ``cls``, by field name."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment: list[str] = []
            index = node.lineno - 2
            while index >= 0 and lines[index].strip().startswith("#:"):
                comment.insert(0, lines[index].strip()[2:].strip())
                index -= 1
            if comment:
                found[node.target.id] = _markdown(" ".join(comment))
    return found


def _key(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("key", field.name))


def _dataclass_of(tp: Any) -> type | None:
    """The settings dataclass a field holds (itself, optional, or as list items)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        found = [c for c in map(_dataclass_of, get_args(tp)) if c is not None]
        return found[0] if len(found) == 1 else None
    if origin is list:
        return _dataclass_of(get_args(tp)[0])
    return None


def section_id(anchor: str, key: str) -> str:
    """The HTML id of the table of ``key`` (``policy.breaker``) under ``anchor``."""
    return f"{anchor}-{key}".replace(".", "-").replace("[]", "").strip("-")


def _settings_rows(cls: type, prefix: str,
                   anchor: str) -> Iterator[tuple[str, type, list[list[str]]]]:
    """(section key, its dataclass, table rows) for ``cls`` and every dataclass under it.

    A key that holds a mapping of its own links to that mapping's table, whose heading
    has the id :func:`section_id` gives (``anchor`` keeps two pages' ids apart).
    """
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    rows: list[list[str]] = []
    nested: list[tuple[str, type]] = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        key = prefix + _key(field)
        hint = hints[field.name]
        inner = _dataclass_of(hint)
        if inner is not None:
            is_list = get_origin(hint) is list
            nested.append((key + ("[]" if is_list else ""), inner))
        kind = _type_name(hint)
        if inner is not None:
            kind += f" ([below](#{section_id(anchor, nested[-1][0])}))"
        allowed = _check(field)
        about = comments.get(field.name, "")
        if allowed:
            about = f"{about} ({allowed})" if about else allowed.capitalize()
        rows.append([f"`{key}`", kind, _default(field), about])
    yield prefix.rstrip("."), cls, rows
    for key, inner in nested:
        yield from _settings_rows(inner, key + ".", anchor)


def settings_section(title: str, cls: type, anchor: str, level: int = 2,
                     about: str = "") -> list[str]:
    """A heading, ``about``, then one table per settings dataclass under ``cls``."""
    lines = ["#" * level + f" {title} {{#{anchor}}}", ""]
    if about:
        lines += [about, ""]
    for key, section, rows in _settings_rows(cls, "", anchor):
        if key:
            lines += ["#" * (level + 1) + f" `{key}` {{#{section_id(anchor, key)}}}", ""]
        doc = _doc(section)
        if doc and not doc.startswith(section.__name__ + "("):  # not dataclass's own
            lines += [doc, ""]
        lines += [*_table(["key", "type", "default", "what"], rows), ""]
    return lines


def config_page() -> str:
    """The agent's, the controller's and the fleet view's config keys, with defaults."""
    from sn_monitor.agent.settings import AgentSettings
    from sn_monitor.controller.settings import ControllerSettings
    from sn_monitor.fleet.settings import FleetSettings

    lines = ["# Config keys", "",
             "This page answers: which keys may an agent, controller or fleet config file "
             "hold, of what type, with which default? It is generated from the settings "
             "dataclasses that the one config loader (`sn_monitor/config.py`) fills, as "
             "the site builds. An unknown key is an error (it names the file, the key path "
             "and the line, and lists the keys known there). A duration is written `500ms`, "
             "`5s`, `2m`, `1h30m` or as a number of seconds. The commented examples: "
             "`deploy/agent.yaml`, `deploy/controller.yaml`, `deploy/fleet.yaml`; "
             "`sn-monitor check-config FILE` checks one.", ""]
    lines += settings_section("Agent configuration", AgentSettings, "agent-configuration",
                              about="`sn-monitor agent --config FILE`; command-line flags "
                                    "override it.")
    lines += settings_section("Controller configuration", ControllerSettings,
                              "controller-configuration",
                              about="`sn-monitor controller --config FILE`; command-line "
                                    "flags override it.")
    lines += settings_section("Fleet view configuration", FleetSettings,
                              "fleet-view-configuration",
                              about="`sn-monitor fleet --config FILE`.")
    return "\n".join(lines)


# ------------------------------------------------------------------------ metrics


@dataclasses.dataclass(frozen=True)
class MetricFamily:
    """What the metrics page says of one family."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...]


@contextlib.contextmanager
def simulated_node() -> Iterator[tuple[Any, Any]]:
    """The agent's real collectors on a simulated 8-GPU node: (sampler, clock).

    The node is sampled once, then GPU 0's cooling fails, GPU 1 takes XID 79 and a minute
    passes before the second sample, so the families that appear only with a fault
    (XID counters, events) appear. GPU 7 is cut into two MIG devices, so the MIG
    families appear.
    """
    from sn_monitor.agent.registry import build_collectors
    from sn_monitor.agent.sampler import Sampler
    from sn_monitor.agent.settings import AgentSettings
    from sn_monitor.clock import ManualClock
    from sn_monitor.sim import fake_nvml
    from sn_monitor.sim.node import SimulatedNode

    with tempfile.TemporaryDirectory(prefix="sn-docs-node-") as root:
        node = SimulatedNode(Path(root), gpus=8, seed=1)
        node.gpus[7].mig.enable()
        node.gpus[7].mig.create(["3g.40gb", "3g.40gb"])
        # a training process on GPU 0, for the workload and per-process families
        node.tree.add_gpu_process(4242, ["/usr/bin/python3", "train.py"])
        node.gpus[0].set_processes([(4242, 60 * 2**30)])
        clock = ManualClock()
        settings = node.agent_settings(AgentSettings(node="docs-node"))
        sampler = Sampler(settings.node, build_collectors(settings, node.nvml, clock), clock)
        try:
            sampler.sample()
            node.inject("overheat", gpu=0)
            node.inject_xid(1, 79)
            node.step(60.0)
            clock.advance(60.0)
            sampler.sample()
            yield sampler, clock
        finally:
            sampler.close()
            fake_nvml.reset()


def agent_families() -> list[MetricFamily]:
    """The agent's families, from its exporter over a simulated node's snapshot.

    The agent's status says it reports to a controller and guards a GPU, so the families
    that appear only then appear too.
    """
    from sn_monitor.agent.exporter import AgentStatus, SnapshotCollector

    with simulated_node() as (sampler, _):
        status = AgentStatus(guard_throttled=frozenset({0}), guard_gpus=(0,),
                             controller_configured=True,
                             controllers=("https://sn-controller:9848",),
                             controller_in_use="https://sn-controller:9848",
                             report_stream=True)
        collector = SnapshotCollector(lambda: sampler.latest, lambda: status)
        return [MetricFamily(f.name + ("_total" if f.type == "counter" else ""), f.type,
                             f.documentation, f.labelnames)
                for f in collector.families()]


def _parsed_families(text: str, labelled: Mapping[str, tuple[str, ...]]) -> list[MetricFamily]:
    """The families of an exposition; labels from its samples, else from ``labelled``."""
    from prometheus_client.parser import text_string_to_metric_families

    parsed = list(text_string_to_metric_families(text))
    names = {f.name for f in parsed}
    out = []
    for family in parsed:
        if family.name.endswith("_created") and family.name[:-len("_created")] in names:
            continue  # client_python's creation time of a counter or histogram
        labels: dict[str, None] = dict.fromkeys(labelled.get(family.name, ()))
        for sample in family.samples:
            labels.update(dict.fromkeys(k for k in sample.labels if k not in ("le", "quantile")))
        name = family.name + ("_total" if family.type == "counter" else "")
        out.append(MetricFamily(name, family.type, family.documentation, tuple(labels)))
    return out


def _families_of(metrics: Iterable[Any]) -> list[MetricFamily]:
    """client_python's metric families as :class:`MetricFamily` (labels as declared)."""
    out = []
    for metric in metrics:
        labels: dict[str, None] = dict.fromkeys(getattr(metric, "_labelnames", ()))
        for sample in metric.samples:
            labels.update(dict.fromkeys(k for k in sample.labels if k not in ("le", "quantile")))
        name = metric.name + ("_total" if metric.type == "counter" else "")
        out.append(MetricFamily(name, metric.type, metric.documentation, tuple(labels)))
    return out


def controller_families() -> list[MetricFamily]:
    """The controller's families: a real controller, in this process, read back.

    It runs with the packaged rules and one job, and takes three reports 10 s apart that
    the agent's own code built from the simulated node (an overheating GPU, an XID), so
    the families of jobs, firing rules, incidents and actions appear. Its exposition is
    parsed as Prometheus would; a family with no series yet takes its declared labels.
    """
    import msgspec

    from sn_monitor.agent.report import build_report, event_record
    from sn_monitor.controller.actions.routing import build_drivers
    from sn_monitor.controller.process.startup import open_store, read_rules
    from sn_monitor.controller.security.auth import OPEN_ACCESS
    from sn_monitor.controller.service import Controller
    from sn_monitor.controller.settings import ControllerSettings

    with simulated_node() as (sampler, clock), \
            tempfile.TemporaryDirectory(prefix="sn-docs-controller-") as state:
        settings = ControllerSettings(state_dir=state)
        drivers = build_drivers(settings.drivers, settings.routes, clock)
        store = open_store(settings)
        rules = read_rules(settings)
        controller = Controller(settings, rules.rules, clock, store, drivers,
                                watch_stalls=True, rule_sources=rules.sources)
        try:
            controller.start()
            # The daemon's runtime says which of its workers run
            # (controller/supervision/runtime.py).
            controller.workers = lambda: {"sweep": True}
            controller.add_job(json.dumps({
                "apiVersion": "training.ai/v1", "kind": "DistributedJob",
                "metadata": {"name": "docs"}, "spec": {"replicas": 1}}).encode(), "docs")
            snapshot = sampler.latest
            events = [event_record(e, i) for i, e in enumerate(snapshot.events, start=1)]
            for sequence in (1, 2, 3):
                report = build_report(snapshot, instance="docs", sequence=sequence,
                                      labels={}, interval=10.0,
                                      events=events if sequence == 1 else [],
                                      command_results=[], guard_throttled=frozenset())
                controller.ingest(msgspec.json.encode(report), OPEN_ACCESS)
                controller.sweep()
                clock.advance(10.0)
            text = controller.metrics().decode()
            labelled = {m.name: tuple(getattr(m, "_labelnames", ()))
                        for m in controller.telemetry.registry.collect()}
        finally:
            controller.close()
            store.close()
            drivers.close()
    return _parsed_families(text, labelled)


def fleet_families() -> list[MetricFamily]:
    """The fleet view's families (``sn-monitor fleet``): its real view, one supernode.

    The supernode's controller is stood for by an answer of one healthy node (the view
    asks through ``fetch``; the HTTP client is the only part left out).
    """
    from sn_monitor.clock import SystemClock
    from sn_monitor.fleet.server import FleetMetrics
    from sn_monitor.fleet.settings import FleetSettings, SupernodeSettings
    from sn_monitor.fleet.view import FleetView

    def answer(supernode: SupernodeSettings, path: str,
               params: Mapping[str, str]) -> tuple[str, Any]:
        return supernode.controllers[0], {"nodes": [{"name": "docs-node", "state": "healthy"}]}

    settings = FleetSettings(supernodes=[SupernodeSettings(
        name="sn0", controllers=["http://sn0-controller:9848"])])
    return _families_of(FleetMetrics(FleetView(settings, SystemClock(), answer)).collect())


def _metrics_section(title: str, anchor: str, families: list[MetricFamily],
                     about: str) -> list[str]:
    lines = [f"## {title} {{#{anchor}}}", "", about, ""]
    lines += _table(["family", "type", "labels", "what"],
                    ([f"`{f.name}`", f.type, ", ".join(f"`{x}`" for x in f.labels), f.help]
                     for f in sorted(families, key=lambda f: f.name)))
    return [*lines, ""]


def metrics_page() -> str:
    """Every metric family the agent, the controller and the fleet view export."""
    lines = ["# Metrics", "",
             "This page answers: which metric families does each part export, of which "
             "type, with which labels? It is generated as the site builds by running the "
             "real collectors and reading their exposition: the agent's on a simulated "
             "node (the fake NVML and a simulated `/proc` and `/sys`), a controller's in "
             "process. Names follow one convention: prefix `sn_`, base units, `_total` on "
             "counters; Prometheus adds `instance`, the controller's series name the "
             "`node`. Families that depend on hardware a node lacks (a GPU without NVLink "
             "fabric, a node without resctrl) are simply absent there.", ""]
    lines += _metrics_section(
        "Agent", "agent", agent_families(),
        "`sn-monitor agent`, on `:9847/metrics` (a simulated H100 node here).")
    lines += _metrics_section(
        "Controller", "controller", controller_families(),
        "`sn-monitor controller`, on `:9848/metrics`.")
    fleet = fleet_families()
    if fleet:
        lines += _metrics_section("Fleet view", "fleet", fleet,
                                  "`sn-monitor fleet`, on `:9849/metrics`.")
    return "\n".join(lines)


# ------------------------------------------------------------------------ the API


def _schema_text(schema: Mapping[str, Any]) -> str:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return " or ".join(_schema_text(o) for o in options)
    kind = schema.get("type", "")
    if isinstance(kind, list):
        return " or ".join(map(str, kind))
    if kind == "array":
        return f"list of {_schema_text(schema.get('items', {}))}"
    return str(kind) or "any"


def api_page() -> str:
    """The controller's OpenAPI document, as a page of endpoints and schemas."""
    from sn_monitor.controller.api.openapi import openapi_document

    doc = openapi_document()
    lines = ["# API", "",
             "This page answers: which HTTP endpoints does the controller serve, what do "
             "they take and answer, and which need a token? It is generated from the "
             "controller's OpenAPI document (served at `/openapi.json`) as the site builds. "
             "Every endpoint without *no token* needs `Authorization: Bearer TOKEN` when the "
             "controller has a token file, and answers 401 without one and 403 for a token "
             "whose role may not call it (roles `agent`, `read`, `operate`, `admin`: "
             "`deploy/tokens.example.yaml`). Errors are JSON: `{\"error\": \"...\"}`.", "",
             f"OpenAPI {doc.get('openapi', '')}, {doc.get('info', {}).get('title', '')} "
             f"{doc.get('info', {}).get('version', '')}.", ""]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            lines += [f"## `{method.upper()} {path}`", "", op.get("summary", ""), ""]
            if op.get("description"):
                lines += [op["description"], ""]
            if op.get("security") == []:
                lines += ["*No token.*", ""]
            params = op.get("parameters", [])
            if params:
                lines += _table(["parameter", "in", "type", "required"],
                                ([f"`{p['name']}`", p["in"], _schema_text(p.get("schema", {})),
                                  "yes" if p.get("required") else ""] for p in params))
                lines.append("")
            body = op.get("requestBody")
            if body:
                kinds = ", ".join(f"`{k}` ({_schema_text(v.get('schema', {}))})"
                                  for k, v in body.get("content", {}).items())
                lines += [f"Body: {kinds}" + ("" if body.get("required", True) else
                                              " (optional)"), ""]
            lines += _table(["status", "answer"],
                            ([code, r.get("description", "") + "".join(
                                f": {_schema_text(c['schema'])}"
                                for c in r.get("content", {}).values()
                                if "$ref" in c.get("schema", {}))]
                             for code, r in sorted(op["responses"].items())))
            lines.append("")
    schemas = doc.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
        for name, schema in sorted(schemas.items()):
            lines += [f"### {name} {{#{name.lower()}}}", ""]
            if schema.get("description"):
                lines += [_cell(schema["description"]), ""]
            props = schema.get("properties", {})
            required = set(schema.get("required", ()))
            if props:
                lines += _table(["field", "type", "required"],
                                ([f"`{k}`", _schema_text(v), "yes" if k in required else ""]
                                 for k, v in props.items()))
                lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------ files


def _rule_kinds() -> list[type]:
    from sn_monitor.rules.spec import Rule

    return list(get_args(Rule))


def files_page() -> str:
    """Rule files (every kind's keys, the packaged rules), job files, scenario faults."""
    from sn_monitor.controller.jobs.spec import DistributedJob
    from sn_monitor.rules.spec import RuleBase, packaged_rules, parse_rules, rule_documents
    from sn_monitor.sim.scenario import FAULT_SPECS

    lines = ["# Rule, job and scenario files", "",
             "This page answers: what may a rule file, a DistributedJob file or a scenario "
             "file hold, and which rules ship? It is generated from the dataclasses their "
             "loader fills and from the packaged rules, as the site builds. "
             "`sn-monitor check-config FILE...` checks any of them (and agent, controller, "
             "fleet, token and XID catalogue files): exit 0, or exit 2 with "
             "`file:line: key: message` for the first error.", "",
             "## Rule files", "",
             "A rule file is a YAML list; each item is one rule, and its keys say which kind "
             "it is. The controller reads the files of `--rules DIR` (or `rules:`), else "
             "`/etc/sn-monitor/rules` when it exists, else the packaged rules; `SIGHUP` "
             "reloads them. What the controller does with a firing rule: "
             "[The controller](../controller/index.md).", ""]
    lines += settings_section("Every rule", RuleBase, "every-rule", level=3,
                              about="Keys every kind takes.")
    base = {f.name for f in dataclasses.fields(RuleBase)}
    for kind in _rule_kinds():
        name = getattr(kind, "kind", kind.__name__)
        anchor = f"{name}-rules"
        lines += [f"### `{name}` rules {{#{anchor}}}", "", _doc(kind), ""]
        rows = [r for key, section, rows in _settings_rows(kind, "", anchor) if section is kind
                for r in rows if r[0].strip("`") not in base]
        lines += [*_table(["key", "type", "default", "what"], rows), ""]
        for key, section, sub_rows in _settings_rows(kind, "", anchor):
            if key and section is not kind and key.split(".")[0] not in base:
                lines += [f"#### `{key}` {{#{section_id(anchor, key)}}}", "", _doc(section), ""]
                lines += [*_table(["key", "type", "default", "what"], sub_rows), ""]
    rules = [rule for doc in rule_documents([packaged_rules()]) for rule in parse_rules(doc)]
    lines += ["## The default rules", "",
              f"The {len(rules)} rules packaged with sn-monitor "
              "(`sn_monitor/rules/default.yaml`, each with its reasons in comments there).", ""]
    lines += _table(["rule", "kind", "severity", "actions", "what"],
                    ([f"`{r.name}`", r.kind, str(r.severity or "the alert's"),
                      ", ".join(r.actions), r.description] for r in rules))
    lines += ["", "## Job files {#job-files}", "",
              "A `DistributedJob`, from `--jobs DIR`, `POST /api/v1/jobs` (JSON or YAML) or "
              "a Kubernetes custom resource. Examples: `deploy/jobs/minimal.yaml`, "
              "`deploy/jobs/example.yaml`. What the controller does with it: "
              "[Jobs](../jobs/index.md).", ""]
    for key, section, rows in _settings_rows(DistributedJob, "", "job-files"):
        if key:
            lines += [f"### `{key}` {{#{section_id('job-files', key)}}}", ""]
            doc = _doc(section)
            if doc and not doc.startswith(section.__name__ + "("):
                lines += [doc, ""]
        lines += [*_table(["key", "type", "default", "what"], rows), ""]
    lines += ["## Scenario files", "",
              "A scenario (`kind: Scenario`) is a timeline of faults, `{at, node, gpu, fault, "
              "...}`, played by `sn-monitor demo --scenario` and `sn-monitor simulate "
              "--scenario` ([Rehearsing faults](../getting-started/rehearsing.md)); the "
              "packaged ones are in `sn_monitor/sim/scenarios/`. The faults, and their "
              "parameters:", ""]
    rows = []
    for fault, spec in FAULT_SPECS.items():
        params = "; ".join(
            f"`{p}` ({param.kind}" + (", required" if param.required else
                                      f", default {param.default}") + f"): {param.doc}"
            for p, param in spec.params.items())
        rows.append([f"`{fault}`", "yes" if spec.needs_gpu else "",
                     spec.doc + (" (simulate only)" if spec.fleet_only else ""), params])
    lines += _table(["fault", "GPU", "what", "parameters"], rows)
    return "\n".join(lines) + "\n"


#: Each generated page, by its path in the site.
PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/metrics.md": metrics_page,
    "reference/api.md": api_page,
    "reference/files.md": files_page,
}
