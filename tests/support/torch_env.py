"""Whether torch can run here, for the end-to-end tests that need it (they skip without it)."""

from __future__ import annotations

import os

import pytest


def torch_available() -> bool:
    """torch is importable (``pip install -e '.[examples]'``); REQUIRE_TORCH=1 makes its
    absence a failure, not a skip (CI)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("REQUIRE_TORCH") == "1":
            pytest.fail("torch is not installed and REQUIRE_TORCH=1: "
                        "pip install -e '.[examples]'")
        return False
    return True
