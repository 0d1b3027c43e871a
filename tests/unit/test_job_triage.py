"""The jobs' failure triage: log findings and node faults in, the root cause out.

The clock is a manual one: the settle time passes by moving it, never by waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sn_monitor.clock import ManualClock
from sn_monitor.controller.ingest.decode import controller_times
from sn_monitor.controller.jobs.triage import APPLICATION_CATEGORIES, MAX_FINDINGS, JobTriage
from sn_monitor.model import EventRecord, Report
from sn_monitor.rules.xid_catalog import load_catalog

T0 = 1_700_000_000.0
#: Rank r runs on node n<r // 2>: two ranks a node, four ranks.
NODES = ("n0", "n1")


@dataclass
class Membership:
    """The orchestrator's side as the triage reads it: one job ``llm`` on n0 and n1."""

    ranks: dict[str, list[int]] = field(default_factory=lambda: {"n0": [0, 1], "n1": [2, 3]})
    removed: bool = False

    def jobs_of_node(self, node: str) -> list[str]:
        return ["llm"] if node in NODES else []

    def exists(self, name: str) -> bool:
        return name == "llm" and not self.removed

    def ranks_by_node(self, name: str) -> dict[str, list[int]]:
        return dict(self.ranks) if name == "llm" else {}


def finding(event_id: int, rank: int, category: str, at: float, *, root: bool = False,
            severity: str = "error", text: str = "", **extra: Any) -> EventRecord:
    return EventRecord(
        id=event_id, kind="log", source="joblog", time_seconds=at + 2.0,
        message=text or f"rank {rank}: {category}", category=category, severity=severity,  # type: ignore[arg-type]
        rank=rank, root_candidate=root, file=f"/logs/llm/rank{rank}.log", line=10 + event_id,
        line_time_seconds=at, **extra)


def xid(event_id: int, code: int, at: float) -> EventRecord:
    return EventRecord(id=event_id, kind="xid", source="kmsg", time_seconds=at, code=code,
                       gpu=0, message=f"NVRM: Xid (PCI:0000:18:00): {code}, pid=4242")


def timeouts(first_id: int, at: float, ranks: range | tuple[int, ...] = range(4)
             ) -> dict[str, list[EventRecord]]:
    """An NCCL watchdog timeout on each rank, by the node whose agent reads it."""
    out: dict[str, list[EventRecord]] = {}
    for i, rank in enumerate(ranks):
        out.setdefault(NODES[rank // 2], []).append(finding(
            first_id + i, rank, "nccl-timeout", at + rank * 0.1,
            text=f"[Rank {rank}] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE) ran for 600000 milliseconds"))
    return out


def triage(clock: ManualClock, membership: Membership | None = None) -> JobTriage:
    return JobTriage(membership or Membership(), clock, load_catalog(), settle=30.0)


def test_an_xid_then_timeouts_on_every_rank_is_the_xid_nodes_fault() -> None:
    clock = ManualClock(T0)
    t = triage(clock)
    t.take("n1", "a1", [xid(1, 79, T0 - 590)])
    for node, events in timeouts(2, T0).items():
        t.take(node, "a1" if node == "n1" else "a0", events)
    assert t.due() == []  # the cascade may still be on its way from other agents
    clock.advance(30)
    [cause] = t.due()
    assert (cause.job, cause.node, cause.rank, cause.category) == ("llm", "n1", None, "xid-79")
    assert "Xid" in cause.excerpt
    assert cause.at == T0 - 590
    assert not cause.application
    assert t.due() == []  # once per failure
    assert t.root_cause("llm") == cause


def test_an_application_xid_is_not_a_node_fault() -> None:
    """XID 13 is the application's (NVIDIA's RESTART_APP): the rank's own error wins."""
    clock = ManualClock(T0)
    t = triage(clock)
    t.take("n0", "a0", [xid(1, 13, T0 - 5),
                        finding(2, 1, "cuda-error", T0, root=True,
                                text="RuntimeError: CUDA error: an illegal memory access")])
    for node, events in timeouts(3, T0 + 600, (0, 2, 3)).items():
        t.take(node, "b", events)
    clock.advance(30)
    [cause] = t.due()
    assert (cause.rank, cause.node, cause.category) == (1, "n0", "cuda-error")


def test_findings_from_several_agents_out_of_order_name_the_earliest_own_failure() -> None:
    """n1's timeouts arrive first; n0's earlier CUDA OOM on rank 1 comes in later."""
    clock = ManualClock(T0)
    t = triage(clock)
    late = timeouts(10, T0 + 600)
    t.take("n1", "a1", late["n1"])
    clock.advance(10)
    t.take("n0", "a0", [*late["n0"], finding(
        1, 1, "cuda-oom", T0, root=True, severity="critical",
        text="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 GiB")])
    clock.advance(20)
    [cause] = t.due()
    assert (cause.rank, cause.node, cause.category) == (1, "n0", "cuda-oom")
    assert cause.file == "/logs/llm/rank1.log"
    assert cause.line == 11
    assert cause.application
    assert "cuda-oom" in APPLICATION_CATEGORIES
    assert cause.findings == 5


def test_a_killed_rank_is_named_not_the_ranks_that_timed_out() -> None:
    clock = ManualClock(T0)
    t = triage(clock)
    for node, events in timeouts(10, T0 + 600, (0, 1, 3)).items():
        t.take(node, "a", events)
    t.take("n1", "a", [finding(100, 2, "process-killed", T0, root=True, severity="critical",
                               text="Signal 9 (SIGKILL) received by PID 4242")])
    clock.advance(30)
    [cause] = t.due()
    assert (cause.rank, cause.node, cause.category) == (2, "n1", "process-killed")


def test_a_hung_rank_is_named_from_the_others_timeouts_alone() -> None:
    """Rank 2 prints nothing (it hangs); ranks 0, 1, 3 time out: the suspect is rank 2."""
    clock = ManualClock(T0)
    t = triage(clock)
    for node, events in timeouts(1, T0 + 600, (0, 1, 3)).items():
        t.take(node, "a", events)
    clock.advance(30)
    [cause] = t.due()
    assert (cause.rank, cause.node, cause.category) == (2, "n1", "nccl-timeout")
    assert "hung" in cause.reason


def test_a_rank_behind_in_its_collectives_is_named_without_progress_reports() -> None:
    """No ranks known from progress: the collective sequence numbers tell (wire params)."""
    clock = ManualClock(T0)
    t = triage(clock, Membership(ranks={}))
    t.take("n0", "a", [finding(i + 1, rank, "nccl-timeout", T0 + rank,
                               params={"seq": "1234" if rank != 1 else "1233"})
                       for i, rank in enumerate(range(4))])
    clock.advance(30)
    [cause] = t.due()
    assert (cause.rank, cause.category) == (1, "nccl-timeout")


def test_an_event_sent_again_is_taken_once_and_later_findings_refine_the_cause() -> None:
    clock = ManualClock(T0)
    t = triage(clock)
    timeouts_n0 = timeouts(1, T0 + 600)["n0"]
    t.take("n0", "a0", timeouts_n0)
    t.take("n0", "a0", timeouts_n0)  # not acknowledged: the agent sends them again
    clock.advance(30)
    [first] = t.due()
    assert first.findings == 2
    t.take("n1", "a1", [finding(9, 3, "app-bug", T0, root=True,
                                text="ZeroDivisionError: division by zero")])
    assert t.due() == []  # the incident is the first one's; the API shows the refinement
    cause = t.root_cause("llm")
    assert cause is not None
    assert (cause.rank, cause.category) == (3, "app-bug")
    assert cause.application


def test_findings_of_no_known_job_and_benign_lines_are_not_kept() -> None:
    clock = ManualClock(T0)
    t = triage(clock)
    t.take("other", "a", [finding(1, 0, "app-bug", T0, root=True)])
    t.take("n0", "a", [finding(2, 0, "nan-loss", T0, severity="info"),
                       finding(3, 0, "app-bug", T0, root=True, job="unknown-job")])
    clock.advance(60)
    assert t.due() == []
    assert t.root_cause("llm") is None


def test_an_episode_keeps_a_bounded_number_of_findings() -> None:
    clock = ManualClock(T0)
    t = triage(clock)
    t.take("n0", "a", [finding(i + 1, 0, "nccl-timeout", T0 + i)
                       for i in range(MAX_FINDINGS + 10)])
    t.take("n0", "a", [finding(MAX_FINDINGS + 20, 1, "segfault", T0 - 1, root=True)])
    clock.advance(30)
    [cause] = t.due()
    assert cause.findings == MAX_FINDINGS + 1
    assert (cause.rank, cause.category) == (1, "segfault")


def test_a_fault_after_a_ranks_own_failure_was_read_did_not_cause_it() -> None:
    """Lines without a time stamp of their own: when they were read bounds the faults."""
    clock = ManualClock(T0)
    t = triage(clock)
    bug = finding(1, 1, "app-bug", T0, root=True, text="KeyError: 'labels'")
    t.take("n0", "a0", [EventRecord(**{**_fields(bug), "line_time_seconds": None})])
    t.take("n1", "a1", [xid(1, 79, T0 + 60)])
    later = [EventRecord(**{**_fields(e), "line_time_seconds": None, "time_seconds": T0 + 90})
             for e in timeouts(5, T0 + 90, (2, 3))["n1"]]
    t.take("n1", "a1", later)
    clock.advance(30)
    [cause] = t.due()
    assert (cause.rank, cause.category) == (1, "app-bug")


def _fields(event: EventRecord) -> dict[str, Any]:
    return {f: getattr(event, f) for f in event.__struct_fields__}


def test_a_removed_job_is_forgotten() -> None:
    clock = ManualClock(T0)
    membership = Membership()
    t = triage(clock, membership)
    t.take("n0", "a", [finding(1, 0, "app-bug", T0, root=True)])
    clock.advance(30)
    assert len(t.due()) == 1
    membership.removed = True
    assert t.due() == []
    assert t.root_cause("llm") is None
    assert t.causes() == []


def test_a_line_time_moves_with_its_event_onto_the_controllers_clock() -> None:
    """An agent whose clock is an hour behind: its event and the line's time move alike."""
    behind = T0 - 3600
    event = finding(1, 0, "app-bug", behind - 5, root=True)  # read 2 s after it was printed
    report = Report(node="n0", instance="a", sequence=1, sample_time_seconds=behind + 1,
                    events=[event])
    [moved] = controller_times(report, T0).events
    assert moved.time_seconds == T0 - 4
    assert moved.line_time_seconds == T0 - 6


def test_a_failure_after_the_job_recovered_is_another_episode() -> None:
    """Within ``quiet`` of the first: without recovered() it would join the first's."""
    clock = ManualClock(T0)
    t = triage(clock)
    t.take("n0", "a0", [finding(1, 1, "app-bug", T0, root=True, text="IndexError: list "
                                "index out of range")])
    clock.advance(30)
    [first] = t.due()
    assert (first.rank, first.category) == (1, "app-bug")
    t.recovered("llm")
    clock.advance(60)
    t.take("n1", "a1", [finding(2, 3, "ecc-error", clock.time(), root=True,
                                text="RuntimeError: CUDA error: uncorrectable ECC error")])
    assert t.cause_so_far("llm") is not None
    assert t.cause_so_far("llm").category == "ecc-error"  # type: ignore[union-attr]
    clock.advance(30)
    [second] = t.due()
    assert (second.rank, second.node, second.category) == (3, "n1", "ecc-error")
    assert t.root_cause("llm") == second


def test_recovered_before_the_failure_is_reported_changes_nothing() -> None:
    clock = ManualClock(T0)
    t = triage(clock)
    t.take("n0", "a0", [finding(1, 1, "app-bug", T0, root=True)])
    t.recovered("llm")  # not reported yet: the episode goes on
    t.take("n1", "a1", [finding(2, 3, "nccl-timeout", T0 + 1)])
    clock.advance(30)
    [cause] = t.due()
    assert (cause.rank, cause.findings) == (1, 2)
