"""Where the agent writes its ECS documents: ``job_logs.output`` in its config.

Apart from the writer (:mod:`sn_monitor.joblog.ecs`) so that the agent's config can name
it without loading the writer.
"""

from __future__ import annotations

from dataclasses import dataclass

from sn_monitor.config import at_least_one, non_negative, setting


def _not_empty(value: str) -> None:
    if not value.strip():
        raise ValueError("must not be empty")


@dataclass(frozen=True)
class EcsOutputOptions:
    """Where the documents go: ``job_logs.output`` (absent: no documents are written).

    ``path``: the file (renamed ``<path>.1`` ... past ``max_bytes``, ``keep`` old files
    kept); ``raw_lines``: every line read, not only the findings (a lot of data: a job
    can print megabytes a second); ``queue_lines``: documents waiting for the disk
    (full: new ones are dropped and counted).
    """

    path: str = setting(check=_not_empty)
    raw_lines: bool = False
    max_bytes: int = setting(default=64 << 20, check=at_least_one)
    keep: int = setting(default=5, check=non_negative)
    queue_lines: int = setting(default=8192, check=at_least_one)
