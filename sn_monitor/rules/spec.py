"""Rule files: what each kind of rule says, and loading them with errors that point at a line.

A rule file is a YAML list; each item is one rule, and its keys say which kind it is:

============  ====================================================================
threshold     ``metric`` + ``above`` or ``below`` (optionally on its ``rate`` or
              ``increase`` over a window), ``for``, ``clear_below`` / ``clear_above``
baseline      ``metric`` + ``baseline: {window, sigmas, min_delta, warmup, direction}``
peers         ``metric`` + ``peers: {group, below_median_by | above_median_by, min_group}``
event         ``event`` + ``codes`` and/or ``resolutions`` (NVIDIA's Xid catalogue:
              RESTART_APP, RESET_GPU, ...), ``count`` within ``window``, ``clear_after``
heartbeat     ``heartbeat_timeout``
alert         ``alert: {label: value | "=~regex", ...}`` [+ ``node_label``]: acts on
              Alertmanager's alerts (``POST /api/v1/alertmanager``), not on reports
============  ====================================================================

Bounds are inclusive: ``above: 85`` fires at 85, ``below: 3`` fires at 3. A firing rule
clears once the value is strictly past ``clear_below`` / ``clear_above`` (by default the
bound itself), which gives hysteresis where one is set.

Every rule also takes ``name`` (unique across all files), ``severity``, ``actions``,
``dry_run``, ``description`` and ``scope`` (node labels to regular expressions: the rule
applies to matching nodes only). An alert rule's ``severity`` defaults to the alert's
own ``severity`` label.

Three keys put a finding in its context (the controller reads them, not the rule):

``escalate: {to, repeats, within, node_recoveries, recoveries_within}``
    A repeat offender climbs one rung: the ``repeats``-th incident of this rule on one
    subject within ``within``, or an incident on a node recovered ``node_recoveries``
    times within ``recoveries_within``, takes rule ``to``'s actions and severity.
``job_wide: {nodes, within}``
    The rule firing on ``nodes`` or more nodes of one job within ``within`` is the job's
    fault (its application), not the nodes': one incident for the job, an alert, no node
    action. Node findings wait ``within`` to see whether they are part of one.
``domain: {label, nodes, within}``
    The rule firing on ``nodes`` or more nodes sharing one value of node label ``label``
    (a rack, an NVLink domain) within ``within`` is one incident of that domain; its
    nodes' own alerts are folded into the domain's.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Final, Literal

from sn_monitor.config import (
    ConfigError,
    Document,
    Duration,
    KeyPath,
    at_least_one,
    bind,
    load_yaml,
    non_negative,
    positive,
    setting,
)
from sn_monitor.model import ActionName, EventKind
from sn_monitor.rules.series import FAMILY_LABELS, check_metric, metric_family
from sn_monitor.rules.xid_catalog import RESOLUTIONS, is_catalog_document

Severity = Literal["info", "warning", "critical"]
Direction = Literal["above", "below", "both"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_PROMETHEUS_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: An alert matcher's value that starts with this is a regular expression (full match).
REGEX_MATCH = "=~"


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"a rule name is letters, digits and _.:- (got {name!r})")


def _regex_problems(key: str, patterns: dict[str, str]) -> Iterator[tuple[str, str]]:
    for label, expr in patterns.items():
        try:
            re.compile(expr)
        except re.error as err:
            yield f"{key}.{label}", f"invalid regular expression {expr!r}: {err}"


def _label_name(value: str) -> None:
    if not value:
        raise ValueError("must name a node label (job, supernode, ...)")


def _fraction(value: float) -> None:
    if not 0 < value < 1:
        raise ValueError(f"must be a fraction of the median between 0 and 1, got {value}")


def _at_least_two(value: int) -> None:
    if value < 2:
        raise ValueError(f"must be at least 2 (one is not a pattern), got {value}")


@dataclass(frozen=True)
class EscalationSpec:
    """``escalate:``: when a repeat offender takes another rule's actions (one rung up)."""

    to: str = setting(check=_check_name)
    repeats: int | None = setting(default=None, check=_at_least_two)
    within: Duration = setting(default=Duration(3600), check=positive)
    node_recoveries: int | None = setting(default=None, check=at_least_one)
    recoveries_within: Duration = setting(default=Duration(7 * 86400), check=positive)


@dataclass(frozen=True)
class JobWideSpec:
    """``job_wide:``: how many of a job's nodes at once make a fault the job's own."""

    nodes: int = setting(default=3, check=_at_least_two)
    within: Duration = setting(default=Duration(30), check=positive)


@dataclass(frozen=True)
class DomainSpec:
    """``domain:``: how many nodes of one rack (or other label) at once are one fault."""

    label: str = setting(default="rack", check=_label_name)
    nodes: int = setting(default=3, check=_at_least_two)
    within: Duration = setting(default=Duration(60), check=positive)


@dataclass(frozen=True, kw_only=True)
class RuleBase:
    """What every rule has: who it is, how bad, what to do about it, where it applies."""

    name: str = setting(check=_check_name)
    severity: Severity = "warning"
    actions: list[ActionName] = field(default_factory=list)
    dry_run: bool = False
    description: str = ""
    scope: dict[str, str] = field(default_factory=dict)
    escalate: EscalationSpec | None = None
    job_wide: JobWideSpec | None = None
    domain: DomainSpec | None = None

    kind: ClassVar[str] = "rule"

    def problems(self) -> Iterator[tuple[str, str]]:
        """(key, message) for what single keys cannot check; empty when the rule is sound."""
        yield from _regex_problems("scope", self.scope)
        escalate = self.escalate
        if escalate is not None:
            if escalate.repeats is None and escalate.node_recoveries is None:
                yield "escalate", ("say when: repeats (incidents of this rule within "
                                   "`within`) and/or node_recoveries")
            if escalate.to == self.name:
                yield "escalate.to", "a rule cannot escalate to itself"
        seen: set[str] = set()
        for action in self.actions:
            if action in seen:
                yield "actions", f"{action} is listed twice"
            seen.add(action)

    def detection(self) -> RuleBase:
        """The rule without what changes only its findings, not its detection (for reload)."""
        return dataclasses.replace(self, severity="warning", actions=[], dry_run=False,
                                   description="", escalate=None, job_wide=None, domain=None)


@dataclass(frozen=True)
class Window:
    """``rate: {window: 1m}`` / ``increase: {window: 5m}``."""

    window: Duration = setting(check=positive)


@dataclass(frozen=True, kw_only=True)
class ThresholdRule(RuleBase):
    """A fixed bound on a metric, or on its rate / increase, held ``for`` a while."""

    kind: ClassVar[str] = "threshold"

    metric: str = setting(check=check_metric)
    above: float | None = None
    below: float | None = None
    hold: Duration = setting(key="for", default=Duration(0))
    clear_below: float | None = None
    clear_above: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    rate: Window | None = None
    increase: Window | None = None

    def problems(self) -> Iterator[tuple[str, str]]:
        yield from super().problems()
        yield from _label_problems(self.metric, self.labels)
        if self.above is not None and self.below is not None:
            yield "below", "a threshold is above or below, not both: write two rules"
        if self.rate is not None and self.increase is not None:
            yield "increase", "rate and increase are two rules, not one"
        if self.above is not None:
            if self.clear_above is not None:
                yield "clear_above", "goes with below; with above, write clear_below"
            if self.clear_below is not None and self.clear_below > self.above:
                yield "clear_below", (f"must not be above the threshold "
                                      f"({self.clear_below:g} > {self.above:g})")
        if self.below is not None:
            if self.clear_below is not None:
                yield "clear_below", "goes with above; with below, write clear_above"
            if self.clear_above is not None and self.clear_above < self.below:
                yield "clear_above", (f"must not be below the threshold "
                                      f"({self.clear_above:g} < {self.below:g})")


@dataclass(frozen=True)
class BaselineSpec:
    """How a per-series baseline learns and how far from it is anomalous."""

    window: Duration = setting(check=positive)
    sigmas: float = setting(default=4.0, check=positive)
    min_delta: float = setting(default=0.0, check=non_negative)
    warmup: Duration | None = None
    min_samples: int = setting(default=30, check=at_least_one)
    direction: Direction | None = None


@dataclass(frozen=True, kw_only=True)
class BaselineRule(RuleBase):
    """Fires when a series strays from its own recent behaviour."""

    kind: ClassVar[str] = "baseline"

    metric: str = setting(check=check_metric)
    baseline: BaselineSpec
    hold: Duration = setting(key="for", default=Duration(0))
    labels: dict[str, str] = field(default_factory=dict)

    def problems(self) -> Iterator[tuple[str, str]]:
        yield from super().problems()
        yield from _label_problems(self.metric, self.labels)

    @property
    def direction(self) -> Direction:
        """Temperatures only alarm upwards by default: a cooler GPU is not a fault."""
        if self.baseline.direction is not None:
            return self.baseline.direction
        return "above" if self.metric.endswith("_celsius") else "both"

    @property
    def warmup(self) -> float:
        """Time a series must be watched before it may fire: a third of the window by default."""
        if self.baseline.warmup is not None:
            return float(self.baseline.warmup)
        return self.baseline.window / 3


@dataclass(frozen=True)
class PeersSpec:
    """Which nodes are peers and how far from their median is too far."""

    group: str = setting(check=_label_name)
    below_median_by: float | None = setting(default=None, check=_fraction)
    above_median_by: float | None = setting(default=None, check=_fraction)
    min_group: int = setting(default=4, check=lambda v: _at_least(v, 2))


def _at_least(value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"must be at least {low}, got {value}")


@dataclass(frozen=True, kw_only=True)
class PeersRule(RuleBase):
    """Fires when a node's value (mean over its subjects) strays from its group's median."""

    kind: ClassVar[str] = "peers"

    metric: str = setting(check=check_metric)
    peers: PeersSpec
    hold: Duration = setting(key="for", default=Duration(0))
    labels: dict[str, str] = field(default_factory=dict)

    def problems(self) -> Iterator[tuple[str, str]]:
        yield from super().problems()
        yield from _label_problems(self.metric, self.labels)
        given = [self.peers.below_median_by, self.peers.above_median_by]
        if given.count(None) != 1:
            yield "peers", "give one of below_median_by or above_median_by"


@dataclass(frozen=True, kw_only=True)
class EventRule(RuleBase):
    """Fires on events (XIDs, a GPU lost): on each one, or ``count`` within ``window``.

    An XID rule matches ``codes``, and the codes whose resolution in NVIDIA's Xid
    catalogue is one of ``resolutions`` (RESET_GPU, ...); neither: every code.
    """

    kind: ClassVar[str] = "event"

    event: EventKind
    codes: list[int] = field(default_factory=list)
    resolutions: list[str] = field(default_factory=list)
    count: int = setting(default=1, check=at_least_one)
    window: Duration | None = setting(default=None, check=positive)
    clear_after: Duration = setting(default=Duration(600), check=positive)

    def problems(self) -> Iterator[tuple[str, str]]:
        yield from super().problems()
        if self.count > 1 and self.window is None:
            yield "count", f"{self.count} events need a window to count in (window: 10m)"
        if self.codes and self.event not in ("xid", "sxid"):
            yield "codes", f"only xid and sxid events have codes, not {self.event}"
        if self.resolutions and self.event != "xid":
            yield "resolutions", f"NVIDIA's Xid catalogue resolves xid events, not {self.event}"
        unknown = [name for name in self.resolutions if name not in RESOLUTIONS]
        if unknown:
            yield "resolutions", (f"not a resolution of NVIDIA's Xid catalogue: "
                                  f"{', '.join(map(repr, unknown))} "
                                  f"(known: {', '.join(sorted(RESOLUTIONS))})")


@dataclass(frozen=True, kw_only=True)
class HeartbeatRule(RuleBase):
    """Fires when a node has not reported for ``heartbeat_timeout``."""

    kind: ClassVar[str] = "heartbeat"

    heartbeat_timeout: Duration = setting(check=positive)


def _alert_label(name: str) -> None:
    if not _PROMETHEUS_LABEL.fullmatch(name):
        raise ValueError(f"must be an alert label name (node, instance, ...), got {name!r}")


def _alert_matchers(matchers: dict[str, str]) -> None:
    if not matchers:
        raise ValueError("name at least one label to match (alertname: ...): "
                         "an empty match would act on every alert")


@dataclass(frozen=True, kw_only=True)
class AlertRule(RuleBase):
    """Acts on Alertmanager's alerts (detection written in PromQL), not on reports.

    ``alert`` maps label names to the value an alert must have (``""``: the label is
    absent) or, written ``=~...``, to a regular expression its value must match in full.
    The node is the alert's ``node_label``, or its ``instance`` without the port.
    """

    kind: ClassVar[str] = "alert"

    alert: dict[str, str] = setting(check=_alert_matchers)
    node_label: str = setting(default="node", check=_alert_label)
    # None: each finding takes the alert's own severity label (Alertmanager's routing
    # names). A rule's severity is otherwise always set, hence the narrower base type.
    severity: Severity | None = None  # type: ignore[assignment]

    def problems(self) -> Iterator[tuple[str, str]]:
        yield from super().problems()
        for label in self.alert:
            if not _PROMETHEUS_LABEL.fullmatch(label):
                yield f"alert.{label}", "not an alert label name (letters, digits and _)"
        yield from _regex_problems("alert", {
            label: value[len(REGEX_MATCH):] for label, value in self.alert.items()
            if value.startswith(REGEX_MATCH)})


Rule = ThresholdRule | BaselineRule | PeersRule | EventRule | HeartbeatRule | AlertRule


def _label_problems(metric: str, labels: dict[str, str]) -> Iterator[tuple[str, str]]:
    yield from _regex_problems("labels", labels)
    allowed = FAMILY_LABELS[metric_family(metric)]
    for name in labels:
        if name not in allowed:
            yield f"labels.{name}", (f"{metric} has no label {name} "
                                     f"(it has: {', '.join(sorted(allowed))})")


# Keys that say which kind a rule is. ``metric`` alone says nothing: three kinds use it.
_MARKERS: tuple[tuple[str, type[RuleBase], tuple[str, ...]], ...] = (
    ("threshold", ThresholdRule, ("above", "below")),
    ("baseline", BaselineRule, ("baseline",)),
    ("peers", PeersRule, ("peers",)),
    ("event", EventRule, ("event",)),
    ("heartbeat", HeartbeatRule, ("heartbeat_timeout",)),
    ("alert", AlertRule, ("alert",)),
)


def _kind_of(item: dict[object, object], doc: Document, key: KeyPath) -> type[RuleBase]:
    found = [(kind, cls, next(k for k in markers if k in item))
             for kind, cls, markers in _MARKERS if any(k in item for k in markers)]
    if not found:
        raise doc.error(key, "not a rule of any kind: give above/below (threshold), baseline, "
                             "peers, event, heartbeat_timeout or alert")
    if len(found) > 1:
        (kind1, _, key1), (kind2, _, key2) = found[:2]
        raise doc.error((*key, key2), f"a rule is one kind: {key1} makes this {_a(kind1)} rule, "
                                      f"{key2} {_a(kind2)} rule")
    return found[0][1]


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def parse_rules(doc: Document) -> list[Rule]:
    """The rules in one parsed file, checked; raise ConfigError at the first problem."""
    if doc.data is None:
        return []
    if not isinstance(doc.data, list):
        raise ConfigError(doc.path, "", doc.line(()),
                          "expected a list of rules (each item starting with '- name:')")
    # Key paths read rules[3].above: the file is the list of rules.
    named = Document(doc.path, {"rules": doc.data},
                     {("rules", *k): line for k, line in doc.lines.items()})
    out: list[Rule] = []
    for index, item in enumerate(doc.data):
        key: KeyPath = ("rules", index)
        if not isinstance(item, dict):
            raise named.error(key, "expected a rule (a mapping with a name), "
                                   f"got {type(item).__name__}")
        if "name" not in item:
            raise named.error(key, "missing required key 'name'")
        cls = _kind_of(item, named, key)
        rule = bind(cls, named, item, key)
        for sub, message in rule.problems():
            raise named.error((*key, *sub.split(".")), message)
        out.append(rule)  # type: ignore[arg-type]
    return out


#: Where an installed controller's rules live, if the operator put them there.
SYSTEM_RULES: Final = Path("/etc/sn-monitor/rules")


def packaged_rules() -> Path:
    """The default rules that ship inside the package (``sn_monitor/rules/``)."""
    return Path(__file__).resolve().parent


def default_rule_paths() -> tuple[list[Path], str]:
    """The rules to load when none are configured, and where they come from.

    ``/etc/sn-monitor/rules`` when that directory exists, else the packaged defaults.
    """
    if SYSTEM_RULES.is_dir():
        return [SYSTEM_RULES], f"{SYSTEM_RULES} (no rules configured)"
    return [packaged_rules()], (f"the packaged defaults {packaged_rules()} (no rules "
                                f"configured and no {SYSTEM_RULES})")


def rule_documents(paths: Sequence[Path]) -> list[Document]:
    """The rule files of ``paths``, parsed: a directory means each ``*.yaml`` in it, sorted.

    An XID catalogue in a directory (``kind: XidCatalog``; the packaged rules directory
    holds one, and an operator may keep an edited copy beside the rules) is not a rule
    file and is passed over; a file named on its own is always read as rules. A path
    that does not exist, or a directory without a rule file, is a ConfigError: a typo
    must not leave a controller that watches nothing.
    """
    return [doc for path in paths for doc in _documents_of(path)]


def _documents_of(path: Path) -> list[Document]:
    if not path.exists():
        raise ConfigError(str(path), "", None, "rules path does not exist")
    if not path.is_dir():
        return [load_yaml(path)]
    docs = [doc for doc in map(load_yaml, sorted(path.glob("*.yaml")))
            if not is_catalog_document(doc.data)]
    if not docs:
        raise ConfigError(str(path), "", None, _no_rule_files(path))
    return docs


def _no_rule_files(directory: Path) -> str:
    """What a directory without rule files holds instead, for the error."""
    others = sorted(p.name for p in directory.iterdir())
    if not others:
        return "no rule files (*.yaml) in this directory: it is empty"
    shown = ", ".join(others[:5]) + (f", and {len(others) - 5} more" if len(others) > 5 else "")
    hint = "; rule files must end in .yaml" if any(n.endswith(".yml") for n in others) else ""
    return (f"no rule files (*.yaml) in this directory: found {len(others)} other "
            f"file{'s' if len(others) != 1 else ''} ({shown}){hint}")


#: Why a controller refuses rule files that hold no rule at all.
NO_RULES: Final = ("the rule files hold no rules: the controller would watch nothing "
                   "(rules: [] in its config runs it without)")
#: The ``source`` of the rules packaged with sn-monitor (``sn_controller_rules``).
PACKAGED_SOURCE: Final = "packaged"
#: The ``source`` of rules given by the controller's config itself (``rules: []``).
CONFIG_SOURCE: Final = "config"


def source_name(path: Path) -> str:
    """How ``sn_controller_rules`` names the rules of ``path``: as given, or ``packaged``."""
    return PACKAGED_SOURCE if path.resolve() == packaged_rules() else str(path)


@dataclass(frozen=True)
class RuleSet:
    """Rules as loaded, and how many each source (a path as given, or ``packaged``) gave."""

    rules: list[Rule]
    sources: dict[str, int]


def load_rules(paths: list[Path]) -> list[Rule]:
    """Every rule in ``paths`` (a directory means each rule file in it, sorted).

    Raise ConfigError naming file, key path and line; a name defined twice names both.
    """
    return load_rule_set(paths).rules


def load_rule_set(paths: Sequence[Path]) -> RuleSet:
    """Every rule in ``paths``, and how many each path gave (see :func:`load_rules`)."""
    rules: list[Rule] = []
    sources: dict[str, int] = {}
    first: dict[str, tuple[str, int | None]] = {}
    escalations: list[tuple[Rule, str, int, int | None]] = []
    for given, doc in ((p, doc) for p in paths for doc in _documents_of(p)):
        parsed = parse_rules(doc)
        for index, rule in enumerate(parsed):
            line = doc.line((index, "name"))
            if rule.escalate is not None:
                escalations.append((rule, doc.path, index, doc.line((index, "escalate", "to"))))
            if rule.name in first:
                first_file, first_line = first[rule.name]
                where = (f"line {first_line}" if first_file == doc.path
                         else f"{first_file}:{first_line}")
                raise ConfigError(doc.path, f"rules[{index}].name", line,
                                  f"duplicate rule name {rule.name!r} (first defined at {where})")
            first[rule.name] = (doc.path, line)
        rules.extend(parsed)
        source = source_name(given)
        sources[source] = sources.get(source, 0) + len(parsed)
    for rule, file_name, index, line in escalations:
        assert rule.escalate is not None
        if rule.escalate.to not in first:
            raise ConfigError(file_name, f"rules[{index}].escalate.to", line,
                              f"no rule named {rule.escalate.to!r} to escalate to")
    return RuleSet(rules, sources)
