"""Files that ship beside sn-monitor's own but belong to other tools.

`deploy/` holds Kubernetes manifests, Prometheus and Alertmanager configurations,
Prometheus rule files, systemd units and the log shippers' files (a Vector pipeline, a
Filebeat config, an Elasticsearch index template) next to sn-monitor's configs.
``check-config`` is pointed at all of them (``sn-monitor check-config $(find deploy -type
f)``): it tells these apart by their content, says what each is instead of reading it as
an agent config ("apiVersion: unknown key"), and checks it with its own tool
(``promtool``, ``amtool``, ``vector``, ``filebeat``) where that is on PATH. A Kubernetes
manifest is named, not checked: only an API server knows its schemas (``kubectl apply
--dry-run=server``).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The kinds sn-monitor reads itself, even with an apiVersion (a DistributedJob custom
#: resource is a job file).
OWN_KINDS = frozenset({"DistributedJob", "Scenario", "XidCatalog"})

#: Files told by their name alone: (what it is, how to check it).
BY_SUFFIX = {
    ".service": ("systemd unit", "systemd-analyze verify checks it where it is installed"),
    ".socket": ("systemd unit", "systemd-analyze verify checks it where it is installed"),
    ".timer": ("systemd unit", "systemd-analyze verify checks it where it is installed"),
    ".md": ("documentation", ""),
    ".py": ("Python program", ""),
}

#: How long a checking tool may take on one file.
TOOL_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class ForeignFile:
    """What a file is, and the command that checks it (None: nothing here can)."""

    kind: str
    check: tuple[str, ...] | None = None
    hint: str = ""


@dataclass(frozen=True)
class ForeignVerdict:
    """The outcome of checking a foreign file.

    ``error`` is None when it passed; ``checked`` is False when nothing here could
    check it (it is then skipped, not failed).
    """

    summary: str
    error: str | None = None
    checked: bool = True


def recognise(path: Path) -> ForeignFile | None:
    """What ``path`` is when it is another tool's file, else None (sn-monitor reads it).

    A file that is not YAML at all is left to sn-monitor's loader, whose error names the
    line.
    """
    if path.suffix in BY_SUFFIX:
        kind, hint = BY_SUFFIX[path.suffix]
        return ForeignFile(kind, hint=hint)
    documents = _mappings(path)
    if documents is None:
        return None
    manifest = _kubernetes_manifest(documents)
    if manifest is not None or len(documents) != 1:
        return manifest
    return _monitoring_config(documents[0], str(path)) or _shipping_config(documents[0],
                                                                          str(path))


def _mappings(path: Path) -> list[dict[Any, Any]] | None:
    """The file's YAML documents when there are some and each is a mapping, else None."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8"))
                     if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not documents or not all(isinstance(d, dict) for d in documents):
        return None
    return documents


def _kubernetes_manifest(documents: list[dict[Any, Any]]) -> ForeignFile | None:
    """Kubernetes objects, every one, none of a kind sn-monitor reads itself."""
    kinds = [_kubernetes_kind(d) for d in documents]
    if all(kinds) and not OWN_KINDS & set(kinds):
        names = ", ".join(dict.fromkeys(str(k) for k in kinds))
        return ForeignFile(f"Kubernetes manifest: {names}",
                           hint="kubectl apply --dry-run=server checks it")
    return None


def _monitoring_config(doc: dict[Any, Any], name: str) -> ForeignFile | None:
    """A Prometheus configuration or rule file, or an Alertmanager configuration."""
    if doc.keys() & {"scrape_configs", "rule_files", "remote_write"} or (
            "global" in doc and "alerting" in doc):
        return ForeignFile("Prometheus configuration",
                           ("promtool", "check", "config", "--syntax-only", name))
    if {"route", "receivers"} <= doc.keys():
        return ForeignFile("Alertmanager configuration", ("amtool", "check-config", name))
    if isinstance(doc.get("groups"), list) and all(
            isinstance(g, dict) and "rules" in g for g in doc["groups"]):
        return ForeignFile("Prometheus rule file", ("promtool", "check", "rules", name))
    return None


def _shipping_config(doc: dict[Any, Any], name: str) -> ForeignFile | None:
    """A Vector pipeline, a Filebeat config or an Elasticsearch index template."""
    if "sinks" in doc and ("sources" in doc or "transforms" in doc):
        return ForeignFile("Vector configuration",
                           ("vector", "validate", "--no-environment", name))
    if "filebeat.inputs" in doc or isinstance(doc.get("filebeat"), dict):
        return ForeignFile("Filebeat configuration", ("filebeat", "test", "config", "-c", name))
    if "index_patterns" in doc:
        return ForeignFile("Elasticsearch index template",
                           hint="PUT _index_template/<name> on a cluster checks it")
    return None


def check(found: ForeignFile) -> ForeignVerdict:
    """Run the file's own checking tool when it is on PATH; say what was done."""
    if found.check is None:
        return ForeignVerdict(f"{found.kind}: not sn-monitor's, not checked"
                              + (f" ({found.hint})" if found.hint else ""), checked=False)
    tool = found.check[0]
    if shutil.which(tool) is None:
        return ForeignVerdict(f"{found.kind}: not checked, {tool} is not on PATH",
                              checked=False)
    try:
        done = subprocess.run(found.check, capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return ForeignVerdict(found.kind, f"{tool} did not answer in "
                                          f"{TOOL_TIMEOUT_SECONDS:.0f} s")
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return ForeignVerdict(found.kind, f"{tool}: " + " ".join(said[-3:]))
    return ForeignVerdict(f"{found.kind}, checked with {tool}")


def _kubernetes_kind(doc: dict[Any, Any]) -> str | None:
    """The kind of a Kubernetes object (``apiVersion`` and ``kind`` both set), else None."""
    kind, api = doc.get("kind"), doc.get("apiVersion")
    return kind if isinstance(kind, str) and isinstance(api, str) else None
