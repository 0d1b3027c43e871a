"""torch's elastic error file: parsed, and read by the analysis as the rank's dated failure."""

from __future__ import annotations

import json
from pathlib import Path

from sn_monitor.joblog.analysis import analyze
from sn_monitor.joblog.errorfile import parse_error_file

STACK = ('Traceback (most recent call last):\n'
         '  File "/job/failures.py", line 77, in before_step\n'
         '    activations = torch.empty(OOM_ROWS, 32)\n'
         "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
         "allocate memory: you tried to allocate 1125899906842624 bytes. Error code 12 (Cannot "
         "allocate memory)\n")


def error_file(message: str, stack: str, timestamp: str) -> str:
    return json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": stack, "timestamp": timestamp}}})


def test_an_error_file_is_told_from_other_json_and_text() -> None:
    parsed = parse_error_file(error_file("RuntimeError: x", STACK, "1796612902"))
    assert parsed is not None
    assert (parsed.message, parsed.timestamp) == ("RuntimeError: x", 1796612902.0)
    assert parse_error_file('{"message": "a plain string"}') is None
    assert parse_error_file("[rank0]: not json") is None
    assert parse_error_file("[1, 2]") is None
    no_time = parse_error_file(json.dumps({"message": {"message": "E: x"}}))
    assert no_time is not None
    assert (no_time.py_callstack, no_time.timestamp) == ("", None)


def test_the_analysis_dates_a_ranks_failure_by_its_error_file(tmp_path: Path) -> None:
    rank_dir = tmp_path / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "error.json").write_text(error_file("RuntimeError: ...", STACK, "1796612902"))
    [found] = analyze([tmp_path]).findings
    assert (found.file, found.line, found.rank) == (str(rank_dir / "error.json"), 1, 1)
    assert (found.category, found.timestamp) == ("cuda-oom", 1796612902.0)
    assert found.params["frame"] == 'File "/job/failures.py", line 77, in before_step'
