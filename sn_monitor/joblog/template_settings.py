"""The template miner's settings: its bounds, and the parameters kept verbatim.

Apart from the miner (:mod:`sn_monitor.joblog.templates`) so that the agent's config can
name them without importing the miner: an agent whose ``job_logs.templates`` is off
never loads it, nor compiles the kept parameters' patterns.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, fields

from sn_monitor.config import (
    Duration,
    at_least_one,
    fraction,
    non_negative,
    positive,
    setting,
)

_KEPT_NAME = re.compile(r"[a-z][a-z0-9-]*")
_SIGNAL_NAMES = ("HUP|INT|QUIT|ILL|TRAP|ABRT|BUS|FPE|KILL|USR1|SEGV|USR2|PIPE|ALRM|TERM|"
                 "CHLD|CONT|STOP|TSTP|TTIN|TTOU|XCPU|XFSZ|SYS")


@dataclass(frozen=True)
class KeptParameter:
    """A value that carries a line's meaning, kept verbatim as the pinned token ``<name=value>``.

    ``pattern`` is a regex with exactly one group, which must only be able to match a small
    closed set of values (a signal number of one or two digits, a loss scale kept only when it is
    ``1``): every value is a template of its own, so an open set would make one per line.
    Scope flags inside the pattern, ``(?i:...)``. ``hints``: lower-case words one of which
    a line must hold (compared lower-cased) for the pattern to be tried at all, a cheap test
    that spares most lines the regex; empty, the pattern is tried on every line. ``label``:
    when set, the pinned token is ``<name=label>`` whatever the value, for a class of values
    that mean one thing (a loss scale fallen below 1, however far). Blanks in a value become
    ``_`` (``<signal=Segmentation_fault>``).
    """

    name: str
    pattern: str
    hints: list[str] = field(default_factory=list)
    label: str = ""

    def __post_init__(self) -> None:
        if not _KEPT_NAME.fullmatch(self.name):
            raise ValueError(f"kept parameter name {self.name!r}: lower-case letters, digits, -")
        try:
            groups = re.compile(self.pattern).groups
        except re.error as exc:
            raise ValueError(f"kept parameter {self.name}: bad pattern: {exc}") from exc
        if groups != 1:
            raise ValueError(f"kept parameter {self.name}: the pattern needs exactly one group "
                             f"(the value), it has {groups}")
        if any(not hint or hint != hint.lower() for hint in self.hints):
            raise ValueError(f"kept parameter {self.name}: hints are non-empty lower-case words")
        if self.label and not _KEPT_NAME.fullmatch(self.label):
            raise ValueError(f"kept parameter {self.name}: label {self.label!r}: lower-case "
                             "letters, digits, -")


#: The words one of which a loss scale's reduction holds (most lines that say "loss scale"
#: are progress lines, which reduce nothing).
_SCALED_DOWN = ("reduc", "decreas", "lowering")


def default_kept() -> tuple[KeptParameter, ...]:
    """What :attr:`TemplateSettings.kept` defaults to.

    Exit codes, signals (numbers, names, the C library's descriptions), errno values, a
    loss scale reduced to 1 or 0 or below 1, and non-finite values (a ``nan`` loss must
    not merge with a number). Compiled when first asked: an agent without the template
    miner never compiles them.
    """
    return _default_kept()


@functools.cache
def _default_kept() -> tuple[KeptParameter, ...]:
    return (
        KeptParameter("exitcode", r"(?i:\b(?:exit ?code|exit status|return ?code|exited with "
                                  r"(?:code|status))[\s:=]{0,6}(-?\d{1,3}))(?![\d.])",
                      ["exit", "return"]),
        KeptParameter("signal", r"(?i:\bsignal[\s:=]{1,6}(\d{1,2}))(?!\d)", ["signal"]),
        KeptParameter("signal", rf"\b(SIG(?:{_SIGNAL_NAMES}))\b", ["sig"]),
        KeptParameter("errno", r"(?i:\berrno[\s:=]{0,6}(\d{1,3}))(?!\d)", ["errno"]),
        KeptParameter("signal", r"(?i:\breceived (\d{1,2}) death signal)", ["death signal"]),
        KeptParameter("signal", r"(?i:\bby signal: (killed|terminated|segmentation fault|bus error|"
                                r"aborted|floating point exception|illegal instruction|hangup|"
                                r"interrupt|trace/breakpoint trap))", ["by signal"]),
        KeptParameter("loss-scale", r"(?i:\b(?:reducing|reduced|decreasing|lowering)(?: the)?"
                                    r"(?: dynamic)?(?: loss scale)?(?: from \S+)? to "
                                    r"([01](?:\.0+)?))(?![\d.e])", list(_SCALED_DOWN)),
        KeptParameter("loss-scale", r"(?i:\b(?:reducing|reduced|decreasing|lowering)(?: the)?"
                                    r"(?: dynamic)?(?: loss scale)?(?: from \S+)? to "
                                    r"(0\.\d+|\d(?:\.\d+)?e-\d+))(?![\d.])", list(_SCALED_DOWN),
                      label="below-1"),
        KeptParameter("value", r"(?i:(?<![\w.])(nan|[-+]?inf(?:inity)?)(?![\w.]))", ["nan", "inf"]),
    )


def _at_least_two(value: int) -> None:
    if value < 2:
        raise ValueError(f"must be at least 2 (one child is <*>), got {value}")


def _above_one(value: float) -> None:
    if value <= 1:
        raise ValueError(f"must be above 1 (a burst is faster than usual), got {value}")


@dataclass(frozen=True)
class TemplateSettings:
    """How templates are mined and when they are findings; every bound in one place.

    ``similarity`` is 0.6 rather than Drain's usual 0.5: an NCCL line's header
    (``host:pid:tid [rank] NCCL INFO``) is four equal tokens, and two different messages of
    three words after it (``Connected all rings``, ``Using network IB``) must not merge.
    Bound from YAML with :func:`sn_monitor.config.bind` (durations as ``2m``); ``kept``
    replaces :func:`default_kept` whole.
    """

    similarity: float = setting(default=0.6, check=fraction)
    leading_tokens: int = setting(default=2, check=at_least_one)
    max_children: int = setting(default=100, check=_at_least_two)
    max_templates: int = setting(default=1000, check=at_least_one)
    max_tokens: int = setting(default=64, check=at_least_one)
    max_line_chars: int = setting(default=4096, check=at_least_one)
    warmup_lines: int = setting(default=200, check=non_negative)
    warmup_seconds: Duration = setting(default=Duration(120.0), check=non_negative)
    burst_window_seconds: Duration = setting(default=Duration(60.0), check=positive)
    burst_buckets: int = setting(default=12, check=at_least_one)
    burst_factor: float = setting(default=5.0, check=_above_one)
    burst_min_count: int = setting(default=20, check=at_least_one)
    kept: list[KeptParameter] = setting(default_factory=lambda: list(default_kept()))

    def __post_init__(self) -> None:
        """The same checks as the config loader's, for settings built in code."""
        for each in fields(self):
            check = each.metadata.get("check")
            if check is not None:
                try:
                    check(getattr(self, each.name))
                except ValueError as err:
                    raise ValueError(f"{each.name}: {err}") from None

    @property
    def bucket_seconds(self) -> float:
        """The width of one bucket of the sliding window."""
        return self.burst_window_seconds / self.burst_buckets
