"""``sn-monitor logs analyze`` through the real entry point: the JSON contract, the human
report, the exit statuses (0 once analysed, 2 when it cannot be); and ``check-config`` on a
signature catalogue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.entry_point import sn_monitor

CLOSED = ("[rank{r}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
          "Connection closed by peer [127.0.0.1]:10895")
AGENT = """\
I1207 03:00:00.000000 100 torch/distributed/elastic/agent/server/api.py:525] [default] starting
W1207 03:01:00.000000 100 torch/distributed/elastic/multiprocessing/api.py:897] \
Sending process 11 closing signal SIGTERM
E1207 03:01:00.500000 100 torch/distributed/elastic/multiprocessing/api.py:869] \
failed (exitcode: -9) local_rank: 1 (pid: 12) of binary: /usr/bin/python
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_03:01:00
  host      : node-a
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 12)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 12
============================================================
"""


@pytest.fixture
def killed_job(tmp_path: Path) -> Path:
    """torchrun --log-dir of 4 ranks: rank 1 SIGKILLed (silent), the others lost it."""
    logs = tmp_path / "logs"
    for rank in range(4):
        rank_dir = logs / "attempt_0" / str(rank)
        rank_dir.mkdir(parents=True)
        lines = [f"[rank{rank}]: step 41 loss=2.17"]
        if rank != 1:
            lines += [f"[rank{rank}]: Traceback (most recent call last):",
                      f'[rank{rank}]:   File "/job/train.py", line 30, in <module>',
                      f"[rank{rank}]:     dist.all_reduce(loss)", CLOSED.format(r=rank)]
        (rank_dir / "stderr.log").write_text("\n".join(lines) + "\n")
    (logs / "agent.log").write_text(AGENT)
    return logs


def test_json_names_the_killed_rank_and_keeps_to_the_contract(killed_job: Path) -> None:
    result = sn_monitor("logs", "analyze", "--json", str(killed_job))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"findings", "root_cause"}
    # torchrun's block (its time 0.5 s before its own log line's) gives the node too
    assert report["root_cause"] == {"file": str(killed_job / "agent.log"), "line": 9,
                                    "rank": 1, "node": "node-a", "category": "process-killed"}
    for item in report["findings"]:
        assert set(item) == {"file", "line", "category", "root_candidate", "rank", "node",
                             "text"}
    closed = [f for f in report["findings"] if f["category"] == "network-error"]
    assert sorted(f["rank"] for f in closed) == [0, 2, 3]
    assert not any(f["root_candidate"] for f in closed)
    assert all(f["line"] == 5 for f in closed)


def test_the_human_report_names_the_first_failing_rank_with_its_lines(killed_job: Path) -> None:
    result = sn_monitor("logs", "analyze", str(killed_job))
    assert result.returncode == 0
    out = result.stdout
    assert "5 file(s)" in out
    assert "categories: process-killed 3, network-error 3" in out
    assert "root cause: process-killed on rank 1, node node-a" in out
    assert "failed (exitcode: -9) local_rank: 1" in out
    assert "lines of rank 1:" in out


def test_logs_with_no_failure_have_no_root_cause(tmp_path: Path) -> None:
    log = tmp_path / "rank_0.log"
    log.write_text("{'loss': 0.2051, 'grad_norm': nan, 'learning_rate': 9.7e-06}\n")
    result = sn_monitor("logs", "analyze", "--json", str(log))
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"findings": [], "root_cause": None}


def test_a_missing_path_or_bad_catalogue_exits_2_in_one_line(tmp_path: Path) -> None:
    missing = sn_monitor("logs", "analyze", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"{tmp_path / 'nope'}: no such file or directory"
    bad = tmp_path / "sig.yaml"
    bad.write_text("kind: JobLogSignatures\nversion: x\nsignatures:\n  - name: a\n"
                   "    category: nope\n")
    result = sn_monitor("logs", "analyze", "--signatures", str(bad), str(tmp_path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad}:5: signatures[0].category: unknown category 'nope'" in result.stderr


def test_check_config_checks_a_signature_catalogue(tmp_path: Path) -> None:
    packaged = ROOT / "sn_monitor" / "joblog" / "signatures.yaml"
    ok = sn_monitor("check-config", str(packaged))
    assert ok.returncode == 0
    assert ok.stdout.strip() == f"{packaged}: ok (job-log signatures)"
    bad = tmp_path / "sig.yaml"
    bad.write_text(packaged.read_text().replace("    keywords: ['ECC', 'NVRM: Xid']\n", "", 1))
    result = sn_monitor("check-config", str(bad))
    assert result.returncode == 2
    assert "signatures[0]: a line signature needs keywords" in result.stderr
