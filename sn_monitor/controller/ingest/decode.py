"""Report ingest: decode, check who sent it, keep each node's latest view.

Decoding is msgspec's: a bad report is refused with a message naming the field. The
sender is checked against the token's identity; sequence numbers from one agent
instance must increase (duplicates and reordered reports are answered, not applied).
Detection uses the controller's receive time, never the agent's clock.

What hostile or broken input gets (see also docs/controller/hostile-input.md):

- an empty body, bytes that are not UTF-8 JSON, a JSON value other than an object:
  400 (malformed) or 422 (naming the field), never more;
- a number out of the wire's bounds (:mod:`sn_monitor.model`), or a GPU, port or
  interface listed twice: 422 naming the field; an event listed twice counts once;
- a timestamp far from the controller's clock is *accepted*: the report's times are
  mapped onto the controller's clock (:func:`controller_times`), so an agent whose clock
  is an hour ahead neither makes detection latency negative nor pushes a fault into the
  future, and one that is years behind does not date a fault years back;
- a duplicate or an older sequence number of the same agent instance, and a report of an
  agent instance that another one has replaced on that node: answered (events stored and
  acknowledged, commands delivered) but not applied;
- a node "renaming itself" (the same agent instance reporting under another name) is
  another node: the node name is the identity, vouched for by the token (an agent token
  bound to its node's name refuses the new one with 403; one ``simulate`` process is one
  instance for thousands of nodes). The old name stops reporting and is treated as any
  silent node: lost after ``heartbeat_timeout``, through the safety policy.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, NamedTuple, get_args, get_type_hints

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.controller.errors import Invalid, Malformed
from sn_monitor.model import MAX_COUNTER_NAME, EventRecord, IbPortReport, Report
from sn_monitor.rules.view import NodeState, NodeView, named_parts

#: A report's sample time this far behind the controller's clock, or more, is not taken
#: as it is: the agent's clock is wrong, or the report is very late; either way the
#: controller's receive time is the better reference (see :func:`controller_times`).
MAX_REPORT_LAG_SECONDS: Final = 300.0
#: Events dated more than this before the controller's clock (after the correction) are
#: taken as this old: a spool outlives a controller outage of hours, not of years.
MAX_EVENT_AGE_SECONDS: Final = 86_400.0
#: An agent instance whose first sample time was this far ahead of the controller's clock
#: has a clock that cannot tell which of two instances of a node came first.
ORDER_TOLERANCE_SECONDS: Final = 60.0
#: Agent instances a node remembers as replaced (their late reports are not applied).
REPLACED_INSTANCES: Final = 8
#: Report intervals after which a node's current agent instance counts as stopped: any
#: other instance that reports then takes its place, whatever its clock or history, so
#: that no sequence of reports can lock a node's live agent out for longer.
SILENT_INTERVALS: Final = 3.0


def _strict_twin() -> type[msgspec.Struct]:
    """:class:`Report` with the bound on counter names in its type, as the schema states it.

    ``Report`` leaves that bound out of its annotation (see :class:`IbPortReport`), and
    :func:`decode_report` checks it after decoding. A body that fails either is decoded
    again as this twin, so that the error is the first fault in the body, as it was when
    ``Report`` itself held the bound (tests/unit/test_hostile_input.py checks both agree).
    """
    def twin(struct: type[msgspec.Struct], replace: dict[str, Any]) -> type[msgspec.Struct]:
        hints = get_type_hints(struct, include_extras=True)
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        for f in msgspec.structs.fields(struct):
            hint = replace.get(f.name, hints[f.name])
            if f.default is not msgspec.NODEFAULT:
                fields.append((f.name, hint, f.default))
            elif f.default_factory is not msgspec.NODEFAULT:
                fields.append((f.name, hint, msgspec.field(default_factory=f.default_factory)))
            else:
                fields.append((f.name, hint))
        config = struct.__struct_config__
        return msgspec.defstruct(struct.__name__, fields, frozen=config.frozen,
                                 omit_defaults=config.omit_defaults,
                                 forbid_unknown_fields=config.forbid_unknown_fields, gc=False)

    def annotated(hint: Any, inner: Any) -> Any:  # Annotated[inner, <hint's constraints>]
        return Annotated[(inner, *get_args(hint)[1:])]

    counters = get_type_hints(IbPortReport, include_extras=True)["counters"]
    value = get_args(get_args(counters)[0])[1]
    name = Annotated[str, msgspec.Meta(max_length=MAX_COUNTER_NAME)]
    port = twin(IbPortReport, {"counters": annotated(counters, dict[name, value])})  # type: ignore[valid-type]
    ports = get_type_hints(Report, include_extras=True)["infiniband"]
    return twin(Report, {"infiniband": annotated(ports, list[port])})  # type: ignore[valid-type]


_decoder = msgspec.json.Decoder(Report)
_strict_decoder = msgspec.json.Decoder(_strict_twin())
#: Counter names already found within MAX_COUNTER_NAME. msgspec hands out the same key
#: strings report after report, so checking a report's ~240 names is a set lookup each.
_short_names: set[str] = set()
_SHORT_NAMES_LIMIT: Final = 4096


def _names_within_bound(ports: list[IbPortReport]) -> bool:
    """Whether every counter name of ``ports`` is at most MAX_COUNTER_NAME long."""
    known = _short_names
    for port in ports:
        if not known.issuperset(port.counters):
            if any(len(name) > MAX_COUNTER_NAME for name in port.counters):
                return False
            if len(known) >= _SHORT_NAMES_LIMIT:  # bounded: the names come from the wire
                known.clear()
            known.update(port.counters)
    return True


def _decode(body: bytes) -> Report:
    """``body`` as a Report within the whole contract, or the error of its first fault."""
    try:
        report = _decoder.decode(body)
    except (msgspec.DecodeError, RecursionError):
        # A counter name too long may come before the fault this decode stopped at.
        _strict_decoder.decode(body)
        raise  # not reached: the twin refuses whatever Report refuses
    if not _names_within_bound(report.infiniband):
        _strict_decoder.decode(body)  # raises, naming the first name too long
        raise msgspec.ValidationError(  # not reached
            f"Expected `str` of length <= {MAX_COUNTER_NAME} - in `$.infiniband`")
    return report


def decode_report(body: bytes) -> Report:
    """Decode and validate one report; Malformed or Invalid naming the field.

    Nothing else escapes, whatever ``body`` holds (tests/unit/test_hostile_input.py).
    """
    try:
        report = _decode(body)
    except msgspec.ValidationError as err:
        raise Invalid(f"invalid report: {err}") from None
    except msgspec.DecodeError as err:
        if not body.strip():
            raise Malformed("malformed JSON: the body is empty, "
                            "expected a report (a JSON object)") from None
        raise Malformed(f"malformed JSON: {err}") from None
    except RecursionError:  # msgspec skipping a deeply nested value; the types stop it first
        raise Malformed("malformed JSON: nested too deeply") from None
    _check_unique(report)
    if report.events_only:
        _check_events_only(report)
    return report


#: What an events-only report must leave out: it carries no sample (see ``Report``).
_SAMPLE_FIELDS: Final = ("gpus", "infiniband", "network", "host", "findings", "topology")


def _check_events_only(report: Report) -> None:
    """Refuse an events-only report that carries a sample's values (Invalid, naming it).

    Its values would be judged as a sample by no rule and kept as the node's latest by
    none: a field that says one thing and means nothing is refused instead.
    """
    for name in _SAMPLE_FIELDS:
        if getattr(report, name):
            raise Invalid(f"invalid report: an events_only report carries no sample, "
                          f"so `$.{name}` must be left out")
    if not report.events:
        raise Invalid("invalid report: an events_only report carries at least one event "
                      "- at `$.events`")


def _check_unique(report: Report) -> None:
    """Refuse a report that lists one GPU, port or interface twice (Invalid, naming it).

    Two values for one subject in one report would make a rule fire and resolve within
    the report, opening and closing an incident (and its actions) on every report.
    """
    gpus, ports, nets = report.gpus, report.infiniband, report.network
    if len(gpus) > 1 and len({g.index for g in gpus}) < len(gpus):
        _twice([g.index for g in gpus], "GPU index {}", "$.gpus[{}].index")
    if len(ports) > 1 and len({(p.device, p.port) for p in ports}) < len(ports):
        _twice([(p.device, p.port) for p in ports], "InfiniBand port {}", "$.infiniband[{}]")
    if len(nets) > 1 and len({n.device for n in nets}) < len(nets):
        _twice([n.device for n in nets], "network device {!r}", "$.network[{}].device")


def _twice(keys: list[Any], what: str, where: str) -> None:
    seen: set[Any] = set()
    for i, key in enumerate(keys):
        if key in seen:
            raise Invalid(f"invalid report: {what.format(key)} is listed twice "
                          f"- at `{where.format(i)}`")
        seen.add(key)


def controller_times(report: Report, now: float) -> Report:
    """``report`` with its agent timestamps mapped onto the controller's wall clock ``now``.

    The agent's clock is trusted only as far as it agrees with the controller's:

    - a sample time in the future (the agent's clock is ahead), or more than
      :data:`MAX_REPORT_LAG_SECONDS` in the past (its clock is behind, or the report is
      that late), becomes ``now``, and the report's events move by the same amount, so
      that they keep their spacing and their distance from the sample;
    - an event time still after ``now`` becomes ``now``; one more than
      :data:`MAX_EVENT_AGE_SECONDS` before it becomes that old;
    - an event listed twice (one id) is kept once, as the store keeps it.

    So a fault is never observed after it was detected (no negative detection latency)
    nor dated absurdly far back. ``report`` itself is returned when nothing changes (the
    common case: two comparisons).
    """
    sample = report.sample_time_seconds
    moves = not 0.0 <= now - sample < MAX_REPORT_LAG_SECONDS
    events = report.events
    if not moves and not events:
        return report  # the common case
    oldest = now - MAX_EVENT_AGE_SECONDS
    if not moves and all(oldest <= e.time_seconds <= now for e in events) and (
            len(events) < 2 or len({e.id for e in events}) == len(events)):
        return report
    moved: list[EventRecord] = []
    ids: set[int] = set()
    for event in events:
        if event.id in ids:
            continue  # listed twice in one report: one event (the store keeps one too)
        ids.add(event.id)
        # moved, its distance from the sample kept (computed on the agent's own clock,
        # where both are of one magnitude, so a clock at 1e300 loses no more than it had)
        at = now + (event.time_seconds - sample) if moves else event.time_seconds
        at = min(now, max(oldest, at))
        moved.append(event if at == event.time_seconds else _moved(event, at))
    findings = report.findings
    if moves and findings:  # first seen by the agent: as far from the sample as there
        findings = [msgspec.structs.replace(f, observed_seconds=min(
            now, max(oldest, now + (f.observed_seconds - sample)))) for f in findings]
    return msgspec.structs.replace(report, sample_time_seconds=now if moves else sample,
                                   events=moved, findings=findings)


def _moved(event: EventRecord, at: float) -> EventRecord:
    """``event`` at ``at``; a job log line's own time stamp moves by as much."""
    line_time = event.line_time_seconds
    if line_time is None:
        return msgspec.structs.replace(event, time_seconds=at)
    return msgspec.structs.replace(event, time_seconds=at,
                                   line_time_seconds=line_time + (at - event.time_seconds))


def _with_events(last: Report | None, arrived: Report) -> Report:
    """The node's last sample with the events of an events-only report that ``arrived``.

    The view the rules judge keeps the sample's values and time (no sample came); its
    events, sequence and labels are the new report's. A node with no sample yet is
    judged on the events-only report itself.
    """
    if last is None:
        return arrived
    return msgspec.structs.replace(last, events=arrived.events, sequence=arrived.sequence,
                                   instance=arrived.instance, labels=arrived.labels)


class Accepted(NamedTuple):
    """What ingest did with a report: ``applied`` False for a duplicate or a stale one.

    A named tuple: one is made per report, 8,192 a second, and a frozen dataclass costs
    several times as much to build.
    """

    view: NodeView
    applied: bool
    new_node: bool
    labels_changed: bool


class _Sender:
    """The agent instance a node's reports come from, and the instances it replaced."""

    __slots__ = ("first_sample", "instance", "interval", "replaced", "sequence")

    def __init__(self, report: Report, now: float, replaced: tuple[str, ...] = ()) -> None:
        self.instance = report.instance
        self.sequence = report.sequence
        self.interval = report.interval_seconds
        sample = report.sample_time_seconds
        # The first sample time of an instance orders a newcomer against it, if the
        # agent's clock was believable then; a clock far ahead orders nothing.
        self.first_sample = (sample if sample <= now + ORDER_TOLERANCE_SECONDS
                             else -math.inf)
        self.replaced = replaced

    def takes(self, report: Report, silent: float) -> bool:
        """Whether ``report`` is newer than what the node has applied.

        ``silent``: seconds since the node's last applied report (controller clock).
        """
        if report.instance == self.instance:
            return report.sequence > self.sequence
        if silent > SILENT_INTERVALS * self.interval:
            return True  # the current instance stopped: whoever reports now is the node
        # Another instance while the current one reports: a replaced one is gone for good
        # (a late report from before an agent restart); a new one replaces the current
        # one unless the node's own clock says it ran before it.
        return (report.instance not in self.replaced
                and report.sample_time_seconds >= self.first_sample)


class NodeRegistry:
    """Every node's latest report and receive time, in memory (the store keeps the rest)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._views: dict[str, NodeView] = {}
        self._senders: dict[str, _Sender] = {}

    def accept(self, report: Report) -> Accepted:
        """Apply ``report`` unless it is older than what this node already applied.

        Its timestamps are mapped onto the controller's clock first
        (:func:`controller_times`): the view keeps that copy, for the rules. An
        events-only report brings its events into the view and leaves the last sample's
        values and receive time as they were: it is no sample, and no heartbeat.
        """
        now_mono = self._clock.monotonic()
        now_wall = self._clock.time()
        with self._lock:
            view = self._views.get(report.node)
            new_node = view is None
            if view is None:
                view = NodeView(name=report.node, labels=dict(report.labels))
                self._views[report.node] = view
            sender = self._senders.get(report.node)
            if sender is None:
                self._senders[report.node] = _Sender(report, now_wall)
            elif not sender.takes(report, now_mono - view.received_monotonic):
                return Accepted(view, False, False, False)
            elif report.instance == sender.instance:
                sender.sequence = report.sequence
            else:
                replaced = tuple(i for i in (*sender.replaced, sender.instance)
                                 if i != report.instance)[-REPLACED_INSTANCES:]
                self._senders[report.node] = _Sender(report, now_wall, replaced)
            # compared with the last report's own labels: the controller may add some to
            # the view (the node's job) that the agent does not send
            before = view.report.labels if view.report is not None else None
            labels_changed = not new_node and before is not None and before != report.labels
            if labels_changed or new_node or before is None:
                view.labels = dict(report.labels)
            if report.events_only:
                view.report = _with_events(view.report, controller_times(report, now_wall))
                view.named = named_parts(view.report, view.named)
                return Accepted(view, True, new_node, labels_changed)
            if (report.rules_version and view.report is not None and not report.gpus
                    and not report.infiniband and not report.network):
                # its agent sends the values the rules here read every few reports only
                old = view.report
                report = msgspec.structs.replace(report, gpus=old.gpus,
                                                 infiniband=old.infiniband,
                                                 network=old.network)
            view.report = controller_times(report, now_wall)
            view.named = named_parts(report, view.named)
            view.received_monotonic = now_mono
            view.received_wall = now_wall
            return Accepted(view, True, new_node, labels_changed)

    def restore(self, name: str, labels: Mapping[str, str], state: NodeState) -> NodeView:
        """A node known from the store before its first report since a restart.

        Its heartbeat clock starts now: a controller restart must not declare every
        node lost before they had a chance to report.
        """
        with self._lock:
            view = self._views.get(name)
            if view is None:
                view = NodeView(name=name, labels=dict(labels),
                                received_monotonic=self._clock.monotonic(),
                                received_wall=self._clock.time())
                self._views[name] = view
            view.state = state
            return view

    def heard_from(self, names: Iterable[str]) -> None:
        """These nodes reported again what they reported last: only the time moves.

        For a replay on a virtual clock (``sn-monitor goodput``), where the agents of a
        healthy fleet send thousands of identical reports between two faults: what the
        rules would make of an unchanged report is nothing, so it is not decoded or
        judged, and only the silence it ends (the heartbeat rules) is.
        """
        now_mono = self._clock.monotonic()
        now_wall = self._clock.time()
        with self._lock:
            for view in map(self._views.get, names):
                if view is not None and view.report is not None:
                    view.received_monotonic = now_mono
                    view.received_wall = now_wall

    def views(self) -> dict[str, NodeView]:
        """A copy of the node map (the views themselves are live)."""
        with self._lock:
            return dict(self._views)

    def names(self) -> frozenset[str]:
        """Every known node's name."""
        with self._lock:
            return frozenset(self._views)

    def get(self, name: str) -> NodeView | None:
        with self._lock:
            return self._views.get(name)

    def __len__(self) -> int:
        return len(self._views)
