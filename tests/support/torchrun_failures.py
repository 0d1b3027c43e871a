"""The real torchrun failure logs (``tests/fixtures/joblogs/torchrun/<mode>/``): their
layout, their ``expected.yaml``, and the evidence each failure mode must leave in them.

A mode's directory is what ``examples/pytorch/capture_failures.py`` keeps of one run:
``torchrun.log`` (the agent's console: its messages, the ranks' lines it tees and its
``ChildFailedError`` summary), ``logs/<run id>/attempt_0/<rank>/`` (each rank's
``stdout.log``, ``stderr.log`` and, for a rank that raised, ``error.json``) and
``expected.yaml``. The same checks read the fixtures (``make test``) and fresh runs
(``make e2e``), so a recapture that lost the evidence fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sn_monitor.config import bind, load_yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "joblogs" / "torchrun"
CAPTURE = ROOT / "examples" / "pytorch" / "capture_failures.py"
MODES = ("kill", "oom", "nan", "hang", "exception")
WORLD = 4
Category = Literal["nccl-timeout", "nccl-error", "network-error", "cuda-oom", "cuda-error",
                   "ecc-error", "nan-loss", "process-killed", "segfault", "app-bug",
                   "rendezvous-error", "dataloader-error", "host-oom"]

#: The root rank's own error (the last line of its stderr), per mode that prints one.
ROOT_ERRORS = {
    "oom": re.compile(r"RuntimeError: .*DefaultCPUAllocator: can't allocate memory"),
    "nan": re.compile(r"FloatingPointError: rank \d+: loss is nan at step \d+"),
    "exception": re.compile(r"KeyError: 'shard-\d+'"),
}
#: What a rank that merely lost a peer or waited for one prints (gloo's transport; its
#: pair closed after a timeout of its own).
GLOO_ERROR = re.compile(r"RuntimeError: (\[[^\]]*/gloo/transport/tcp/[^\]]*\] "
                        r"|Application timeout caused pair closure)")
GLOO_TIMEOUT = re.compile(r"Timed out waiting \d+ms for (recv|send) operation to complete"
                          r"|Application timeout caused pair closure")
#: A rank's entry in torchrun's ChildFailedError summary.
SUMMARY_ENTRY = re.compile(r"rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)")


@dataclass(frozen=True)
class Expected:
    """``expected.yaml``: the rank that failed first and the failure's category."""

    root_rank: int
    category: Category
    note: str


@dataclass(frozen=True)
class RunLogs:
    """One run's files, read."""

    directory: Path
    console: str
    stderr: dict[int, str]
    stdout: dict[int, str]

    @classmethod
    def read(cls, directory: Path) -> RunLogs:
        stderr, stdout = {}, {}
        for rank_dir in directory.glob("logs/*/attempt_0/*"):
            rank = int(rank_dir.name)
            stderr[rank] = (rank_dir / "stderr.log").read_text()
            stdout[rank] = (rank_dir / "stdout.log").read_text()
        return cls(directory, (directory / "torchrun.log").read_text(), stderr, stdout)

    def exit_codes(self) -> dict[int, int]:
        """Each rank's exit code in torchrun's summary (negative: the signal)."""
        return {int(rank): int(code) for rank, code in SUMMARY_ENTRY.findall(self.console)}

    def last_error(self, rank: int) -> str:
        """The exception ``rank`` died of: its traceback's last line ('' without one).

        Not the last line of its stderr: a rank may abort in its teardown after it
        (``terminate called without an active exception``, ``Fatal Python error``).
        """
        prefix = f"[rank{rank}]: "
        errors = [line for line in self.stderr[rank].splitlines()
                  if line.startswith(prefix) and not line[len(prefix):].startswith(" ")
                  and not line.startswith(f"{prefix}Traceback")]
        return errors[-1] if errors else ""


def expected(directory: Path) -> Expected:
    return bind(Expected, load_yaml(directory / "expected.yaml"))


def log_paths(directory: Path) -> list[Path]:
    """What an analysis of the run reads: the console and the ranks' files."""
    return [directory / "torchrun.log", directory / "logs"]


def assert_evidence(mode: str, directory: Path) -> None:
    """The run in ``directory`` failed as ``mode`` says, and its logs show it."""
    want = expected(directory)
    logs = RunLogs.read(directory)
    root, others = want.root_rank, [r for r in range(WORLD) if r != want.root_rank]
    assert sorted(logs.stderr) == list(range(WORLD)), sorted(logs.stderr)
    assert "torch.distributed.elastic.multiprocessing.errors.ChildFailedError" in logs.console
    assert "Root Cause (first observed failure)" in logs.console
    codes = logs.exit_codes()
    assert sorted(codes) == list(range(WORLD)), codes
    assert all(code != 0 for code in codes.values()), codes
    # every other rank either printed nothing or a gloo error: the cascade, never the root's
    for rank in others:
        error = logs.last_error(rank)
        assert error == "" or GLOO_ERROR.search(error), (rank, error)
    if mode in ROOT_ERRORS:
        assert ROOT_ERRORS[mode].search(logs.last_error(root)), logs.last_error(root)
        assert f"[rank{root}]: Traceback" in logs.stderr[root]
        assert codes[root] == 1, codes
    elif mode == "kill":
        assert logs.stderr[root] == "", logs.stderr[root]
        assert codes[root] == -9, codes
        assert [r for r, code in codes.items() if code == -9] == [root], codes
    elif mode == "hang":
        # the hung rank printed nothing and torchrun stopped it; the others timed out
        assert logs.stderr[root] == "", logs.stderr[root]
        assert codes[root] == -15, codes
        timed_out = [r for r in others if GLOO_TIMEOUT.search(logs.last_error(r))]
        assert timed_out, [logs.last_error(r) for r in others]
        assert all(GLOO_TIMEOUT.search(logs.last_error(r)) for r in others
                   if logs.last_error(r)), [logs.last_error(r) for r in others]
    else:
        raise AssertionError(f"no evidence known for mode {mode!r}")
