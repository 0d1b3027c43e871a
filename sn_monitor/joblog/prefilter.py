"""The prefilter: where in a chunk of log text the next line that may be a failure is.

Every line signature names literal keywords, one of which each line it matches holds.
A line without any is benign and must cost next to nothing, at 50 MB/s of input: the
keywords are found over the whole chunk, never line by line. Keywords that start with a
capital letter or punctuation join one regex, which the regex engine skips to by their
first character (rare in log text); each keyword that starts with a small letter, a digit
or a space is found with ``str.find`` on its own (unless it holds one of the first kind,
``ncclRemoteError`` holding ``Error``), its next position remembered, so each costs about
one pass over the chunk: few.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable


class Prefilter:
    """The keywords of a catalogue, compiled for search over chunks and single lines."""

    def __init__(self, words: Iterable[str]) -> None:
        unique = sorted(set(words))
        fast = [w for w in unique if not (w[0].islower() or w[0].isdigit() or w[0].isspace())]
        self._fast = re.compile("|".join(re.escape(w) for w in fast)) if fast else None
        # A keyword holding a fast one is found where the fast one is: no search of its own.
        self._slow = tuple(w for w in unique
                           if w not in fast and not any(f in w for f in fast))
        self._all_slow = tuple(w for w in unique if w not in fast)

    def holds(self, line: str) -> bool:
        """Whether ``line`` holds a keyword."""
        if self._fast is not None and self._fast.search(line) is not None:
            return True
        return any(word in line for word in self._all_slow)

    def scan(self, text: str) -> Scan:
        """A search for the keywords in ``text``, position by position."""
        return Scan(self._fast, self._slow, text)


class Scan:
    """The next keyword at or after a position in one text; each found once."""

    def __init__(self, fast: re.Pattern[str] | None, slow: tuple[str, ...], text: str) -> None:
        self._fast = fast
        self._text = text
        self._next: dict[str | None, float] = {None: -1.0} if fast is not None else {}
        self._next.update((word, -1.0) for word in slow)

    def next_hit(self, pos: int) -> int:
        """Where the next keyword at or after ``pos`` starts; -1 when there is none."""
        best = math.inf
        for word, at in self._next.items():
            if at < pos:
                at = self._find(word, pos)
                self._next[word] = at
            best = min(best, at)
        return -1 if best == math.inf else int(best)

    def _find(self, word: str | None, pos: int) -> float:
        if word is None:
            assert self._fast is not None
            hit = self._fast.search(self._text, pos)
            return math.inf if hit is None else float(hit.start())
        found = self._text.find(word, pos)
        return math.inf if found < 0 else float(found)
