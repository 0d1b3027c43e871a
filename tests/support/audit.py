"""A DistributedJob body as an operator posts it, written for the audit-trail tests and
reused by those that check who may post a job."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _job(tmp_path: Path, name: str = "llm") -> dict[str, Any]:
    ckpt = tmp_path / f"ckpt-{name}"
    ckpt.mkdir(exist_ok=True)
    return {
        "apiVersion": "sn-monitor/v1", "kind": "DistributedJob", "metadata": {"name": name},
        "spec": {"replicas": 2, "nodes": ["gpu-4", "gpu-5"], "spares": ["gpu-6"],
                 "recoveryStrategy": "manual", "checkpoint": {"dir": str(ckpt)},
                 "control": {"slurm": {"jobId": 4242}}},
    }
