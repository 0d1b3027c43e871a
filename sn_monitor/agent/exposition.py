"""The Prometheus text format (0.0.4), rendered once per snapshot and served from memory.

The agent samples on its own clock, so every scrape between two samples would format
the same snapshot again. :class:`ExpositionCache` renders it once (and gzips it once for
scrapers that ask) and hands out the bytes. :func:`render_text` writes exactly what
client_python's ``generate_latest`` writes for gauge and counter families, without its
per-sample name checks: our names and label names are fixed in code.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable
from typing import cast

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sn_monitor.agent.snapshot import NodeSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Go's float formatting, as Prometheus writes and reads it (client_python's helper).
_go_float = cast(Callable[[float], str], floatToGoString)


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    if "\\" not in text and "\n" not in text and '"' not in text:
        return text
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_text(metrics: Iterable[Metric]) -> bytes:
    """Format gauge and counter families in the text exposition format."""
    out: list[str] = []
    append = out.append
    for metric in metrics:
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        if metric.type not in ("counter", "gauge"):
            raise ValueError(f"{metric.name}: only gauges and counters are rendered here")
        append(f"# HELP {name} {_escape_help(metric.documentation)}\n# TYPE {name} {metric.type}\n")
        for sample in metric.samples:
            labels = sample.labels
            if labels:
                body = ",".join(f'{k}="{_escape_value(labels[k])}"' for k in sorted(labels))
                append(f"{sample.name}{{{body}}} {_go_float(sample.value)}\n")
            else:
                append(f"{sample.name} {_go_float(sample.value)}\n")
    return "".join(out).encode("utf-8")


class ExpositionCache:
    """The rendered /metrics body of the latest snapshot, plain and gzipped."""

    def __init__(self, collector: Collector, latest: Callable[[], NodeSnapshot | None]) -> None:
        self._collector = collector
        self._latest = latest
        self._lock = threading.Lock()
        self._for: NodeSnapshot | None = None
        self._plain = b""
        self._gzipped: bytes | None = None
        self._rendered_once = False

    def body(self, want_gzip: bool) -> bytes:
        """The body for the current snapshot, rendering it on first use."""
        with self._lock:
            snapshot = self._latest()
            if snapshot is not self._for or not self._rendered_once:
                self._plain = render_text(self._collector.collect())
                self._gzipped = None
                self._for = snapshot
                self._rendered_once = True
            if not want_gzip:
                return self._plain
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._plain, compresslevel=1)
            return self._gzipped
