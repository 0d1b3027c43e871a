"""Template mining per job: the kinds of line a job prints, and when one is new or bursting.

A line is masked (times, UUIDs, IP addresses, paths, hex, numbers become ``<TIME>``,
``<UUID>``, ``<IP>``, ``<PATH>``, ``<HEX>``, ``<NUM>``), split on blanks and clustered with
Drain (He et al., ICWS 2017): a tree of fixed depth leads from the token count and the
first ``leading_tokens`` tokens to a short list of templates; the line joins the most
similar one (the share of positions with equal tokens, at least ``similarity``), whose
differing positions become ``<*>``, or starts a new one. This is our own implementation of
the published algorithm (docs/jobs/log-templates.md says why not Drain3).

Kept parameters: where a line's meaning is in a value (``exitcode: -9`` against
``exitcode: 1``, ``signal 9`` against ``signal 15``, a loss scale reduced *to 1*, a
``nan`` loss), a :class:`KeptParameter` (a regex with one group that can only match a small
closed set of values, or a class of values under one label) writes the value as a pinned
token ``<name=value>``. A pinned token
is never masked, never becomes ``<*>``, and a template matches a line only if their
pinned tokens are equal, so such lines never merge.

A :class:`JobTemplates` (one per job) reports a ``new-template`` finding when a line starts
a template never seen in the job's history once the warm-up is over (``warmup_lines`` lines
*and* ``warmup_seconds`` since the job's first line), and a ``template-burst`` finding when
a template's count in the sliding window is at least ``burst_min_count`` and its rate there
is over ``burst_factor`` times its rate over the job's life (once per burst).

Invariants: everything is bounded by the settings (templates per job, least recently seen
evicted first; tokens and characters per line; children per tree node; a fixed ring of
window buckets per template), so a job that prints anything cannot grow it. The state is
plain JSON with a format and version field, validated whole on load
(:class:`TemplateStateError` names the file, the key and what is wrong; nothing in it is
ever executed) and written atomically. This module imports nothing else from
:mod:`sn_monitor.joblog`.
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sn_monitor.clock import Clock, SystemClock
from sn_monitor.durable import write_atomically
from sn_monitor.errors import SnMonitorError
from sn_monitor.joblog.template_settings import TemplateSettings

WILDCARD = "<*>"
STATE_FORMAT = "sn-monitor-job-templates"
STATE_VERSION = 1
FindingKind = Literal["new-template", "template-burst"]

_PINNED = re.compile(r"<[a-z][a-z0-9-]*=[^<>\s]+>")
#: The masks, in the order they apply: each replaces what it matches with its name. Each
#: pattern starts with a character class and checks the character before it with a
#: lookbehind *after* that first character, so that the regex engine can skip to candidate
#: characters (a third faster than leading lookbehinds, with the same matches).
MASKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("<TIME>", re.compile(r"\d(?:\d{3}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
                          r"|(?<![\w:]\d)\d:\d\d:\d\d(?:[.,]\d+)?(?![\w:]))")),
    ("<UUID>", re.compile(r"[0-9a-fA-F](?<!\w[0-9a-fA-F])[0-9a-fA-F]{7}(?:-[0-9a-fA-F]{4}){3}"
                          r"-[0-9a-fA-F]{12}\b")),
    ("<IP>", re.compile(r"\d(?<![\w.]\d)\d{0,2}(?:\.\d{1,3}){3}(?::\d{1,5})?(?![\w.])"
                        r"|\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\](?::\d{1,5})?")),
    ("<PATH>", re.compile(r"/(?<![\w./~]/)[\w.@+%~-]+(?:/[\w.@+%~-]+)+/?")),
    ("<HEX>", re.compile(r"0(?<!\w0)x[0-9a-fA-F]+\b"
                         r"|[0-9a-f](?<![\w.][0-9a-f])(?:(?<=\d)|(?=[a-f]*\d))"
                         r"(?:(?<=[a-f])|(?=\d*[a-f]))[0-9a-f]{7,}\b")),
    ("<NUM>", re.compile(r"[-+\d](?<![\w.][-+\d])(?:(?<=\d)|\d)\d*(?:\.\d+)?(?:[eE][-+]?\d+)?"
                         r"(?:[KMGT]i?B|[mun]?s|%)?(?!\w)(?!\.\d)")),
)


class TemplateStateError(SnMonitorError):
    """A saved template state that cannot be used: which file, which key, what is wrong."""

    def __init__(self, file: str, key: str, message: str) -> None:
        self.file = file
        self.key = key
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        key = f" {self.key}:" if self.key else ""
        return f"{self.file}:{key} {self.message}"


@dataclass(frozen=True)
class TemplateFinding:
    """A template that is new in this job's history, or bursting."""

    kind: FindingKind
    template_id: int
    template: str
    count: int
    first_seen: float
    last_seen: float
    window_count: int
    line: str


@dataclass(frozen=True)
class TemplateSummary:
    """One template as the job knows it now."""

    template_id: int
    template: str
    count: int
    first_seen: float
    last_seen: float


def is_pinned(token: str) -> bool:
    """Whether a token holds a kept parameter (``<name=value>``): it must match exactly."""
    return "=" in token and _PINNED.search(token) is not None


def _is_variable(token: str) -> bool:
    """Whether a token routes to ``<*>`` in the tree: a mask, a wildcard or digits."""
    if is_pinned(token):
        return False
    return "<" in token or any(ch.isdigit() for ch in token)


class LineMasker:
    """Line -> tokens: kept parameters pinned, the other variable parts masked, bounded."""

    def __init__(self, settings: TemplateSettings) -> None:
        self._kept = [(kept.name, re.compile(kept.pattern), kept.hints, kept.label)
                      for kept in settings.kept]
        self._max_chars = settings.max_line_chars
        self._max_tokens = settings.max_tokens

    def tokens(self, line: str) -> list[str]:
        """The line's tokens (at most ``max_tokens``, from its first ``max_line_chars``)."""
        text = line[: self._max_chars]
        pieces: list[str] = []
        end = 0
        for start, stop, pinned in self._pinned_spans(text):
            pieces.append(_mask(text[end:start]))
            pieces.append(pinned)
            end = stop
        pieces.append(_mask(text[end:]))
        return "".join(pieces).split()[: self._max_tokens]

    def _pinned_spans(self, text: str) -> list[tuple[int, int, str]]:
        """The kept parameters' values in ``text``: (start, end, pinned token), in order."""
        spans: list[tuple[int, int, str]] = []
        lower = text.lower()
        for name, pattern, hints, label in self._kept:
            if hints and not any(hint in lower for hint in hints):
                continue
            for match in pattern.finditer(text):
                start, stop = match.span(1)
                if start >= 0:
                    value = label or "_".join(match.group(1).split())
                    spans.append((start, stop, f"<{name}={value}>"))
        spans.sort()
        kept: list[tuple[int, int, str]] = []
        for span in spans:
            if not kept or span[0] >= kept[-1][1]:
                kept.append(span)
        return kept


def _mask(text: str) -> str:
    for name, pattern in MASKS:
        text = pattern.sub(name, text)
    return text


@dataclass(slots=True)
class _Template:
    """A template and what the job knows of it (mutable: updated on every line it takes)."""

    template_id: int
    tokens: list[str]
    route: tuple[str, ...]
    count: int
    first_seen: float
    last_seen: float
    window: list[int]
    window_epoch: int
    bursting: bool = False

    @property
    def text(self) -> str:
        return " ".join(self.tokens)

    def summary(self) -> TemplateSummary:
        return TemplateSummary(self.template_id, self.text, self.count, self.first_seen,
                               self.last_seen)


@dataclass(slots=True)
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    template_ids: list[int] = field(default_factory=list)


def _similarity(template: Sequence[str], tokens: Sequence[str]) -> tuple[float, int]:
    """Drain's similarity (equal tokens / length), wildcards; -1 where a pinned token differs.

    A ``<*>`` does not take a pinned token either: the kept value is the line's meaning.
    """
    equal = wildcards = 0
    for mine, theirs in zip(template, tokens, strict=True):
        if mine == theirs:
            equal += mine != WILDCARD
            wildcards += mine == WILDCARD
        elif is_pinned(theirs) or is_pinned(mine):
            return -1.0, 0
        elif mine == WILDCARD:
            wildcards += 1
    return equal / len(tokens), wildcards


class TemplateTree:
    """Drain's fixed-depth tree over at most ``max_templates`` templates, least recent evicted."""

    def __init__(self, settings: TemplateSettings) -> None:
        self._settings = settings
        self._roots: dict[int, _Node] = {}
        self._templates: OrderedDict[int, _Template] = OrderedDict()
        self.next_id = 1

    def __len__(self) -> int:
        return len(self._templates)

    def __iter__(self) -> Iterator[_Template]:
        """Least recently seen first."""
        return iter(self._templates.values())

    def node_count(self) -> int:
        """The tree's nodes: at most ``max_templates`` x (``leading_tokens`` + 1)."""
        count, stack = 0, list(self._roots.values())
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count

    def children_counts(self) -> list[int]:
        """How many children each node has (each at most ``max_children``)."""
        counts, stack = [], list(self._roots.values())
        while stack:
            node = stack.pop()
            counts.append(len(node.children))
            stack.extend(node.children.values())
        return counts

    def match(self, tokens: Sequence[str]) -> _Template | None:
        """The most similar template at or over the threshold, without learning anything."""
        node = self._roots.get(len(tokens))
        for token in tokens[: self._settings.leading_tokens]:
            if node is None:
                return None
            node = node.children.get(token) or node.children.get(WILDCARD)
        if node is None:
            return None
        best: _Template | None = None
        best_key = (self._settings.similarity, -1)
        for template_id in node.template_ids:
            template = self._templates[template_id]
            key = _similarity(template.tokens, tokens)
            if key >= best_key:
                best, best_key = template, key
        return best

    def learn(self, tokens: list[str], at: float, buckets: int) -> tuple[_Template, bool]:
        """Add a line's tokens: (its template, whether the template is new)."""
        template = self.match(tokens)
        if template is not None:
            for i, (mine, theirs) in enumerate(zip(template.tokens, tokens, strict=True)):
                if mine != theirs:
                    template.tokens[i] = WILDCARD
            self._templates.move_to_end(template.template_id)
            return template, False
        template = _Template(self.next_id, list(tokens), self._route(tokens), 0, at, at,
                             [0] * buckets, 0)
        self.next_id += 1
        self.add(template)
        return template, True

    def add(self, template: _Template) -> None:
        """Place a template at its route (the newest), evicting the least recent if full."""
        while len(self._templates) >= self._settings.max_templates:
            self._evict(next(iter(self._templates)))
        node = self._roots.setdefault(len(template.tokens), _Node())
        for key in template.route:
            child = node.children.get(key)
            if child is None:
                named = sum(k != WILDCARD for k in node.children)
                if key != WILDCARD and named >= self._settings.max_children - 1:
                    raise ValueError(f"more than {self._settings.max_children} children")
                child = node.children[key] = _Node()
            node = child
        node.template_ids.append(template.template_id)
        self._templates[template.template_id] = template

    def _route(self, tokens: Sequence[str]) -> tuple[str, ...]:
        """The keys a new template is filed under: a token, or ``<*>`` (variable, or full)."""
        node: _Node | None = self._roots.get(len(tokens))
        route = []
        for token in tokens[: self._settings.leading_tokens]:
            key = WILDCARD if _is_variable(token) else token
            if node is not None and key not in node.children:
                named = sum(k != WILDCARD for k in node.children)
                if named >= self._settings.max_children - 1:
                    key = WILDCARD
            route.append(key)
            node = node.children.get(key) if node is not None else None
        return tuple(route)

    def _evict(self, template_id: int) -> None:
        template = self._templates.pop(template_id)
        path = [self._roots[len(template.tokens)]]
        for key in template.route:
            path.append(path[-1].children[key])
        path[-1].template_ids.remove(template_id)
        for depth in range(len(path) - 1, 0, -1):
            if path[depth].children or path[depth].template_ids:
                break
            del path[depth - 1].children[template.route[depth - 1]]
        if not path[0].children and not path[0].template_ids:
            del self._roots[len(template.tokens)]


class JobTemplates:
    """One job's templates: feed it the job's lines, read the findings they make."""

    def __init__(self, settings: TemplateSettings | None = None,
                 clock: Clock | None = None) -> None:
        self.settings = settings or TemplateSettings()
        self._clock = clock or SystemClock()
        self._masker = LineMasker(self.settings)
        self.tree = TemplateTree(self.settings)
        self.lines = 0
        self.first_at: float | None = None
        self.latest_at: float | None = None
        self.warm = False

    def observe(self, line: str, at: float | None = None) -> tuple[TemplateFinding, ...]:
        """Learn one line (printed at ``at``, the clock's wall time if None); its findings."""
        tokens = self._masker.tokens(line)
        if not tokens:
            return ()
        when = self._clock.time() if at is None else at
        if not math.isfinite(when):
            raise ValueError(f"a line's time must be a finite number, got {when}")
        self.first_at = when if self.first_at is None else min(self.first_at, when)
        self.latest_at = when if self.latest_at is None else max(self.latest_at, when)
        if not self.warm and self.lines >= self.settings.warmup_lines \
                and when - self.first_at >= self.settings.warmup_seconds:
            self.warm = True
        self.lines += 1
        template, new = self.tree.learn(tokens, when, self.settings.burst_buckets)
        window_count = self._count(template, when)
        findings: list[TemplateFinding] = []
        if new and self.warm:
            findings.append(self._finding("new-template", template, window_count, line))
        life = max(self.latest_at - self.first_at, self.settings.burst_window_seconds)
        if self.warm and self._bursts(template, window_count, life):
            findings.append(self._finding("template-burst", template, window_count, line))
        return tuple(findings)

    def template_of(self, line: str) -> str | None:
        """The template a line would join now (learning nothing), or None for a new one."""
        template = self.tree.match(self._masker.tokens(line))
        return None if template is None else template.text

    def summaries(self) -> list[TemplateSummary]:
        """Every template the job holds, least recently seen first."""
        return [template.summary() for template in self.tree]

    def _count(self, template: _Template, at: float) -> int:
        """Count the line in the template and its window; the window's count."""
        template.count += 1
        template.first_seen = min(template.first_seen, at)
        template.last_seen = max(template.last_seen, at)
        buckets = len(template.window)
        index = math.floor(at / self.settings.bucket_seconds)
        if template.count == 1 or index - template.window_epoch >= buckets:
            template.window[:] = [0] * buckets
            template.window_epoch = index
        for step in range(template.window_epoch + 1, index + 1):
            template.window[step % buckets] = 0
        template.window_epoch = max(template.window_epoch, index)
        if index > template.window_epoch - buckets:
            template.window[index % buckets] += 1
        return sum(template.window)

    def _bursts(self, template: _Template, window_count: int, life: float) -> bool:
        """Whether a burst starts now: over the bounds, not already bursting (hysteresis).

        ``life`` is the job's age in seconds (at least one window): the long-run rate is the
        template's count over it.
        """
        ratio = (window_count / self.settings.burst_window_seconds) / (template.count / life)
        factor, least = self.settings.burst_factor, self.settings.burst_min_count
        if template.bursting:
            template.bursting = ratio > factor / 2 and window_count >= least / 2
            return False
        template.bursting = ratio > factor and window_count >= least
        return template.bursting

    @staticmethod
    def _finding(kind: FindingKind, template: _Template, window_count: int,
                 line: str) -> TemplateFinding:
        return TemplateFinding(kind, template.template_id, template.text, template.count,
                               template.first_seen, template.last_seen, window_count, line)

    def to_state(self) -> dict[str, Any]:
        """The job's templates as plain JSON data (templates least recently seen first)."""
        return {
            "format": STATE_FORMAT, "version": STATE_VERSION,
            "bucket_seconds": self.settings.bucket_seconds, "next_id": self.tree.next_id,
            "lines": self.lines, "first_at": self.first_at, "latest_at": self.latest_at,
            "warm": self.warm,
            "templates": [{"id": t.template_id, "tokens": t.tokens, "route": list(t.route),
                           "count": t.count, "first_seen": t.first_seen,
                           "last_seen": t.last_seen, "window": t.window,
                           "window_epoch": t.window_epoch, "bursting": t.bursting}
                          for t in self.tree],
        }

    @classmethod
    def from_state(cls, doc: object, source: str, settings: TemplateSettings | None = None,
                   clock: Clock | None = None) -> JobTemplates:
        """A job restored from :meth:`to_state`'s data; TemplateStateError if it is not that."""
        job = cls(settings, clock)
        _StateReader(source, job.settings).restore(doc, job)
        return job

    def save(self, path: Path) -> None:
        """Write the state to ``path`` atomically: a crash leaves the old file or the new."""
        write_atomically(path, json.dumps(self.to_state(), separators=(",", ":"),
                                          allow_nan=False).encode())

    @classmethod
    def load(cls, path: Path, settings: TemplateSettings | None = None,
             clock: Clock | None = None) -> JobTemplates:
        """A job restored from a file :meth:`save` wrote; TemplateStateError if it cannot be."""
        settings = settings or TemplateSettings()
        limit = state_size_limit(settings)
        source = str(path)
        try:
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
        except OSError as exc:
            raise TemplateStateError(source, "", f"cannot read: {exc.strerror}") from exc
        if len(data) > limit:
            raise TemplateStateError(source, "", f"larger than {limit} bytes, the most "
                                                 "these settings can write")
        try:
            doc = json.loads(data, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise TemplateStateError(source, "", f"not JSON: {exc}") from exc
        return cls.from_state(doc, source, settings, clock)


def state_size_limit(settings: TemplateSettings) -> int:
    """The most bytes a state written under ``settings`` can take (masks grow a line 5x)."""
    per_template = 5 * settings.max_line_chars + 8 * settings.max_tokens \
        + 24 * settings.burst_buckets + 512
    return 1024 + settings.max_templates * per_template


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


_TEMPLATE_KEYS = frozenset({"id", "tokens", "route", "count", "first_seen", "last_seen",
                            "window", "window_epoch", "bursting"})
_TOP_KEYS = frozenset({"format", "version", "bucket_seconds", "next_id", "lines", "first_at",
                       "latest_at", "warm", "templates"})


class _StateReader:
    """Checks every key, type and bound of a state document before any of it is used."""

    def __init__(self, source: str, settings: TemplateSettings) -> None:
        self.source = source
        self.settings = settings

    def fail(self, key: str, message: str) -> TemplateStateError:
        return TemplateStateError(self.source, key, message)

    def mapping(self, value: object, key: str, keys: frozenset[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected an object, got {type(value).__name__}")
        unknown = sorted(set(value) - keys)
        if unknown:
            raise self.fail(key, f"unknown key {unknown[0]!r} (a state holds only data)")
        missing = sorted(keys - set(value))
        if missing:
            raise self.fail(key, f"missing key {missing[0]!r}")
        return value

    def integer(self, value: object, key: str, least: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise self.fail(key, f"expected an integer >= {least}, got {value!r}")
        return value

    def number(self, value: object, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise self.fail(key, f"expected a number, got {value!r}")
        return float(value)

    def strings(self, value: object, key: str, most: int) -> list[str]:
        if not isinstance(value, list) or len(value) > most:
            raise self.fail(key, f"expected a list of at most {most} strings")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item or item.split() != [item]:
                raise self.fail(f"{key}[{i}]", f"expected a token (no blanks), got {item!r}")
        return value

    def restore(self, doc: object, job: JobTemplates) -> None:
        top = self.mapping(doc, "", _TOP_KEYS)
        if top["format"] != STATE_FORMAT:
            raise self.fail("format", f"expected {STATE_FORMAT!r}, got {top['format']!r}")
        if top["version"] != STATE_VERSION:
            raise self.fail("version", f"version {top['version']!r} is not {STATE_VERSION}")
        if self.number(top["bucket_seconds"], "bucket_seconds") != job.settings.bucket_seconds:
            raise self.fail("bucket_seconds", "written with another burst window; start afresh")
        job.tree.next_id = self.integer(top["next_id"], "next_id", 1)
        job.lines = self.integer(top["lines"], "lines")
        for name in ("first_at", "latest_at"):
            value = top[name]
            setattr(job, name, None if value is None else self.number(value, name))
        if not isinstance(top["warm"], bool):
            raise self.fail("warm", "expected true or false")
        job.warm = top["warm"]
        templates = top["templates"]
        if not isinstance(templates, list) or len(templates) > job.settings.max_templates:
            raise self.fail("templates", f"expected a list of at most "
                                         f"{job.settings.max_templates} templates")
        for i, item in enumerate(templates):
            template = self.template(item, f"templates[{i}]", job.tree.next_id)
            if any(t.template_id == template.template_id for t in job.tree):
                raise self.fail(f"templates[{i}].id", f"id {template.template_id} twice")
            try:
                job.tree.add(template)
            except ValueError as exc:
                raise self.fail(f"templates[{i}].route", str(exc)) from exc

    def template(self, value: object, key: str, next_id: int) -> _Template:
        item = self.mapping(value, key, _TEMPLATE_KEYS)
        settings = self.settings
        template_id = self.integer(item["id"], f"{key}.id", 1)
        if template_id >= next_id:
            raise self.fail(f"{key}.id", f"id {template_id} is not below next_id {next_id}")
        tokens = self.strings(item["tokens"], f"{key}.tokens", settings.max_tokens)
        if not tokens:
            raise self.fail(f"{key}.tokens", "a template has at least one token")
        route = self.strings(item["route"], f"{key}.route", settings.leading_tokens)
        if len(route) != min(len(tokens), settings.leading_tokens) or any(
                step not in (WILDCARD, token) for step, token in zip(route, tokens,
                                                                      strict=False)):
            raise self.fail(f"{key}.route", "not the template's leading tokens or <*> "
                                            "(written with other settings?)")
        window = item["window"]
        if not isinstance(window, list) or len(window) != settings.burst_buckets:
            raise self.fail(f"{key}.window", f"expected {settings.burst_buckets} counts")
        counts = [self.integer(n, f"{key}.window[{j}]") for j, n in enumerate(window)]
        if not isinstance(item["bursting"], bool):
            raise self.fail(f"{key}.bursting", "expected true or false")
        return _Template(template_id, list(tokens), tuple(route),
                         self.integer(item["count"], f"{key}.count", 1),
                         self.number(item["first_seen"], f"{key}.first_seen"),
                         self.number(item["last_seen"], f"{key}.last_seen"), counts,
                         self.integer(item["window_epoch"], f"{key}.window_epoch"),
                         item["bursting"])
