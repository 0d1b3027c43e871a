"""The installed ``sn-monitor`` command, run as a person runs it: a real process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def sn_monitor(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``sn-monitor ARGV...`` from the repository root; the module where no script is."""
    script = shutil.which("sn-monitor", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "sn_monitor.cli"]
    return subprocess.run([*command, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)
