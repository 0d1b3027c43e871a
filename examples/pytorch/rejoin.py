"""How a restore reaches ranks that stay alive: the launcher's plan and each node's answer.

A warm restore (``launcher.py``'s default) does not kill the job's healthy ranks: it
writes the next generation's *plan*, and every process that can take part joins it in
the process it already runs (torch imported, the job's code loaded), as NVIDIA's NVRx
in-process restart does. The launcher and the ranks share one directory per job
(``SN_REJOIN_DIR``):

``plan.json``
    ``{"generation", "nodes", "checkpoint"}``: the generation to form, rank i on
    ``nodes[i]``, and the checkpoint the launcher was given. Written atomically by the
    launcher; only ever for a newer generation.
``node-<node>.json``
    ``{"pid", "state", "generation"}``: what the process serving ``<node>`` does now:
    ``waiting`` for a plan newer than ``generation`` (a rank that left a broken
    generation, or a pre-warmed standby on a spare), or ``joined`` ``generation``.

The process groups of a warm generation form on the job's rendezvous store (the one its
torchrun agents use, kept off the job's nodes), under the key prefix of the generation.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PLAN = "plan.json"
#: How often a waiting process looks for a plan.
POLL_SECONDS = 0.05

State = Literal["waiting", "joined"]


@dataclass(frozen=True)
class Plan:
    """A generation to form: rank i on ``nodes[i]``, resuming from ``checkpoint``."""

    generation: int
    nodes: tuple[str, ...]
    checkpoint: str | None = None

    def rank_of(self, node: str) -> int | None:
        return self.nodes.index(node) if node in self.nodes else None

    def store_prefix(self, job: str) -> str:
        """The generation's keys on the job's store: no two generations share one."""
        return f"{job}-warm-g{self.generation}/"


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write_plan(directory: Path, plan: Plan) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / PLAN, {"generation": plan.generation, "nodes": list(plan.nodes),
                              "checkpoint": plan.checkpoint})


def read_plan(directory: Path) -> Plan | None:
    doc = _read(directory / PLAN)
    if doc is None:
        return None
    return Plan(int(doc["generation"]), tuple(str(n) for n in doc["nodes"]),
                doc.get("checkpoint"))


def newer_plan(directory: Path, generation: int) -> Plan | None:
    """The plan, when it is for a generation after ``generation``."""
    plan = read_plan(directory)
    return plan if plan is not None and plan.generation > generation else None


def announce(directory: Path, node: str, state: State, generation: int) -> None:
    """Say what this process does for ``node`` (the launcher reads it)."""
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / f"node-{node}.json",
           {"pid": os.getpid(), "state": state, "generation": generation})


def answer(directory: Path, node: str) -> dict[str, Any] | None:
    """What the process serving ``node`` last said, None when nothing did."""
    return _read(directory / f"node-{node}.json")


def wait_for_plan(directory: Path, node: str, after: int, timeout: float,
                  *, standby: bool) -> Plan | None:
    """The first plan newer than ``after`` that concerns this process; None on timeout.

    A rank that left a generation takes the next plan whatever it says (one without its
    node tells it to stop); a standby waits for a plan that names its node.
    """
    announce(directory, node, "waiting", after)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        plan = newer_plan(directory, after)
        if plan is not None and (not standby or plan.rank_of(node) is not None):
            return plan
        time.sleep(POLL_SECONDS)
    return None
