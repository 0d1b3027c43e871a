"""The Prometheus text format (0.0.4), rendered once per snapshot and served from memory.

The exporter builds :class:`Family` objects (name, type, help, label names, samples as
label-value tuples): lighter than client_python's metric families, which build a dict
and a named tuple per sample. :class:`TextRenderer` writes them exactly as
client_python's ``generate_latest`` writes gauges and counters, keeping the formatted
``name{labels}`` prefix of each series between renders (a GPU's labels do not change
from one sample to the next), so a render formats little more than the values.
:func:`to_metric` hands a family to client_python, for a registry.

The agent samples on its own clock, so every scrape between two samples would format
the same snapshot again. :class:`ExpositionCache` renders it once (and gzips it once for
scrapers that ask) and hands out the bytes.
"""

from __future__ import annotations

import gzip
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from prometheus_client.core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

FamilyType = Literal["gauge", "counter"]
#: Series prefixes a renderer keeps at most; past it, it starts over (label values that
#: churn, such as a controller URL list edited by hand, never grow it without bound).
MAX_CACHED_SERIES: Final = 50_000


class Family:
    """One metric family: its samples are (label values, value), in the order added.

    A counter is named without ``_total`` (the text adds it), as in client_python;
    ``total_suffix=False`` writes it as named, for names fixed elsewhere (dcgm-exporter's
    counters; :func:`to_metric` keeps client_python's naming).
    """

    __slots__ = ("documentation", "labelnames", "name", "samples", "total_suffix", "type")

    def __init__(self, name: str, documentation: str, kind: FamilyType,
                 labels: Sequence[str] = (), value: float | None = None, *,
                 total_suffix: bool = True) -> None:
        self.name = name
        self.documentation = documentation
        self.type: FamilyType = kind
        self.total_suffix = total_suffix
        self.labelnames = tuple(labels)
        self.samples: list[tuple[tuple[str, ...], float]] = []
        if value is not None:
            self.samples.append(((), value))

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        """One series: ``labels`` are the values of :attr:`labelnames`, in that order."""
        self.samples.append((tuple(labels), value))


def gauge(name: str, documentation: str, *, labels: Sequence[str] = (),
          value: float | None = None) -> Family:
    return Family(name, documentation, "gauge", labels, value)


def counter(name: str, documentation: str, *, labels: Sequence[str] = (),
            value: float | None = None) -> Family:
    return Family(name, documentation, "counter", labels, value)


def to_metric(family: Family) -> Metric:
    """The family as client_python's, for a ``CollectorRegistry``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels = list(family.labelnames)
    out: Metric
    if family.type == "counter":
        out = CounterMetricFamily(family.name, family.documentation, labels=labels)
    else:
        out = GaugeMetricFamily(family.name, family.documentation, labels=labels)
    for values, value in family.samples:
        out.add_metric(list(values), value)
    return out


def go_float(value: float) -> str:
    """A value as client_python's ``floatToGoString`` writes it.

    Go's shortest form, the exponent past 1e6 as ``e+NN``; written here so that serving
    /metrics needs no prometheus_client (12 MB of the agent's memory). test_golden
    compares the two.
    """
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    if "\\" not in text and "\n" not in text and '"' not in text:
        return text
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class TextRenderer:
    """Writes families in the text format; remembers each series' formatted prefix."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, tuple[str, ...]], str] = {}
        self._headers: dict[tuple[str, str, str], str] = {}
        #: per label-name tuple: the names in sorted order and where each one sits
        self._orders: dict[tuple[str, ...], tuple[tuple[str, int], ...]] = {}
        #: Values formatted before: most of a node's values (error counters at 0, limits,
        #: states) are the same from one sample to the next.
        self._texts: dict[float, str] = {}

    def render(self, families: Iterable[Family]) -> bytes:
        if len(self._prefixes) > MAX_CACHED_SERIES:
            self._prefixes.clear()
        if len(self._texts) > MAX_CACHED_SERIES:
            self._texts.clear()
        prefixes, texts = self._prefixes, self._texts
        out: list[str] = []
        append = out.append
        for family in families:
            suffixed = family.type == "counter" and family.total_suffix
            sample_name = family.name + "_total" if suffixed else family.name
            header = self._headers.get((sample_name, family.type, family.documentation))
            if header is None:
                header = (f"# HELP {sample_name} {_escape_help(family.documentation)}\n"
                          f"# TYPE {sample_name} {family.type}\n")
                self._headers[(sample_name, family.type, family.documentation)] = header
            append(header)
            order = self._order(family.labelnames)
            for values, value in family.samples:
                key = (sample_name, values)
                prefix = prefixes.get(key)
                if prefix is None:
                    prefix = prefixes[key] = self._prefix(sample_name, order, values)
                append(prefix)
                text = texts.get(value)
                if text is None or (value == 0 and math.copysign(1.0, value) < 0):
                    text = go_float(value)
                    if text != "-0.0":  # -0.0 is 0.0 to a dict, not to the format
                        texts[value] = text
                append(text)
                append("\n")
        return "".join(out).encode("utf-8")

    def _order(self, labelnames: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        order = self._orders.get(labelnames)
        if order is None:
            order = self._orders[labelnames] = tuple(
                sorted((name, i) for i, name in enumerate(labelnames)))
        return order

    @staticmethod
    def _prefix(name: str, order: tuple[tuple[str, int], ...], values: tuple[str, ...]) -> str:
        if not values:
            return f"{name} "
        if len(values) != len(order):
            raise ValueError(f"{name}: {len(values)} label values for {len(order)} names")
        body = ",".join(f'{label}="{_escape_value(values[i])}"' for label, i in order)
        return f"{name}{{{body}}} "


FamilySource = Callable[[], Iterable[Family]]


class ExpositionCache:
    """The rendered /metrics body of the latest snapshot, plain and gzipped.

    The first scrape after a sample renders it (scrapes come every 15-60 s, samples every
    second: rendering each sample would mostly format bodies nobody reads); the scrapes
    after it, until the next sample, get the same bytes.
    """

    def __init__(self, families: FamilySource, latest: Callable[[], object]) -> None:
        self._families = families
        self._latest = latest
        self._renderer = TextRenderer()
        self._lock = threading.Lock()
        self._for: object = None
        self._plain = b""
        self._gzipped: bytes | None = None
        self._rendered_once = False

    def _current(self) -> None:
        snapshot = self._latest()
        if snapshot is not self._for or not self._rendered_once:
            self._plain = self._renderer.render(self._families())
            self._gzipped = None
            self._for = snapshot
            self._rendered_once = True

    def body(self, want_gzip: bool) -> bytes:
        """The body for the current snapshot, rendering it on first use."""
        with self._lock:
            self._current()
            if not want_gzip:
                return self._plain
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._plain, compresslevel=1)
            return self._gzipped
