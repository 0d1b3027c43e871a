"""The prefilter finds every keyword in a chunk, whichever way it searches for it."""

from __future__ import annotations

from sn_monitor.joblog.prefilter import Prefilter

PREFILTER = Prefilter(["Watchdog caught", "(exitcode", "nan", "ncclRemoteError", "Error"])
TEXT = ("step 1 loss 2.0\n"              # 0: nothing
        "[rank1]: ncclRemoteError: x\n"  # 16: a slow keyword holding a fast one ("Error")
        "grad_norm: nan\n"               # 44: a slow keyword alone
        "failed (exitcode: -9)\n"        # 59: a fast keyword led by punctuation
        "benign\n")


def test_each_keyword_is_found_at_its_place_and_then_no_more() -> None:
    scan = PREFILTER.scan(TEXT)
    hits, pos = [], 0
    for _ in range(10):
        hit = scan.next_hit(pos)
        if hit < 0:
            break
        hits.append(TEXT[hit:TEXT.index("\n", hit)])
        pos = TEXT.index("\n", hit) + 1
    assert hits == ["Error: x", "nan", "(exitcode: -9)"]


def test_a_single_line_holds_a_keyword_or_not() -> None:
    assert PREFILTER.holds("[rank1]: ncclRemoteError: x")
    assert PREFILTER.holds("loss nan")
    assert not PREFILTER.holds("step 1 loss 2.0 lr 0.1")
    assert Prefilter([]).scan("anything").next_hit(0) == -1
