"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import headless_chromium


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium driven by selenium (``tests/support/browser.py``), its profile in
    the test's ``tmp_path``; skipped without it unless ``REQUIRE_CHROMIUM`` is set."""
    with headless_chromium(tmp_path) as chrome:
        yield chrome
