"""Failure traces: when which node fails, how the fault shows itself, what warned of it.

Three sources, one type (:class:`Trace`):

- a *catalogue* of root-cause categories with counts over a run (``llama3.yaml``, from
  the Llama 3 paper), turned into per-node rates and drawn, for a seed, as a Poisson
  process over the replayed job's nodes (:func:`draw`);
- a *trace file* of the user's own incident history, YAML or CSV of time, node, kind
  (:func:`load_trace`);
- a *recorded run*: the incidents a controller recorded (``GET /api/v1/incidents``,
  saved as JSON), the simulator's or a real fleet's (:func:`load_trace` too).

Every error in a file names the file and the line.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

from sn_monitor.config import (
    ConfigError,
    Document,
    Duration,
    bind,
    fraction,
    load_yaml,
    parse_duration_text,
    parse_yaml,
    setting,
)

#: How a fault reaches the monitoring (see llama3.yaml).
Kind = Literal["xid", "node-lost", "ib-link", "hang", "software"]
KINDS: tuple[str, ...] = get_args(Kind)
#: The signals the agents see before some faults.
Signal = Literal["thermal", "row-remap-pending", "symbol-errors"]
SIGNALS: tuple[str, ...] = get_args(Signal)
#: Kinds after which the node is broken until repaired (the others leave it healthy).
HARDWARE: frozenset[str] = frozenset({"xid", "node-lost", "ib-link"})
#: Kinds that leave every rank waiting in its collective (:attr:`Fault.blocks_peers`).
BLOCKING: frozenset[str] = frozenset({"node-lost", "ib-link", "hang"})
DEFAULT_REPAIR = 86400.0
CATALOGUE = Path(__file__).with_name("llama3.yaml")


@dataclass(frozen=True)
class Warning:
    """A signal the agents report ``lead`` seconds before the fault."""

    signal: Signal
    lead: float


@dataclass(frozen=True)
class Fault:
    """One interruption: ``time`` seconds into the run, on ``node``."""

    time: float
    node: str
    kind: Kind
    code: int | None = None
    category: str = ""
    warning: Warning | None = None
    #: Seconds the node is out of service once taken out (hardware kinds only).
    repair: float = 0.0

    @property
    def breaks_node(self) -> bool:
        return self.kind in HARDWARE

    @property
    def blocks_peers(self) -> bool:
        """Whether every rank is left waiting in its collective, unable to leave it.

        A fatal XID or a process exit kills a process on a live host: its connections
        close and the peers' collectives fail at once. A lost host closes nothing, a link
        down cuts it off, a hang is every rank waiting: the peers wait until a timeout
        (gloo's abort does not free them; NCCL's would, which the torchrun example does
        not use).
        """
        return self.kind in BLOCKING


@dataclass(frozen=True)
class Trace:
    """Faults in time order, the run they belong to, and where they came from."""

    faults: tuple[Fault, ...]
    duration: float
    source: str

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for fault in self.faults:
            out[fault.kind] = out.get(fault.kind, 0) + 1
        return dict(sorted(out.items()))

    def warned(self) -> int:
        return sum(1 for f in self.faults if f.warning is not None)


# ---------------------------------------------------------------------- the catalogue


def _shows_as(value: str) -> None:
    parse_shows_as(value)  # a setting check: raises ValueError


def parse_shows_as(value: str) -> tuple[Kind, int | None]:
    """``xid 79`` -> ("xid", 79); ``node-lost`` -> ("node-lost", None)."""
    parts = value.split()
    if not parts or parts[0] not in KINDS:
        raise ValueError(f"must start with one of {', '.join(KINDS)}; got {value!r}")
    if parts[0] == "xid":
        if len(parts) != 2 or not parts[1].isdigit():
            raise ValueError(f"an XID needs its code, e.g. 'xid 79'; got {value!r}")
        return "xid", int(parts[1])
    if len(parts) != 1:
        raise ValueError(f"only an XID takes a code; got {value!r}")
    return parts[0], None  # type: ignore[return-value]


@dataclass(frozen=True)
class WarningSpec:
    share: float = setting(check=fraction)
    signal: Signal = setting()
    lead: Duration = setting()


def _count(value: int) -> None:
    if value < 0:
        raise ValueError(f"must not be negative, got {value}")


@dataclass(frozen=True)
class Category:
    name: str
    count: int = setting(check=_count)
    shows_as: str = setting(check=_shows_as)
    repair: Duration | None = None
    warning: WarningSpec | None = None


def _positive(value: float) -> None:
    if value <= 0:
        raise ValueError(f"must be greater than 0, got {value}")


@dataclass(frozen=True)
class Catalogue:
    """Interruption counts by root cause over ``days`` on ``nodes`` nodes."""

    source: str
    days: float = setting(check=_positive)
    nodes: int = setting(check=_positive)
    categories: list[Category] = setting()

    def rate_per_node_second(self, category: Category) -> float:
        return category.count / (self.days * 86400.0 * self.nodes)

    def total(self) -> int:
        return sum(c.count for c in self.categories)


def load_catalogue(path: str | Path = CATALOGUE) -> Catalogue:
    """A catalogue file (raises ConfigError naming file, key and line)."""
    return bind(Catalogue, load_yaml(path))


def draw(catalogue: Catalogue, nodes: Sequence[str], duration: float, seed: int) -> Trace:
    """The catalogue's faults for a job on ``nodes`` over ``duration`` seconds.

    Each category is a Poisson process at its per-node rate times the job's nodes, its
    own stream of the seed (adding a category changes no other's faults); the node is
    drawn uniformly; a fault is warned of with the category's share.
    """
    faults: list[Fault] = []
    for index, category in enumerate(catalogue.categories):
        rate = catalogue.rate_per_node_second(category) * len(nodes)
        if rate <= 0:
            continue
        rng = random.Random(f"{seed}:{index}:{category.name}")
        kind, code = parse_shows_as(category.shows_as)
        repair = float(category.repair) if category.repair is not None else (
            DEFAULT_REPAIR if kind in HARDWARE else 0.0)
        t = rng.expovariate(rate)
        while t < duration:
            warning = None
            spec = category.warning
            if spec is not None and rng.random() < spec.share:
                warning = Warning(spec.signal, float(spec.lead))
            faults.append(Fault(time=round(t, 3), node=nodes[rng.randrange(len(nodes))],
                                kind=kind, code=code, category=category.name,
                                warning=warning, repair=repair))
            t += rng.expovariate(rate)
    faults.sort(key=lambda f: (f.time, f.node))
    return Trace(tuple(faults), duration, catalogue.source)


# ---------------------------------------------------------------------- trace files


@dataclass(frozen=True)
class _WarningEntry:
    signal: Signal
    lead: Duration


@dataclass(frozen=True)
class _Entry:
    time: Duration
    node: str
    kind: Kind
    code: int | None = None
    category: str = ""
    warning: _WarningEntry | None = None
    repair: Duration | None = None


@dataclass(frozen=True)
class _TraceFile:
    faults: list[_Entry]
    duration: Duration | None = None
    source: str = ""


def load_trace(path: str | Path) -> Trace:
    """A trace file: ``.yaml``/``.yml``, ``.csv``, or ``.json`` (a controller's incidents).

    Raises ConfigError naming the file and the line (and the key or column).
    """
    name = str(path)
    suffix = Path(path).suffix.lower()
    if suffix in (".yaml", ".yml"):
        return _from_yaml(load_yaml(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(name, "", None, "no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(name, "", None, f"cannot read: {err}") from None
    if suffix == ".csv":
        return _from_csv(text, name)
    if suffix == ".json":
        return _from_incidents(text, name)
    raise ConfigError(name, "", None, "a trace is a .yaml, .csv or .json (incidents) file")


def _from_yaml(doc: Document) -> Trace:
    data = bind(_TraceFile, doc)
    faults = []
    for i, entry in enumerate(data.faults):
        faults.append(_fault(entry, lambda message, i=i: doc.error(("faults", i), message)))
    return _trace(faults, data.duration, data.source or doc.path, doc.path)


def _fault(entry: _Entry, error: Any) -> Fault:
    if entry.kind == "xid" and entry.code is None:
        raise error("an xid fault needs its code")
    if entry.kind != "xid" and entry.code is not None:
        raise error(f"only an xid fault takes a code, not {entry.kind}")
    if not entry.node:
        raise error("node: must not be empty")
    repair = float(entry.repair) if entry.repair is not None else (
        DEFAULT_REPAIR if entry.kind in HARDWARE else 0.0)
    warning = (Warning(entry.warning.signal, float(entry.warning.lead))
               if entry.warning is not None else None)
    return Fault(time=float(entry.time), node=entry.node, kind=entry.kind, code=entry.code,
                 category=entry.category or entry.kind, warning=warning, repair=repair)


def _trace(faults: list[Fault], duration: float | None, source: str, path: str) -> Trace:
    faults.sort(key=lambda f: (f.time, f.node))
    last = faults[-1].time if faults else 0.0
    if duration is None:
        duration = last + 3600.0
    elif faults and last >= duration:
        raise ConfigError(path, "duration", None,
                          f"the last fault ({last:g} s) is not within the duration "
                          f"({duration:g} s)")
    return Trace(tuple(faults), float(duration), source)


CSV_COLUMNS = ("time", "node", "kind", "code", "category", "warning", "lead", "repair")


def _from_csv(text: str, path: str) -> Trace:
    rows = list(csv.reader(io.StringIO(text)))
    lines = [i + 1 for i, row in enumerate(rows) if row and not row[0].startswith("#")]
    kept = [row for row in rows if row and not row[0].startswith("#")]
    if not kept:
        raise ConfigError(path, "", 1, f"empty: a header ({','.join(CSV_COLUMNS[:3])}, ...) "
                          "and one fault per line")
    header = [h.strip() for h in kept[0]]
    for column in header:
        if column not in CSV_COLUMNS:
            raise ConfigError(path, column, lines[0],
                              f"unknown column (columns: {', '.join(CSV_COLUMNS)})")
    for column in CSV_COLUMNS[:3]:
        if column not in header:
            raise ConfigError(path, column, lines[0], "missing required column")
    faults = []
    for line, row in zip(lines[1:], kept[1:], strict=True):
        if len(row) > len(header):
            raise ConfigError(path, "", line, f"{len(row)} values for {len(header)} columns")
        values = {h: v.strip() for h, v in zip(header, row, strict=False) if v.strip()}
        faults.append(_csv_fault(values, path, line))
    return _trace(faults, None, path, path)


def _csv_fault(values: dict[str, str], path: str, line: int) -> Fault:
    def fail(column: str, message: str) -> ConfigError:
        return ConfigError(path, column, line, message)

    for column in CSV_COLUMNS[:3]:
        if column not in values:
            raise fail(column, "missing value")
    try:
        time = parse_duration_text(values["time"])
    except ValueError as err:
        raise fail("time", str(err)) from None
    kind = values["kind"]
    if kind not in KINDS:
        raise fail("kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")
    code = None
    if "code" in values:
        if not values["code"].isdigit():
            raise fail("code", f"expected an XID code, got {values['code']!r}")
        code = int(values["code"])
    warning = None
    if "warning" in values:
        if values["warning"] not in SIGNALS:
            raise fail("warning", f"must be one of {', '.join(SIGNALS)}; "
                                  f"got {values['warning']!r}")
        try:
            lead = parse_duration_text(values.get("lead", ""))
        except ValueError as err:
            raise fail("lead", f"a warning needs its lead: {err}") from None
        warning = _WarningEntry(values["warning"], Duration(lead))  # type: ignore[arg-type]
    repair = None
    if "repair" in values:
        try:
            repair = Duration(parse_duration_text(values["repair"]))
        except ValueError as err:
            raise fail("repair", str(err)) from None
    entry = _Entry(time=Duration(time), node=values["node"], kind=kind,  # type: ignore[arg-type]
                   code=code, category=values.get("category", ""), warning=warning,
                   repair=repair)
    return _fault(entry, lambda message: fail("", message))


#: Controller rules (the default ones) and what their incidents mean in a trace.
RULE_KINDS: dict[str, tuple[Kind, int | None]] = {
    "fatal-xid": ("xid", 79), "gpu-lost": ("xid", 79), "gpu-fallen-off-bus": ("xid", 79),
    "ecc-uncorrectable": ("xid", 48), "row-remap-failed": ("xid", 64),
    "node-lost": ("node-lost", None), "ib-port-down": ("ib-link", None),
    "job-hang": ("hang", None),
}
RULE_SIGNALS: dict[str, Signal] = {
    "pending-row-remap": "row-remap-pending", "thermal-slowdown-repeated": "thermal",
    "gpu-overheat": "thermal", "ib-symbol-errors": "symbol-errors",
}
#: A warning counts for a fault on the same node at most this long after it.
WARNING_HORIZON = 6 * 3600.0


def _from_incidents(text: str, path: str) -> Trace:
    """The incidents a controller recorded: faults, and the warnings before them."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(path, "", err.lineno, f"invalid JSON: {err.msg}") from None
    if isinstance(data, dict) and isinstance(data.get("incidents"), list):
        data = data["incidents"]
    if not isinstance(data, list):
        raise ConfigError(path, "", 1, "expected the list GET /api/v1/incidents returns")
    rows = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ConfigError(path, f"[{i}]", None, "an incident is a mapping")
        for key in ("rule", "node", "observed_at"):
            if key not in item:
                raise ConfigError(path, f"[{i}].{key}", None, "missing")
        if not isinstance(item["observed_at"], int | float):
            raise ConfigError(path, f"[{i}].observed_at", None, "expected seconds")
        rows.append(item)
    if not rows:
        return Trace((), 3600.0, path)
    start = min(float(r["observed_at"]) for r in rows)
    warnings: dict[str, list[tuple[float, Signal]]] = {}
    faults: list[Fault] = []
    for row in sorted(rows, key=lambda r: float(r["observed_at"])):
        at = float(row["observed_at"]) - start
        node = str(row["node"]).removeprefix("job:")
        signal = RULE_SIGNALS.get(str(row["rule"]))
        if signal is not None:
            warnings.setdefault(node, []).append((at, signal))
            continue
        meaning = RULE_KINDS.get(str(row["rule"]))
        if meaning is None:
            continue
        kind, code = meaning
        before = [(t, s) for t, s in warnings.get(node, ()) if 0 < at - t <= WARNING_HORIZON]
        warning = Warning(before[0][1], at - before[0][0]) if before else None
        closed = row.get("closed_at")
        repair = (float(closed) - float(row["observed_at"])
                  if isinstance(closed, int | float) else DEFAULT_REPAIR)
        faults.append(Fault(time=round(at, 3), node=node, kind=kind, code=code,
                            category=str(row["rule"]), warning=warning,
                            repair=max(repair, 0.0) if kind in HARDWARE else 0.0))
    return _trace(faults, None, f"incidents recorded in {path}", path)


def retarget(trace: Trace, nodes: Sequence[str]) -> tuple[Trace, int]:
    """The trace on the job's ``nodes``: names it does not know take a node each, in order.

    A trace names nodes of the fleet it was recorded on; a fault hits a position in the
    job (the replay's node of the same name, else the next one). Returns the trace and
    how many of its node names were mapped.
    """
    known = set(nodes)
    mapping: dict[str, str] = {}
    for fault in trace.faults:
        if fault.node not in known and fault.node not in mapping:
            mapping[fault.node] = nodes[len(mapping) % len(nodes)]
    if not mapping:
        return trace, 0
    faults = tuple(replace(f, node=mapping.get(f.node, f.node)) for f in trace.faults)
    return replace(trace, faults=faults), len(mapping)


def parse_trace_text(text: str, path: str) -> Trace:
    """A YAML trace given as text (tests, the API)."""
    return _from_yaml(parse_yaml(text, path))
