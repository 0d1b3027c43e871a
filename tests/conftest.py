"""Shared test settings: where the fixture trees are, and which outside tools exist."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


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
