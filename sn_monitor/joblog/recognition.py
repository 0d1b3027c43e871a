"""Line recognition: the catalogue's signatures turned into findings, fast.

A :class:`Recognizer` compiles the catalogue once: every line signature's keywords
(literal strings) joined into one regex, searched over a whole chunk of text at C speed,
so that a benign line (the great majority) costs a share of one search and no Python.
Only a line the prefilter hits is split out and tried against the signatures (those
whose keywords it holds), in order.

A :class:`LogStream` reads one file (or one stream) in chunks of whole lines and keeps
the state of the blocks that span lines: a Python traceback (its exception line is the
finding, its last frame the context; an exception that a line signature already
explains adds nothing) and torchrun's "Root Cause" block (its rank, host, time and exit
code). Blocks are keyed by the line prefix (``[rank3]:``), so interleaved ranks in one
file do not mix; open blocks and their lengths are bounded.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from sn_monitor.joblog.blocks import (
    ROOT_CAUSE_MARK,
    TRACEBACK_MARK,
    RootCauseReader,
    TracebackReader,
    table_rank,
)
from sn_monitor.joblog.catalogue import Block, Catalogue, Signature, load_catalogue
from sn_monitor.joblog.context import Origin, line_node, line_rank, line_time, split_prefix
from sn_monitor.joblog.model import Finding
from sn_monitor.joblog.prefilter import Prefilter

#: The most blocks one stream keeps open at once (one per interleaved rank, in practice).
MAX_OPEN_BLOCKS: Final = 64
#: The longest text a finding keeps of its line: a longer line keeps its head and its tail.
MAX_TEXT: Final = 4096

Reader = TracebackReader | RootCauseReader
_PREFIX_RANKS = re.compile(r"^\[(?:rank|default)(\d+)\]:", re.MULTILINE)


class KeywordFinder:
    """Every keyword a line holds, for the lines the prefilter hit (a third of a busy log).

    Testing each of the catalogue's ~100 keywords with ``in`` costs ~11 us a line. The
    keywords that start with a capital letter or punctuation join one regex, longest first,
    searched from each hit's start + 1 (so a keyword starting inside another is found
    too); a hit also holds every keyword that is a prefix of it. The others are few and
    tested with ``in``. ~4.7 us a line, the same set.
    """

    def __init__(self, words: Iterable[str]) -> None:
        unique = sorted(set(words))
        capital = [w for w in unique
                   if not (w[0].islower() or w[0].isdigit() or w[0].isspace())]
        self._capital = (re.compile("|".join(re.escape(w) for w in sorted(
            capital, key=len, reverse=True))) if capital else None)
        self._prefixes = {w: tuple(v for v in capital if w.startswith(v)) for w in capital}
        self._others = tuple(w for w in unique if w not in self._prefixes)

    def find(self, line: str) -> set[str]:
        """The keywords in ``line``."""
        found = {word for word in self._others if word in line}
        if self._capital is None:
            return found
        pos = 0
        while (hit := self._capital.search(line, pos)) is not None:
            found.update(self._prefixes[hit.group()])
            pos = hit.start() + 1
        return found


class Recognizer:
    """The catalogue compiled: which signature, if any, a line or a block matches."""

    def __init__(self, catalogue: Catalogue | None = None) -> None:
        self.catalogue = catalogue if catalogue is not None else load_catalogue()
        self._lines = self.catalogue.lines()
        self.prefilter = Prefilter([*(word for s in self._lines for word in s.keywords),
                                    TRACEBACK_MARK, ROOT_CAUSE_MARK])
        self._words = tuple(sorted({w for s in self._lines for w in s.keywords}))
        self._signatures_of: dict[str, tuple[int, ...]] = {
            word: tuple(i for i, s in enumerate(self._lines) if word in s.keywords)
            for word in self._words}
        self._keywords = KeywordFinder(self._words)

    @property
    def keywords(self) -> tuple[str, ...]:
        """The line signatures' keywords, sorted."""
        return self._words

    def match(self, line: str) -> tuple[Signature, dict[str, str]] | None:
        """The first line signature that matches ``line``, with the params it read."""
        candidates = {i for word in self._keywords.find(line)
                      for i in self._signatures_of[word]}
        for index in sorted(candidates):
            signature = self._lines[index]
            params = signature.match_line(line)
            if params is not None:
                return signature, params
        return None

    def judge(self, block: Block, fields: Mapping[str, str]) -> Signature | None:
        """The first block signature of kind ``block`` whose checks hold for ``fields``."""
        for signature in self.catalogue.blocks(block):
            if signature.holds(fields):
                return signature
        return None

    def stream(self, file: str, origin: Origin | None = None, *, year: int) -> LogStream:
        """A reader of one file: ``origin`` its rank and node; ``year`` for glog times."""
        return LogStream(self, file, origin or Origin(), year=year)

    def scan(self, file: str, text: str, origin: Origin | None = None, *,
             year: int) -> list[Finding]:
        """Every finding in a whole text (a saved log)."""
        stream = self.stream(file, origin, year=year)
        return [*stream.feed(text), *stream.close()]


class LogStream:
    """One log file read in chunks of whole lines, with its open blocks."""

    def __init__(self, recognizer: Recognizer, file: str, origin: Origin, *, year: int) -> None:
        self.file = file
        self.origin = origin
        self.year = year
        #: Lines read so far.
        self.lines = 0
        #: Ranks named by ``[rankN]:`` prefixes (several ranks' output in one file).
        self.prefixed_ranks: set[int] = set()
        self._recognizer = recognizer
        self._open: dict[str, tuple[Reader, int, str]] = {}
        #: The rank of the torchrun failure-table entry the line being read belongs to.
        self._entry_rank: int | None = None

    def feed(self, text: str) -> list[Finding]:
        """The findings in ``text``: whole lines (a last line without a newline is whole)."""
        found: list[Finding] = []
        self.prefixed_ranks.update(int(r) for r in set(_PREFIX_RANKS.findall(text)))
        scan = self._recognizer.prefilter.scan(text)
        pos, end = 0, len(text)
        while pos < end:
            if self._open:
                pos = self._one_line(text, pos, found)
                continue
            hit = scan.next_hit(pos)
            if hit < 0:
                self.lines += text.count("\n", pos, end) + (not text.endswith("\n"))
                break
            start = text.rfind("\n", pos, hit) + 1 or pos
            self.lines += text.count("\n", pos, start)
            pos = self._one_line(text, start, found, keyword=True)
        return found

    def close(self) -> list[Finding]:
        """End of the stream: a block left open (a traceback cut short) yields nothing."""
        self._open.clear()
        return []

    def _one_line(self, text: str, start: int, found: list[Finding],
                  keyword: bool = False) -> int:
        """Read the line at ``start`` (``keyword``: known to hold one); return the next's start."""
        stop = text.find("\n", start)
        stop = len(text) if stop < 0 else stop
        raw = text[start:stop].rstrip("\r")
        self.lines += 1
        self._entry_rank = table_rank(text, start) if keyword else None
        self._take(raw, self.lines, found, keyword)
        return stop + 1

    def _take(self, raw: str, number: int, found: list[Finding], keyword: bool) -> None:
        """One line: into its open block, or against the signatures (and maybe open one)."""
        _, body = split_prefix(raw)
        key = raw[:len(raw) - len(body)]
        block = self._open.get(key)
        if block is not None:
            if isinstance(block[0], RootCauseReader) or body[:1] in (" ", "\t"):
                self._advance(key, body, number, raw, found)
                return
            self._advance(key, body, number, raw, found, explained=self._line(raw, number, found))
            return
        if not (keyword or self._recognizer.prefilter.holds(raw)):
            return
        if TRACEBACK_MARK in body:
            self._begin(key, TracebackReader(), number, raw)
        elif ROOT_CAUSE_MARK in body:
            self._begin(key, RootCauseReader(), number, raw)
        else:
            self._line(raw, number, found)

    def _begin(self, key: str, reader: Reader, number: int, raw: str) -> None:
        if len(self._open) >= MAX_OPEN_BLOCKS:
            self._open.pop(next(iter(self._open)))
        self._open[key] = (reader, number, raw)

    def _advance(self, key: str, body: str, number: int, raw: str, found: list[Finding],
                 explained: Finding | None = None) -> None:
        """One line into an open block.

        A traceback whose exception line a line signature explained lends that finding its
        last frame instead of adding one of its own.
        """
        reader, first, _ = self._open[key]
        status = reader.take(body)
        if status == "more":
            return
        del self._open[key]
        if status != "done":
            return
        if explained is not None:
            if isinstance(reader, TracebackReader) and reader.frame:
                context = {"frame": reader.frame, "function": reader.function}
                found[found.index(explained)] = dataclasses.replace(
                    explained, params=MappingProxyType({**explained.params, **context}))
            return
        finding = self._block_finding(reader, first, number, raw)
        if finding is not None:
            found.append(finding)

    def _line(self, raw: str, number: int, found: list[Finding]) -> Finding | None:
        """Try the line signatures on one line; the finding, when one matched."""
        matched = self._recognizer.match(raw)
        if matched is None:
            return None
        signature, params = matched
        finding = self._finding(signature, params, number, raw)
        found.append(finding)
        return finding

    def _block_finding(self, reader: Reader, first: int, number: int,
                       raw: str) -> Finding | None:
        if isinstance(reader, TracebackReader):
            signature = self._recognizer.judge("traceback", reader.fields)
            if signature is None:
                return None
            return self._finding(signature, reader.fields, number, raw)
        signature = self._recognizer.judge("root-cause", reader.fields)
        if signature is None:
            return None
        fields = reader.fields
        rank = int(fields["rank"]) if fields.get("rank", "").lstrip("-").isdigit() else None
        when = line_time(fields.get("time", ""), self.year)
        return Finding(file=self.file, line=first + reader.exit_line,
                       category=signature.category, severity=signature.severity,
                       root_candidate=signature.root_candidate, rank=rank,
                       node=fields.get("host") or self.origin.node,
                       text=reader.exit_text.strip(), signature=signature.name,
                       params=MappingProxyType(dict(fields)), timestamp=when)

    def _finding(self, signature: Signature, params: Mapping[str, str], number: int,
                 raw: str) -> Finding:
        fallback = self.origin.rank if self._entry_rank is None else self._entry_rank
        for name in ("rank", "task", "local_rank"):
            if fallback is None and params.get(name, "").isdigit():
                fallback = int(params[name])
        return Finding(file=self.file, line=number, category=signature.category,
                       severity=signature.severity, root_candidate=signature.root_candidate,
                       rank=line_rank(raw, fallback),
                       node=line_node(raw, params.get("host") or self.origin.node),
                       text=_bounded(raw), signature=signature.name,
                       params=MappingProxyType(dict(params)),
                       timestamp=line_time(raw, self.year))


def _bounded(line: str) -> str:
    """``line``, or its head and tail around `` … `` when it is longer than MAX_TEXT."""
    if len(line) <= MAX_TEXT:
        return line
    half = MAX_TEXT // 2
    return f"{line[:half]} … {line[-half:]}"


def recognise_lines(recognizer: Recognizer, file: str, lines: Iterable[str], *,
                    year: int) -> list[Finding]:
    """The findings in ``lines`` (without their newlines), as one stream: for tests, tools."""
    return recognizer.scan(file, "\n".join(lines), year=year)
