"""A log line's rank, node and time, from its file's path or from the line."""

from __future__ import annotations

import pytest

from sn_monitor.joblog.context import line_node, line_rank, line_time, origin_of, split_prefix


@pytest.mark.parametrize(("path", "rank", "node"), [
    ("/tmp/logs/job_abc/attempt_0/3/stderr.log", 3, None),
    ("logs/attempt_2/12/stdout.log", 12, None),
    ("out/rank_3.log", 3, None),
    ("out/rank3.out", 3, None),
    ("out/node-a.rank7.log", 7, "node-a"),
    ("out/train.log", None, None),
    ("out/frank1.log", None, None),
])
def test_the_path_names_the_rank_and_node(path: str, rank: int | None, node: str | None) -> None:
    origin = origin_of(path)
    assert (origin.rank, origin.node) == (rank, node)


def test_tee_and_srun_prefixes_name_the_rank_and_are_split_off() -> None:
    assert split_prefix("[rank3]: Traceback (most recent call last):") == (
        3, "Traceback (most recent call last):")
    assert split_prefix("[default5]:  File x") == (5, " File x")
    assert split_prefix("12: Fatal Python error: Segmentation fault") == (
        12, "Fatal Python error: Segmentation fault")
    assert split_prefix("plain line") == (None, "plain line")


def test_a_line_rank_beats_the_paths_which_beats_a_process_groups() -> None:
    pg = "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout"
    assert line_rank(f"[rank4]:{pg}", 9) == 4
    assert line_rank(pg, 9) == 9
    assert line_rank(pg, None) == 1
    assert line_rank("[RANK 2] Collecting rollouts", None) == 2


def test_ncclss_host_prefix_names_the_node() -> None:
    line = "tj5-sc-ai-h800r-dev01:534:1763 [3] NCCL INFO NVLS comm 0x7f1928e6e060 headRank 3"
    assert line_node(line, None) == "tj5-sc-ai-h800r-dev01"
    assert line_node("no host here", "n1") == "n1"


def test_times_iso_in_utc_and_glog_in_the_given_year() -> None:
    assert line_time("[2024-09-11 17:52:11,320] [INFO] x", 2000) == 1726077131.32
    assert line_time("time      : 2025-05-21_15:43:03", 2000) == 1747842183.0
    glog = line_time("[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] x", 2025)
    assert glog == pytest.approx(1742522828.408271)
    assert line_time("E0325 20:57:27.620000 2606 api.py:869] failed", 2025) == pytest.approx(
        1742936247.62)
    assert line_time("no time", 2025) is None
