"""Limits on the shape of a request body, checked before anything parses it.

The size of a body is limited where it is read (``max_body_bytes``); its shape is
limited here. The parsers behind the API (msgspec, ``json``, PyYAML and the config
loader's walk over YAML nodes) recurse once per level of nesting and, for YAML, follow
aliases, so without these limits a small body could make them raise ``RecursionError``
(a 500) or expand a "billion laughs" for minutes:

- nesting deeper than :data:`MAX_DEPTH` levels: ``[[[[...]]]]``, ``{"a": {"a": ...}}``,
  or YAML's block style (each level is indented or opens with ``- ``);
- a number written with more than :data:`MAX_DIGITS` digits (Python refuses to convert
  an integer of more than 4,300 digits, and none of ours needs 30);
- YAML anchors and aliases (``&a``, ``*a``), in a body that is YAML.

A body that breaks one is refused with :class:`BodyRefused` (400) naming the limit. The
checks are linear in the body's size and run only on the API's less frequent routes: the
reports' hot path decodes with msgspec into strict types, which stops at the first value
of the wrong type, before any depth matters.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Final

import yaml

from sn_monitor.errors import SnMonitorError

MAX_DEPTH: Final = 32
"""Levels of nesting a body may have (the deepest of ours, a job, has about 6)."""
MAX_DIGITS: Final = 64
"""Digits a number may be written with."""
MAX_INDENT: Final = 4 * MAX_DEPTH
"""Columns of indentation (and block indicators) a YAML line may start with."""

# Strings, which may hold any character: what is inside one neither nests nor counts.
# Possessive: the alternatives start with different bytes, so nothing is ever given back
# (no backtracking stack: linear time on a megabyte of quotes or backslashes).
_STRINGS = re.compile(rb'"(?:[^"\\]++|\\.)*+"|\'(?:[^\']++|\'\')*+\'', re.DOTALL)
_LONG_NUMBER = re.compile(rb"\d{%d,}" % (MAX_DIGITS + 1))
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte but the brackets
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_BLOCK_START = re.compile(rb"^[ \t?:-]*", re.MULTILINE)
# libyaml's scanner where PyYAML has it (50 times faster on a megabyte); only tokens here
_SCANNER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class BodyRefused(ValueError, SnMonitorError):
    """A body whose shape is outside the limits; ``message`` says which."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_shape(body: bytes, *, yaml_allowed: bool = False) -> None:
    """Raise :class:`BodyRefused` unless ``body`` is within the limits (module docstring).

    ``yaml_allowed``: the route reads YAML too (block nesting and aliases are checked).
    """
    bare = _STRINGS.sub(b'""', body)
    brackets = bare.translate(None, _BRACKETS)
    if len(brackets) > MAX_DEPTH and max(accumulate(_STEP[b] for b in brackets)) > MAX_DEPTH:
        raise BodyRefused(f"the body is nested deeper than {MAX_DEPTH} levels")
    if _LONG_NUMBER.search(bare):
        raise BodyRefused(f"a number in the body has more than {MAX_DIGITS} digits")
    if not yaml_allowed:
        return
    if max((len(m) for m in _BLOCK_START.findall(bare)), default=0) > MAX_INDENT:
        raise BodyRefused(f"the body is indented deeper than {MAX_INDENT} columns")
    try:
        for token in yaml.scan(body.decode("utf-8", "replace"), Loader=_SCANNER):
            if isinstance(token, yaml.AliasToken | yaml.AnchorToken):
                raise BodyRefused("YAML anchors and aliases (&name, *name) are not "
                                  "accepted in a request body: write the values out")
    except yaml.YAMLError:
        return  # not YAML the parser can read: its own error says what is wrong
