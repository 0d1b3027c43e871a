"""Root-cause ordering: the first failure, not the cascade; a node fault before both."""

from __future__ import annotations

from sn_monitor.joblog.model import Finding, NodeFault, Participant
from sn_monitor.joblog.rootcause import order


def finding(rank: int | None, category: str, *, root: bool, line: int = 10,
            severity: str = "error", at: float | None = None, file: str | None = None,
            node: str | None = None, **params: str) -> Finding:
    return Finding(file=file or f"rank{rank}.log", line=line, category=category,
                   severity=severity, root_candidate=root, rank=rank, node=node,  # type: ignore[arg-type]
                   text=f"{category} on {rank}", params=params, timestamp=at)


def ranks(*numbers: int) -> list[Participant]:
    return [Participant(rank=n, file=f"rank{n}.log", lines=100) for n in numbers]


def test_nothing_failed_means_no_root_cause() -> None:
    assert order([], participants=ranks(0, 1)) is None
    assert order([finding(0, "nan-loss", root=False, severity="info")]) is None


def test_a_killed_rank_named_by_torchrun_beats_its_peers_connection_errors() -> None:
    cascade = [finding(r, "network-error", root=False, line=5) for r in (0, 2, 3)]
    killed = finding(1, "process-killed", root=True, line=40, severity="critical",
                     file="agent.log", exitcode="-9")
    cause = order([*cascade, killed], participants=ranks(0, 1, 2, 3))
    assert cause is not None
    assert (cause.rank, cause.category, cause.file, cause.line) == (1, "process-killed",
                                                                    "agent.log", 40)


def test_a_hang_is_blamed_on_the_rank_that_reported_nothing_not_on_the_first_to_exit() -> None:
    timeouts = [finding(r, "nccl-timeout", root=False) for r in (0, 1, 3)]
    first_exit = finding(0, "app-bug", root=False, file="agent.log", line=90, exitcode="1")
    console = [Participant(rank=r, file="agent.log", lines=300, shared=True) for r in range(4)]
    cause = order([*timeouts, first_exit], participants=[*console, *ranks(0, 1, 2, 3)])
    assert cause is not None
    assert (cause.rank, cause.category, cause.file, cause.line) == (2, "nccl-timeout",
                                                                    "rank2.log", 100)
    assert "rank 2 reported no failure" in cause.reason


def test_a_hang_seen_on_every_rank_blames_the_rank_whose_collectives_are_behind() -> None:
    behind = [finding(r, "nccl-timeout", root=False, seq="1580") for r in (0, 1, 3)]
    behind.append(finding(2, "nccl-timeout", root=False, seq="1579"))
    cause = order(behind, participants=ranks(0, 1, 2, 3))
    assert cause is not None
    assert (cause.rank, cause.category) == (2, "nccl-timeout")
    even = [finding(r, "nccl-timeout", root=False, seq="7", line=10 + r) for r in range(4)]
    cause = order(even, participants=ranks(0, 1, 2, 3))
    assert cause is not None
    assert cause.rank == 0
    assert "only the cascade" in cause.reason


def test_candidates_are_ordered_by_time_when_all_have_one() -> None:
    late = finding(0, "cuda-oom", root=True, at=200.0, line=1)
    early = finding(3, "app-bug", root=True, at=100.0, line=500)
    cause = order([late, early])
    assert cause is not None
    assert cause.rank == 3
    untimed = finding(5, "nan-loss", root=True, line=2, severity="critical")
    cause = order([late, early, untimed])
    assert cause is not None
    assert cause.rank == 5  # no common clock: the worse, then the earlier in its file


def test_an_xid_before_the_timeouts_makes_the_node_the_root_cause() -> None:
    symptoms = [finding(r, "nccl-timeout", root=False, at=300.0) for r in range(8)]
    symptoms.append(finding(5, "cuda-error", root=True, at=150.0, node="b"))
    xid = NodeFault(node="b", category="xid-79", timestamp=120.0, text="NVRM: Xid 79")
    cause = order(symptoms, faults=[xid])
    assert cause is not None
    assert (cause.node, cause.category, cause.rank, cause.fault) == ("b", "xid-79", None, xid)


def test_an_app_bug_before_the_xid_is_still_the_apps() -> None:
    bug = finding(2, "app-bug", root=True, at=50.0)
    xid = NodeFault(node="b", category="xid-79", timestamp=120.0)
    cause = order([bug], faults=[xid])
    assert cause is not None
    assert (cause.rank, cause.category) == (2, "app-bug")
