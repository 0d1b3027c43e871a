"""DistributedJob files: the training jobs the controller watches and recovers.

The YAML keys are the camelCase ones users already write (see DESIGN.md). Only
``replicas`` is required; this is a whole job::

    apiVersion: training.ai/v1     # the CRD's API group; sn-monitor/v1 is an alias
    kind: DistributedJob
    metadata: {name: trillion-model}
    spec:
      replicas: 128
      checkpointInterval: 900      # seconds, or 15m, or auto (default 15m; auto: the
                                   # interval the job's history recommends, advisor.py)
      maxFailures: 40              # recoveries before the job is given up (default 3)
      recoveryStrategy: elastic    # elastic | restart | manual (default restart)

and every other field has a default:

    nodes: {supernode: sn0}      # a label selector, or a list of node names; default:
                                 # the nodes whose ranks report progress for the job
    spares: [node-129, node-130] # default: none
    checkpoint: {dir: /mnt/ckpt/trillion, marker: COMPLETE, keep: 5}
                                 # default: no directory to scan; the training client's
                                 # checkpoint reports say where each one is
    control: {webhook: http://launcher:8080/control}   # or command / kubernetes / slurm;
                                 # default: the controller's drivers.job if configured,
                                 # else the training client (its progress replies carry
                                 # checkpoint requests and the restore point; the job's
                                 # own launcher, e.g. torchrun, restarts the ranks)
    hangTimeout: 10m             # default: max(2m, 10 x the median step time)
    minReplicas: 96              # elastic: the fewest replicas worth running on (default 1)

Files go through the one config loader (errors name file, key path and line); bodies
posted to the API go through :func:`job_from_json` (the same dataclasses, errors name
the key path).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sn_monitor.config import (
    ConfigError,
    Document,
    Duration,
    KeyPath,
    bind,
    load_yaml,
    optional,
    parse_yaml,
    setting,
)
from sn_monitor.controller.actions.drivers.job_control import JobControl

#: The API group of the DistributedJob custom resource, and the older name files may use.
API_VERSION = "training.ai/v1"
API_VERSION_ALIASES = ("sn-monitor/v1",)
KIND = "DistributedJob"
#: hangTimeout when the job sets none: max(MIN_HANG_TIMEOUT, HANG_STEPS x median step time).
MIN_HANG_TIMEOUT = 120.0
HANG_STEPS = 10
#: ``checkpointInterval: auto``: the advisor's interval; this one until it has advice.
AUTO = "auto"
DEFAULT_CHECKPOINT_INTERVAL = 900.0

RecoveryStrategy = Literal["elastic", "restart", "manual"]

# Matched with fullmatch: the whole string ("$" would let a final newline through).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_KEY = re.compile(r"([a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?/)?"
                        r"[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?")


class JobSpecError(ConfigError):
    """A bad job. From a file: ``file:line: key: message``; from the API: ``key: message``."""

    def __str__(self) -> str:
        if self.file:
            return super().__str__()
        return f"{self.key}: {self.message}" if self.key else self.message


def _dns_label(value: str) -> None:
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(
            f"must be a DNS-1123 label (lower-case letters, digits and '-', starting and "
            f"ending with a letter or digit, at most 63 characters), got {value!r}")


@dataclass(frozen=True)
class _AtLeast:
    """A settings check that the CRD's schema shows too (``minimum``, see crd.py)."""

    minimum: int

    def __call__(self, value: int | None) -> None:
        if value is not None and value < self.minimum:
            raise ValueError(f"must be at least {self.minimum}, got {value}")


def _at_least(minimum: int) -> _AtLeast:
    return _AtLeast(minimum)


def _positive(value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"must be greater than 0, got {value:g}")


def _positive_or_auto(value: float | str) -> None:
    if value != AUTO:
        _positive(float(value))


def _node_name(value: str) -> None:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"expected a node name without spaces, got {value!r}")


def _node_names(value: list[str]) -> None:
    for name in value:
        _node_name(name)
    _no_duplicates(value)


def _no_duplicates(names: Iterable[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"node {name!r} is listed twice")
        seen.add(name)


def _labels(value: dict[str, str]) -> None:
    for key in value:
        if len(key) > 316 or not _LABEL_KEY.fullmatch(key):
            raise ValueError(f"invalid label key {key!r}")


def _nodes(value: dict[str, str] | list[str]) -> None:
    if isinstance(value, dict):
        if not value:
            raise ValueError("an empty selector would match every node: "
                             "give at least one label, e.g. {supernode: sn0}")
        _labels(value)
    else:
        if not value:
            raise ValueError("list at least one node, or give a label selector")
        _node_names(value)


def _checkpoint_dir(value: str) -> None:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path (as the controller sees it), got {value!r}")


_keep = _AtLeast(1)


def _marker(value: str | None) -> None:
    if value is not None and (not value or "/" in value or value in (".", "..")):
        raise ValueError(f"must be a file name inside each checkpoint directory, got {value!r}")


@dataclass(frozen=True)
class JobMetadata:
    name: str = setting(check=_dns_label)
    labels: dict[str, str] = setting(default_factory=dict, check=_labels)


@dataclass(frozen=True)
class CheckpointSpec:
    """Where the job's checkpoints live and how to tell a finished one.

    Without ``marker`` a checkpoint directory counts once it is a complete PyTorch
    distributed checkpoint (``.metadata`` and every file it references); with
    ``marker`` (e.g. ``COMPLETE``) once that file exists in it. ``keep``: how many the
    job keeps on disk (informational; the controller never deletes checkpoints).
    """

    dir: str = setting(check=_checkpoint_dir)
    marker: str | None = setting(default=None, check=_marker)
    keep: int | None = setting(default=None, check=_keep)


@dataclass(frozen=True)
class JobSpec:
    replicas: int = setting(check=_at_least(1))
    #: A label selector or a list of names; None: the nodes its ranks report from.
    nodes: dict[str, str] | list[str] | None = setting(default=None, check=optional(_nodes))
    #: None: no directory to scan; the client's checkpoint reports say where.
    checkpoint: CheckpointSpec | None = None
    #: None: the controller's ``drivers.job``, else the training client (see above).
    control: JobControl | None = None
    checkpoint_interval: Duration | Literal["auto"] = setting(
        key="checkpointInterval", default=Duration(900.0), check=_positive_or_auto)
    max_failures: int = setting(key="maxFailures", default=3, check=_at_least(0))
    recovery_strategy: RecoveryStrategy = setting(key="recoveryStrategy", default="restart")
    spares: list[str] = setting(default_factory=list, check=_node_names)
    hang_timeout: Duration | None = setting(key="hangTimeout", default=None, check=_positive)
    min_replicas: int = setting(key="minReplicas", default=1, check=_at_least(1))

    def __post_init__(self) -> None:
        if self.min_replicas > self.replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must not exceed "
                             f"replicas ({self.replicas})")
        if isinstance(self.nodes, list):
            both = sorted(set(self.nodes) & set(self.spares))
            if both:
                raise ValueError(f"node {both[0]!r} is both in nodes and in spares")

    @property
    def node_selector(self) -> dict[str, str] | None:
        """The label selector, or None when the job names its nodes (or gives none)."""
        return self.nodes if isinstance(self.nodes, dict) else None

    @property
    def node_names(self) -> list[str] | None:
        """The listed nodes, or None when the job selects them by label (or gives none)."""
        return self.nodes if isinstance(self.nodes, list) else None

    @property
    def nodes_from_progress(self) -> bool:
        """No ``nodes``: the job runs on the nodes its ranks report progress from."""
        return self.nodes is None

    @property
    def checkpoint_dir(self) -> Path | None:
        """The directory the controller scans for checkpoints (None: reports only)."""
        return Path(self.checkpoint.dir) if self.checkpoint is not None else None

    @property
    def checkpoint_marker(self) -> str | None:
        return self.checkpoint.marker if self.checkpoint is not None else None

    @property
    def auto_interval(self) -> bool:
        """``checkpointInterval: auto``: the recommended interval is applied."""
        return self.checkpoint_interval == AUTO

    @property
    def fixed_interval(self) -> float:
        """The interval written in the spec (the default one for ``auto``)."""
        return (DEFAULT_CHECKPOINT_INTERVAL if self.checkpoint_interval == AUTO
                else float(self.checkpoint_interval))

    def effective_hang_timeout(self, median_step_seconds: float | None) -> float:
        """hangTimeout, else max(2m, 10 x the median step time) (2m while unknown)."""
        if self.hang_timeout is not None:
            return float(self.hang_timeout)
        if median_step_seconds is None or median_step_seconds <= 0:
            return MIN_HANG_TIMEOUT
        return max(MIN_HANG_TIMEOUT, HANG_STEPS * median_step_seconds)


@dataclass(frozen=True)
class DistributedJob:
    api_version: Literal["training.ai/v1", "sn-monitor/v1"] = setting(key="apiVersion")
    kind: Literal["DistributedJob"] = setting()
    metadata: JobMetadata = setting()
    spec: JobSpec = setting()

    @property
    def name(self) -> str:
        return self.metadata.name


# --- reading ---------------------------------------------------------------------------


def parse_job(doc: Document) -> DistributedJob:
    """Build a DistributedJob from a parsed document (raises ConfigError)."""
    data = _normalize(doc)
    return bind(DistributedJob, doc, data)


def load_job(path: str | Path) -> DistributedJob:
    """Read one DistributedJob file (raises ConfigError naming file, key and line)."""
    return parse_job(load_yaml(path))


def load_jobs(directory: str | Path) -> dict[str, DistributedJob]:
    """Every ``*.yaml`` / ``*.yml`` job in ``directory``, by name, in file-name order.

    Two files with the same ``metadata.name`` are an error naming both files.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(str(root), "", None, "no such directory")
    paths = sorted(p for p in root.iterdir()
                   if p.suffix in (".yaml", ".yml") and p.is_file())
    jobs: dict[str, DistributedJob] = {}
    origin: dict[str, Path] = {}
    for path in paths:
        doc = load_yaml(path)
        job = parse_job(doc)
        if job.name in jobs:
            raise doc.error(("metadata", "name"),
                            f"duplicate job name {job.name!r} (also in {origin[job.name]})")
        jobs[job.name] = job
        origin[job.name] = path
    return jobs


def job_from_json(body: bytes) -> DistributedJob:
    """A job posted to the API: a JSON (or YAML) body; raises JobSpecError (key: message)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise JobSpecError("", "", None, "the body is not UTF-8 text") from None
    if not text.strip():
        raise JobSpecError("", "", None, "the body is empty: send a DistributedJob")
    try:
        if text.lstrip().startswith(("{", "[")):
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        else:
            data = parse_yaml(text, "").data
    except json.JSONDecodeError as err:
        raise JobSpecError("", "", None,
                           f"invalid JSON: {err.msg} (line {err.lineno}, column {err.colno})"
                           ) from None
    except ConfigError as err:
        raise JobSpecError("", err.key, None, err.message) from None
    try:
        return parse_job(Document(path="", data=data, lines={}))
    except ConfigError as err:
        raise JobSpecError("", err.key, None, err.message) from None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JobSpecError("", key, None, "duplicate key")
        out[key] = value
    return out


#: The shorthands :func:`_normalize` expands, by key path under ``spec``, and what each
#: key takes then: the CRD's schema (crd.py) lets these through as written.
SHORTHANDS: dict[tuple[str, ...], Literal["any", "int-or-string"]] = {
    ("control", "webhook"): "any",           # a URL, or {url, secret, ...}
    ("control", "command"): "any",           # an argv list, or {program, ...}
    ("control", "slurm", "jobId"): "int-or-string",  # 1234 or "1234"
}


def _normalize(doc: Document) -> Any:
    """Expand the shorthands and check ``nodes`` with precise errors; never mutates doc."""
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
        return data
    spec = dict(data["spec"])
    if "nodes" in spec:
        _check_nodes_shape(doc, spec["nodes"], ("spec", "nodes"))
    control = spec.get("control")
    if isinstance(control, dict):
        control = dict(control)
        if isinstance(control.get("webhook"), str):
            control["webhook"] = {"url": control["webhook"]}
        if isinstance(control.get("command"), list):
            control["command"] = {"program": control["command"]}
        slurm = control.get("slurm")
        if isinstance(slurm, dict) and type(slurm.get("jobId")) is int:
            control["slurm"] = {**slurm, "jobId": str(slurm["jobId"])}
        spec["control"] = control
    return {**data, "spec": spec}


def _check_nodes_shape(doc: Document, value: Any, key: KeyPath) -> None:
    if isinstance(value, dict):
        for label, wanted in value.items():
            if not isinstance(wanted, str):
                raise doc.error((*key, label), f"label values are strings, got {wanted!r} "
                                               f"(quote it: '{wanted}')")
    elif isinstance(value, list):
        for i, name in enumerate(value):
            if not isinstance(name, str):
                raise doc.error((*key, i), f"expected a node name, got {name!r}")
    else:
        raise doc.error(key, "expected a label selector such as {supernode: sn0} or a list "
                             f"of node names, got {value!r}")


# --- writing (for the store and the API) -------------------------------------------------


def job_to_dict(job: DistributedJob) -> dict[str, Any]:
    """The job as plain data under its YAML keys; :func:`job_from_json` reads it back."""
    out = _plain(job)
    assert isinstance(out, dict)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None:
                continue
            out[f.metadata.get("key", f.name)] = _plain(item)
        return out
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Duration):
        return float(value)
    return value


__all__ = [
    "API_VERSION",
    "API_VERSION_ALIASES",
    "KIND",
    "CheckpointSpec",
    "DistributedJob",
    "JobControl",
    "JobMetadata",
    "JobSpec",
    "JobSpecError",
    "RecoveryStrategy",
    "job_from_json",
    "job_to_dict",
    "load_job",
    "load_jobs",
    "parse_job",
]
