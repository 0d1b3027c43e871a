"""The DistributedJob CustomResourceDefinition, made from the spec the file loader reads.

:mod:`.spec` is the one place that knows a DistributedJob's fields; this module walks
its dataclasses (``JobSpec`` and everything under it) and writes the structural OpenAPI
v3 schema the API server needs, so that the CRD and the loader cannot drift apart.
``deploy/kubernetes/generate.py`` writes ``deploy/kubernetes/distributedjob-crd.yaml``
from :func:`custom_resource_definition`, and a test fails when that file is stale.

What the schema says is what the API server can check cheaply (types, required keys,
enums, minimums); the rest (a label key's syntax, minReplicas <= replicas, one control
target) stays with the loader, which the controller's watch runs on every object: a bad
one gets a status condition naming the field (see :mod:`sn_monitor.controller.jobs.crd_watch`).

Mapping of the loader's types:

* ``int`` / ``float`` / ``str`` / ``bool``: ``integer`` / ``number`` / ``string`` /
  ``boolean``; ``Literal[...]``: a string ``enum``;
* a ``Duration`` (``900`` or ``15m``): ``x-kubernetes-int-or-string`` (a fraction of a
  second is written as text, ``2.5s``);
* ``list[X]`` / ``dict[str, X]``: ``array`` / ``object`` with ``additionalProperties``;
* a dataclass: ``object`` with its keys, the ones without a default ``required``;
* a union of two shapes (``nodes``: a selector or a list): any value, left to the loader
  (a structural schema cannot say "an object or an array");
* ``X | None``: ``nullable``;
* a key with a shorthand (``webhook: URL``, ``command: [argv]``, an unquoted Slurm
  ``jobId``; ``spec.SHORTHANDS``): any value, or an int or a string.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from sn_monitor.config import Duration
from sn_monitor.controller.jobs.spec import API_VERSION, KIND, SHORTHANDS, JobSpec

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "distributedjobs"
SINGULAR = "distributedjob"
SHORT_NAMES = ("dj",)
CRD_NAME = f"{PLURAL}.{GROUP}"

#: ``status`` as the controller writes it (:mod:`sn_monitor.controller.jobs.crd_watch`).
STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Written by the sn-monitor controller (the status subresource).",
    "properties": {
        "state": {"type": "string",
                  "description": "pending (no rank has reported progress yet), running, "
                                 "recovering, awaiting_approval, failed; Invalid when the "
                                 "spec was refused"},
        "reason": {"type": "string", "description": "Why the job is in its state."},
        "observedGeneration": {"type": "integer", "format": "int64",
                               "description": "The metadata.generation the controller "
                                              "has read."},
        "generation": {"type": "integer", "format": "int64",
                       "description": "The job's launch: 1, and one more per recovery "
                                      "that restarted it."},
        "nodes": {"type": "integer", "description": "The nodes the job runs on now."},
        "failures": {"type": "integer",
                     "description": "Recoveries used (the job is given up past "
                                    "spec.maxFailures)."},
        "ettr": {"type": "number",
                 "description": "Effective training time ratio: productive time / "
                                "wall time since the job started (none while pending)."},
        "lastCheckpoint": {
            "type": "object",
            "description": "The latest complete checkpoint.",
            "properties": {"step": {"type": "integer", "format": "int64"},
                           "path": {"type": "string"}},
        },
        "conditions": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": {
                "type": "object",
                "required": ["type", "status", "lastTransitionTime", "reason", "message"],
                "properties": {
                    "type": {"type": "string"},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "observedGeneration": {"type": "integer", "format": "int64"},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                },
            },
        },
    },
}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "State", "type": "string", "jsonPath": ".status.state"},
    {"name": "Generation", "type": "integer", "jsonPath": ".status.generation",
     "description": "The job's launch (one more per restart by a recovery)"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
    {"name": "ETTR", "type": "number", "jsonPath": ".status.ettr",
     "description": "Effective training time ratio"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def schema_of(tp: Any) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one loader type (see the module docstring)."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        options = [o for o in get_args(tp) if o is not type(None)]
        nullable = len(options) < len(get_args(tp))
        if len(options) == 1:
            out = schema_of(options[0])
        elif all(_scalar_or_duration(o) for o in options):
            # Duration | Literal["auto"]: a number or a word
            out = {"x-kubernetes-int-or-string": True}
        else:
            out = {"x-kubernetes-preserve-unknown-fields": True}
        return {**out, "nullable": True} if nullable else out
    if origin is Literal:
        values = list(get_args(tp))
        if not all(isinstance(v, str) for v in values):
            raise TypeError(f"only string literals have a schema, got {tp!r}")
        return {"type": "string", "enum": values}
    if origin is list:
        (item,) = get_args(tp)
        return {"type": "array", "items": schema_of(item)}
    if origin is dict:
        key, value = get_args(tp)
        if key is not str:
            raise TypeError(f"mapping keys must be strings, got {tp!r}")
        return {"type": "object", "additionalProperties": schema_of(value)}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _object(tp)
    if tp is Duration:
        return {"x-kubernetes-int-or-string": True}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"no schema for settings type {tp!r}")


def _scalar_or_duration(tp: Any) -> bool:
    return tp is Duration or (get_origin(tp) is Literal
                              and all(isinstance(v, str) for v in get_args(tp)))


def _object(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f.metadata.get("key", f.name)
        prop = schema_of(hints[f.name])
        minimum = getattr(f.metadata.get("check"), "minimum", None)
        if minimum is not None and prop.get("type") == "integer":
            prop["minimum"] = minimum
        properties[key] = prop
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(key)
    out: dict[str, Any] = {"type": "object", "properties": properties}
    doc = (cls.__doc__ or "").strip()
    if doc and not doc.startswith(f"{cls.__name__}("):  # not dataclass's generated one
        out["description"] = doc.split("\n\n")[0].replace("\n", " ")
    if required:
        out["required"] = required
    return out


def _shorthand(schema: dict[str, Any], path: tuple[str, ...], takes: str) -> None:
    """Let the shorthand at ``path`` through: the loader expands and checks it."""
    node = schema
    for key in path[:-1]:
        node = node["properties"][key]
    old = node["properties"][path[-1]]
    new: dict[str, Any] = ({"x-kubernetes-preserve-unknown-fields": True} if takes == "any"
                           else {"x-kubernetes-int-or-string": True})
    if "description" in old:
        new["description"] = old["description"]
    if old.get("nullable"):
        new["nullable"] = True
    node["properties"][path[-1]] = new


def spec_schema() -> dict[str, Any]:
    """``spec``'s schema: the loader's types, with its shorthands let through."""
    spec = schema_of(JobSpec)
    for path, takes in SHORTHANDS.items():
        _shorthand(spec, path, takes)
    spec["description"] = ("A training job sn-monitor watches and recovers (the same "
                           "fields as a DistributedJob file; see deploy/jobs/example.yaml).")
    return spec


def custom_resource_definition() -> dict[str, Any]:
    """The CRD ``distributedjobs.training.ai`` (v1, namespaced, status subresource)."""
    spec = spec_schema()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "sn-controller",
                       "app.kubernetes.io/part-of": "sn-monitor"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": SINGULAR, "kind": KIND,
                      "listKind": f"{KIND}List", "shortNames": list(SHORT_NAMES)},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec,
                        "status": STATUS_SCHEMA,
                    },
                }},
            }],
        },
    }


__all__ = ["CRD_NAME", "GROUP", "PLURAL", "VERSION", "custom_resource_definition", "schema_of",
           "spec_schema"]
