"""One log line per event, with node/gpu/collector context; JSON for journald shippers."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from typing import Literal

LogFormat = Literal["text", "json"]

#: Context keys that callers pass through ``extra=`` and that every line carries.
CONTEXT_KEYS = ("node", "gpu", "collector", "rule", "device", "port", "xid")


class TextFormatter(logging.Formatter):
    """``2026-11-30T12:00:00Z WARNING sn_monitor.agent: message node=a gpu=3``."""

    def format(self, record: logging.LogRecord) -> str:
        when = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        context = " ".join(
            f"{key}={getattr(record, key)}" for key in CONTEXT_KEYS
            if getattr(record, key, None) is not None
        )
        line = f"{when} {record.levelname} {record.name}: {record.getMessage()}"
        if context:
            line += " " + context
        if record.exc_info:
            line += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in CONTEXT_KEYS:
            if getattr(record, key, None) is not None:
                doc[key] = getattr(record, key)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure_logging(fmt: LogFormat = "text", level: str = "INFO") -> None:
    """Send sn_monitor's logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@contextlib.contextmanager
def muted(*names: str) -> Iterator[None]:
    """Nothing logged by the loggers ``names`` inside the block.

    Their children with no level of their own are quiet too. For a simulation that runs
    the real controller (a replay): the faults it plays are expected, and its CRITICAL
    "needs a person" is not news to the person running it.
    """
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, before, strict=True):
            logger.setLevel(level)
