"""Names in their natural order: ``mlx5_2`` before ``mlx5_10``, ``sim-2`` before ``sim-10``."""

from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """The sort key of ``name``: its runs of digits compare as numbers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part)
                 for part in _DIGITS.split(name) if part)
