"""Shared test settings: where the fixture trees are, which outside tools exist, and a
recording HTTP server for the drivers' tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.drivers.servers import RecordingHTTPServer

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def server() -> Iterator[RecordingHTTPServer]:
    """A :class:`RecordingHTTPServer` on loopback (a module may define its own ``server``)."""
    srv = RecordingHTTPServer()
    srv.start()
    yield srv
    srv.stop()


def require_tool(name: str) -> str:
    """The path of a Debian tool the test needs; in CI it is installed by .ci/run."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run .ci/run (apt-get install prometheus)")
    return path


def assert_promtool_clean(exposition: str) -> None:
    """``promtool check metrics`` finds no problem, not even a warning, in ``exposition``."""
    import subprocess

    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, text=True,
                            capture_output=True, check=False, timeout=60)
    problems = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, problems
    assert problems == ""


def expected_messages(directory: Path) -> list[tuple[str, str]]:
    """A corpus of bad files: ``directory/EXPECTED`` lines ``file | message after the path``."""
    rows = []
    for line in (directory / "EXPECTED").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, message = (part.strip() for part in line.split("|", 1))
            rows.append((name, message))
    return rows
