"""How Python values become column values: mappings and tuples as JSON text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def to_json(value: Any) -> str:
    """A tuple, mapping or scalar as JSON text (tuples as lists, keys sorted)."""
    if isinstance(value, tuple):
        value = list(value)
    elif isinstance(value, Mapping):
        value = dict(value)
    return json.dumps(value, sort_keys=True, default=str)


def from_json(text: str) -> Any:
    """JSON text back as a value; a list comes back as a tuple (rows are frozen)."""
    value = json.loads(text)
    return tuple(value) if isinstance(value, list) else value


def dumps(value: Mapping[str, Any]) -> str:
    """A mapping (labels, params, an outcome) as JSON text, keys sorted."""
    # default=str: params may carry paths or enums; the audit trail wants them readable.
    return json.dumps(dict(value), sort_keys=True, default=str)
