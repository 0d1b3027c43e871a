"""torch's elastic error file: the JSON a failed rank leaves next to its logs.

A rank whose entry point is wrapped in ``torch.distributed.elastic.multiprocessing.errors
.record`` writes, when it raises, ``error.json`` (``TORCHELASTIC_ERROR_FILE``; in
torchrun's ``--log-dir``: ``attempt_N/<local rank>/error.json``)::

    {"message": {"message": "RuntimeError: ...",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last): ...",
                               "timestamp": "1796612902"}}}

It holds the exception, its traceback and the time it was raised, to the second and
with a year: the one time stamp every rank's failure has in common. A pure parser; the
offline analysis reads the traceback through the recognizer and dates its findings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ErrorFile:
    """What a rank's error file says: the exception line, its traceback, when."""

    message: str
    py_callstack: str
    timestamp: float | None


def parse_error_file(text: str) -> ErrorFile | None:
    """The error file in ``text``, or None when it is not one (any other JSON or text)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    outer = data.get("message") if isinstance(data, dict) else None
    if not isinstance(outer, dict) or not isinstance(outer.get("message"), str):
        return None
    extra = outer.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    stack = extra.get("py_callstack")
    try:
        when: float | None = float(extra["timestamp"])
    except (KeyError, TypeError, ValueError):
        when = None
    return ErrorFile(message=outer["message"],
                     py_callstack=stack if isinstance(stack, str) else "",
                     timestamp=when)
