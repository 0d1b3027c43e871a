"""ECS field types (tests/fixtures/ecs/fields.yaml) and a check of documents against them."""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

FIELDS_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "ecs" / "fields.yaml"
FIELDS: dict[str, Any] = yaml.safe_load(FIELDS_FILE.read_text())
#: Every field we use, ECS's and ours: name -> {type, array?}.
TYPES: dict[str, dict[str, Any]] = {**FIELDS["ecs"], **FIELDS["custom"]}
NAMESPACE = "sn_monitor."
LONG_RANGE = range(-(1 << 63), 1 << 63)


def flatten(doc: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted name, value)`` of a nested document; a ``flattened`` field stays whole."""
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and TYPES.get(name, {}).get("type") != "flattened":
            yield from flatten(value, f"{name}.")
        else:
            yield name, value


def type_error(type_: str, value: Any) -> str | None:
    """Why ``value`` cannot be indexed as ECS/Elasticsearch type ``type_``; None if it can."""
    if type_ in ("keyword", "constant_keyword", "match_only_text", "text"):
        return None if isinstance(value, str) else f"{value!r} is not a string"
    if type_ == "long":
        ok = isinstance(value, int) and not isinstance(value, bool) and value in LONG_RANGE
        return None if ok else f"{value!r} is not a 64-bit integer"
    if type_ == "boolean":
        return None if isinstance(value, bool) else f"{value!r} is not a boolean"
    if type_ == "date":
        return _date_error(value)
    if type_ == "flattened":
        ok = isinstance(value, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return None if ok else f"{value!r} is not a flat map of strings"
    return f"type {type_} is not one this check knows"


def _date_error(value: Any) -> str | None:
    if not isinstance(value, str) or not value.endswith("Z"):
        return f"{value!r} is not an ISO 8601 time in UTC"
    try:
        datetime.datetime.fromisoformat(value)
    except ValueError:
        return f"{value!r} is not an ISO 8601 time"
    return None


def document_errors(doc: Mapping[str, Any]) -> list[str]:
    """What in ``doc`` is not ECS: unknown fields, wrong types, values ECS does not allow."""
    errors: list[str] = []
    for name, value in flatten(doc):
        spec = TYPES.get(name)
        if spec is None:
            where = "our namespace's list" if name.startswith(NAMESPACE) else "ECS 9.4.0"
            errors.append(f"{name}: not a field of {where}")
            continue
        values = value if spec.get("array") and isinstance(value, list) else [value]
        errors.extend(f"{name}: {why}" for item in values
                      if (why := type_error(spec["type"], item)) is not None)
    errors.extend(_event_errors(doc.get("event", {})))
    return errors


def _event_errors(event: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    if event.get("kind") not in FIELDS["event.kind"]:
        errors.append(f"event.kind: {event.get('kind')!r} is not an allowed value")
    expected: dict[str, list[str]] = FIELDS["event.category"]
    for category in event.get("category", []):
        if category not in expected:
            errors.append(f"event.category: {category!r} is not one we listed from ECS")
            continue
        errors.extend(f"event.type: {kind!r} is not expected with category {category!r}"
                      for kind in event.get("type", []) if kind not in expected[category])
    return errors
