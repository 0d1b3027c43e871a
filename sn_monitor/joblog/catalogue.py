"""The signature catalogue as data: how each failure of a training job's log is recognised.

The packaged file (``sn_monitor/joblog/signatures.yaml``) says what each signature is;
an operator's edited copy loads the same way. Both load through the one config loader,
so a bad file names file, key path and line (a regex that does not compile, a check on a
parameter no pattern captures, a category outside the fixed list), with no traceback.

A signature is a *line* signature (regexes searched in one line that holds one of its
literal keywords) or a *block* signature (judged on the fields of a block read over several
lines: a Python traceback, torchrun's "Root Cause" block). Its ``checks`` read the
parameters the regexes capture (an exit code, a signal, a loss scale), so that a rule
says "exit code -9", not "the word exitcode".
"""

from __future__ import annotations

import functools
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from sn_monitor.config import ConfigError, Document, bind, load_yaml, optional, setting
from sn_monitor.joblog.model import CATEGORIES, Severity

#: The ``kind:`` of a catalogue file: how check-config recognises one.
KIND: Final = "JobLogSignatures"

#: The catalogue that ships inside the package.
PACKAGED_SIGNATURES: Final = Path(__file__).resolve().parent / "signatures.yaml"

Block = Literal["traceback", "root-cause"]

#: The fields each kind of block offers to checks.
BLOCK_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "traceback": frozenset({"exception", "qualified", "message", "frame", "function"}),
    "root-cause": frozenset({"rank", "local_rank", "exitcode", "pid", "host", "time",
                             "error_file", "traceback"}),
}

_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


class SignatureError(ConfigError):
    """A bad signature catalogue: which file, which key, which line, and what is wrong."""


@dataclass(frozen=True, slots=True)
class Check:
    """One condition on a parameter; see :meth:`holds`."""

    param: str
    one_of: tuple[str | float, ...] = ()
    none_of: tuple[str | float, ...] = ()
    at_least: float | None = None
    at_most: float | None = None

    def holds(self, params: Mapping[str, str]) -> bool:
        """Whether ``params`` satisfy it.

        An absent parameter satisfies only ``not_in``; numbers compare as numbers
        (``-9`` is ``-9.0``), other text exactly.
        """
        raw = params.get(self.param)
        if raw is None:
            return not (self.one_of or self.at_least is not None or self.at_most is not None)
        value = _as_value(raw)
        if self.one_of and value not in self.one_of:
            return False
        if value in self.none_of:
            return False
        if self.at_least is not None or self.at_most is not None:
            if not isinstance(value, float):
                return False
            if self.at_least is not None and value < self.at_least:
                return False
            if self.at_most is not None and value > self.at_most:
                return False
        return True


def _with_signal(params: dict[str, str]) -> dict[str, str]:
    """A signal read by name also gets its number (``signal``), one read by number its name."""
    name, number = params.get("signal_name"), params.get("signal")
    try:
        if name is not None and number is None:
            params["signal"] = str(int(signal.Signals[name]))
        elif number is not None and name is None:
            params["signal_name"] = signal.Signals(int(number)).name
    except (KeyError, ValueError):
        pass  # a signal this platform does not know: the text stays as read
    return params


def _as_value(raw: str | float) -> str | float:
    """``"-9"`` -> ``-9.0``; text that is not a number stays text."""
    if isinstance(raw, float):
        return raw
    try:
        return float(raw)
    except ValueError:
        return raw.strip()


@dataclass(frozen=True)
class Signature:
    """One catalogue entry, its regexes compiled."""

    name: str
    category: str
    severity: Severity
    root_candidate: bool
    why: str
    #: None for a line signature.
    block: Block | None = None
    #: Literal strings, one of which every line the signature matches contains.
    keywords: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()
    checks: tuple[Check, ...] = ()

    def match_line(self, line: str) -> dict[str, str] | None:
        """The params read from ``line`` when a pattern matches and the checks hold."""
        for pattern in self.patterns:
            found = pattern.search(line)
            if found is None:
                continue
            params = _with_signal({k: v for k, v in found.groupdict().items() if v is not None})
            return params if self.holds(params) else None
        return None

    def holds(self, params: Mapping[str, str]) -> bool:
        """Whether every check holds for ``params``."""
        return all(check.holds(params) for check in self.checks)


@dataclass(frozen=True)
class Catalogue:
    """The whole catalogue: where it came from, its revision, its signatures in order."""

    path: str
    version: str
    signatures: tuple[Signature, ...]

    def lines(self) -> tuple[Signature, ...]:
        """The line signatures, in the order they are tried."""
        return tuple(s for s in self.signatures if s.block is None)

    def blocks(self, block: Block) -> tuple[Signature, ...]:
        """The signatures of one kind of block, in order."""
        return tuple(s for s in self.signatures if s.block == block)


# ---------------------------------------------------------------- the file, as the loader binds it


def _known_category(value: str) -> None:
    if value not in CATEGORIES:
        raise ValueError(f"unknown category {value!r} (known: {', '.join(CATEGORIES)})")


def _kebab(value: str) -> None:
    if not _NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a kebab-case name (e.g. nccl-watchdog-timeout)")


def _one_line(value: str) -> None:
    if not value.strip():
        raise ValueError("must not be empty")


@dataclass(frozen=True)
class _CheckFile:
    param: str
    one_of: list[str | float] = setting(key="in", default_factory=list)
    none_of: list[str | float] = setting(key="not_in", default_factory=list)
    at_least: float | None = None
    at_most: float | None = None


@dataclass(frozen=True)
class _SignatureFile:
    name: str = setting(check=_kebab)
    category: str = setting(check=_known_category)
    severity: Severity = "error"
    root_candidate: bool = True
    why: str = setting(default="", check=optional(_one_line))
    block: Block | None = None
    keywords: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    checks: list[_CheckFile] = field(default_factory=list)


@dataclass(frozen=True)
class _CatalogueFile:
    kind: Literal["JobLogSignatures"]
    version: str = setting(check=_one_line)
    signatures: list[_SignatureFile] = field(default_factory=list)


def is_signatures_document(data: object) -> bool:
    """Whether parsed YAML is a signature catalogue (``kind: JobLogSignatures``)."""
    return isinstance(data, dict) and data.get("kind") == KIND


def parse_catalogue(doc: Document) -> Catalogue:
    """The catalogue in ``doc``; SignatureError naming file, key path and line if it is bad."""
    try:
        parsed = bind(_CatalogueFile, doc)
    except ConfigError as err:
        raise SignatureError(err.file, err.key, err.line, err.message) from None
    if not parsed.signatures:
        raise SignatureError(doc.path, "signatures", doc.line(("signatures",)),
                             "lists no signatures")
    seen: dict[str, int | None] = {}
    signatures = []
    for index, item in enumerate(parsed.signatures):
        key = ("signatures", index)
        if item.name in seen:
            raise _error(doc, (*key, "name"), f"duplicate name {item.name!r} (first at line "
                                              f"{seen[item.name]})")
        seen[item.name] = doc.line((*key, "name"))
        signatures.append(_signature(doc, key, item))
    return Catalogue(path=doc.path, version=parsed.version.strip(),
                     signatures=tuple(signatures))


def _signature(doc: Document, key: tuple[str | int, ...], item: _SignatureFile) -> Signature:
    """One entry checked whole: line or block, regexes that compile, checks that can apply."""
    if item.block is None:
        if not item.patterns:
            raise _error(doc, key, "a line signature needs patterns (or name a block)")
        if not item.keywords:
            raise _error(doc, key, "a line signature needs keywords: literal strings, one of "
                                   "which every line it matches contains")
        for index, keyword in enumerate(item.keywords):
            if not keyword.strip():
                raise _error(doc, (*key, "keywords", index), "an empty keyword matches "
                                                             "every line")
        patterns = tuple(_compile(doc, (*key, "patterns", i), text)
                         for i, text in enumerate(item.patterns))
        offered = frozenset(name for p in patterns for name in p.groupindex)
    else:
        if item.patterns or item.keywords:
            raise _error(doc, key, f"a {item.block} block signature has no patterns or "
                                   "keywords: it is judged on the block's fields")
        patterns = ()
        offered = BLOCK_FIELDS[item.block]
    checks = []
    for index, check in enumerate(item.checks):
        if check.param not in offered:
            raise _error(doc, (*key, "checks", index, "param"),
                         f"no pattern captures {check.param!r} (captured: "
                         f"{', '.join(sorted(offered)) or 'nothing'})")
        checks.append(Check(param=check.param,
                            one_of=tuple(_as_value(v) for v in check.one_of),
                            none_of=tuple(_as_value(v) for v in check.none_of),
                            at_least=check.at_least, at_most=check.at_most))
    return Signature(name=item.name, category=item.category, severity=item.severity,
                     root_candidate=item.root_candidate, why=item.why.strip(),
                     block=item.block, keywords=tuple(item.keywords), patterns=patterns,
                     checks=tuple(checks))


def _compile(doc: Document, key: tuple[str | int, ...], text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as err:
        raise _error(doc, key, f"not a regular expression: {err}") from None


def _error(doc: Document, key: tuple[str | int, ...], message: str) -> SignatureError:
    err = doc.error(key, message)
    return SignatureError(err.file, err.key, err.line, err.message)


def load_catalogue(path: Path | None = None) -> Catalogue:
    """The catalogue in ``path``; None: the packaged one (read once, then cached).

    Raises SignatureError (naming file, key path and line) for a missing, unreadable or
    malformed file.
    """
    if path is None:
        return _packaged()
    return _read(Path(path))


@functools.cache
def _packaged() -> Catalogue:
    return _read(PACKAGED_SIGNATURES)


def _read(path: Path) -> Catalogue:
    try:
        doc = load_yaml(path)
    except ConfigError as err:
        raise SignatureError(err.file, err.key, err.line, err.message) from None
    return parse_catalogue(doc)


def describe(catalogue: Catalogue) -> dict[str, Any]:
    """A summary for a person: how many signatures, per category."""
    per: dict[str, int] = {}
    for signature in catalogue.signatures:
        per[signature.category] = per.get(signature.category, 0) + 1
    return {"version": catalogue.version, "signatures": len(catalogue.signatures),
            "categories": dict(sorted(per.items()))}
