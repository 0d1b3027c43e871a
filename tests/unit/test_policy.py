"""The safety policy: limits, dry run, approval, the circuit breaker and the uncordon guard."""

from __future__ import annotations

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError, Duration, bind, parse_yaml
from sn_monitor.controller.actions.policy import (
    BreakerSettings,
    BreakerState,
    ClusterSummary,
    PolicySettings,
    RateLimitSettings,
    SafetyPolicy,
    human_duration,
    parse_share,
)
from sn_monitor.controller.audit import ActionRequest, Refusal

_ids = iter(range(1_000_000))


def req(action: str = "cordon", node: str | None = "node-1", **kw) -> ActionRequest:
    n = next(_ids)
    return ActionRequest(id=f"a{n}", key=f"k{n}", action=action, node=node,  # type: ignore[arg-type]
                         reason="test", **kw)


def cluster(total: int = 100, *out: str) -> ClusterSummary:
    return ClusterSummary(total_nodes=total, unavailable=frozenset(out))


def policy(clock: ManualClock | None = None, **kw) -> SafetyPolicy:
    # generous limits unless a test narrows one
    defaults = {"max_unavailable": "100%", "node_cooldown": Duration(0.0),
                "rate_limit": RateLimitSettings(actions=1000)}
    return SafetyPolicy(PolicySettings(**(defaults | kw)), clock or ManualClock())


@pytest.mark.parametrize(("value", "parsed"), [(3, (3.0, False)), ("10%", (10.0, True)),
                                               (" 12.5% ", (12.5, True)), ("100%", (100.0, True))])
def test_parse_share(value, parsed) -> None:
    assert parse_share(value) == parsed


@pytest.mark.parametrize("value", [0, -1, "0%", "101%", "abc%", "10", True, "nan%"])
def test_parse_share_rejects(value) -> None:
    with pytest.raises(ValueError, match=r"count|percentage"):
        parse_share(value)


def test_settings_load_and_validate() -> None:
    doc = parse_yaml("dry_run: true\nmax_unavailable: 3\nnode_cooldown: 15m\n"
                     "rate_limit: {actions: 5, window: 10m}\napproval: [evict]\n"
                     "breaker: {window: 2m, max_faulted: 25%, hold: 10m}\n", "policy.yaml")
    settings = bind(PolicySettings, doc)
    assert settings.max_unavailable == 3
    assert settings.node_cooldown == 900.0
    assert settings.breaker.max_faulted == "25%"
    assert settings.approval == ["evict"]
    with pytest.raises(ConfigError, match=r"policy.yaml:1: max_unavailable: .*percentage"):
        bind(PolicySettings, parse_yaml("max_unavailable: 150%\n", "policy.yaml"))
    with pytest.raises(ConfigError, match="unknown action 'self_destruct'"):
        bind(PolicySettings, parse_yaml("approval: [self_destruct]\n", "policy.yaml"))
    with pytest.raises(ValueError, match="percentage"):
        SafetyPolicy(PolicySettings(max_unavailable="x%"), ManualClock())


def test_defaults_are_the_safe_side() -> None:
    settings = PolicySettings()
    assert not settings.dry_run
    assert settings.max_unavailable == "10%"
    assert settings.breaker.enabled
    assert settings.node_cooldown > 0


def test_non_disruptive_actions_always_run() -> None:
    p = policy(dry_run=True, approval=["alert"], max_unavailable=1)
    for i in range(5):  # the breaker does not hold them back either
        p.note_fault(f"n{i}", 10)
    assert p.breaker_state().open
    for action in ("alert", "release", "checkpoint", "uncordon"):
        assert p.decide(req(action), cluster(10, "n1", "n2")).verdict == "run"


def test_max_unavailable_count() -> None:
    p = policy(max_unavailable=2)
    assert p.decide(req(node="n3"), cluster(100, "n1")).verdict == "run"
    refused = p.decide(req(node="n3"), cluster(100, "n1", "n2"))
    assert refused.verdict == "refuse"
    assert refused.reason == "max_unavailable: 2 of 100 nodes already out, limit 2 (2)"
    # a node already out counts once: evicting a cordoned node takes nothing more
    assert p.decide(req("evict", node="n2"), cluster(100, "n1", "n2")).verdict == "run"
    # throttle does not take the node out
    assert p.decide(req("throttle", node="n3"), cluster(100, "n1", "n2")).verdict == "run"


def test_max_unavailable_percent_rounds_down_at_least_one() -> None:
    p = policy(max_unavailable="10%")
    assert p.max_unavailable(16) == 1
    assert p.max_unavailable(100) == 10
    assert p.max_unavailable(3) == 1
    out = [f"n{i}" for i in range(10)]
    assert p.decide(req(node="x"), cluster(100, *out[:9])).verdict == "run"
    refused = p.decide(req(node="x"), cluster(100, *out))
    assert refused.verdict == "refuse"
    assert "limit 10 (10%)" in refused.reason


def test_rate_limit_window() -> None:
    clock = ManualClock()
    p = policy(clock, rate_limit=RateLimitSettings(actions=2, window=Duration(600)))
    assert p.admit(req(node="n1"), cluster()).verdict == "run"
    clock.advance(100)
    assert p.admit(req(node="n2"), cluster()).verdict == "run"
    refused = p.admit(req(node="n3"), cluster())
    assert refused.verdict == "refuse"
    assert refused.reason.startswith("rate limit: 2 disruptive actions in the last 10m")
    assert "next slot in 8m20s" in refused.reason
    # a refused (or a non-disruptive) action does not use the budget
    p.admit(req("alert"), cluster())
    clock.advance(500)  # the first slot frees
    assert p.admit(req(node="n3"), cluster()).verdict == "run"
    assert p.admit(req(node="n4"), cluster()).verdict == "refuse"


def test_decide_alone_commits_nothing() -> None:
    p = policy(rate_limit=RateLimitSettings(actions=1))
    for _ in range(3):
        assert p.decide(req(node="n1"), cluster()).verdict == "run"
    p.commit(req(node="n1"))
    assert p.decide(req(node="n2"), cluster()).verdict == "refuse"


def test_node_cooldown() -> None:
    clock = ManualClock()
    p = policy(clock, node_cooldown=Duration(1800))
    assert p.admit(req("cordon", node="n1"), cluster()).verdict == "run"
    clock.advance(60)
    refused = p.admit(req("cordon", node="n1"), cluster())
    assert refused.verdict == "refuse"
    assert refused.reason == "cooldown: cordon ran on n1 1m ago (cooldown 30m)"
    # a drain goes on (cordon then evict), and other nodes are not affected
    assert p.admit(req("evict", node="n1"), cluster()).verdict == "run"
    assert p.admit(req("cordon", node="n2"), cluster()).verdict == "run"
    # per GPU for throttle
    assert p.admit(req("throttle", node="n1", gpu=0), cluster()).verdict == "run"
    assert p.admit(req("throttle", node="n1", gpu=1), cluster()).verdict == "run"
    assert p.admit(req("throttle", node="n1", gpu=0), cluster()).verdict == "refuse"
    clock.advance(1800)
    assert p.admit(req("cordon", node="n1"), cluster()).verdict == "run"


def test_approval() -> None:
    p = policy(approval=["evict"])
    waiting = p.admit(req("evict"), cluster())
    assert waiting.verdict == "await_approval"
    assert p.admit(req("cordon"), cluster()).verdict == "run"
    assert p.admit(req("evict"), cluster(), approved=True).verdict == "run"
    # approval does not lift the limits
    tight = policy(approval=["evict"], max_unavailable=1)
    assert tight.admit(req("evict", node="n2"), cluster(10, "n1"), approved=True).verdict \
        == "refuse"


def test_dry_run_global_and_per_rule() -> None:
    p = policy(dry_run=True)
    d = p.admit(req("evict", rule="fatal-xid"), cluster())
    assert (d.verdict, d.reason) == ("dry_run", "global dry run: would have run")
    p2 = policy(max_unavailable=1)
    d = p2.admit(req("evict", rule="fatal-xid"), cluster(10, "n9"), rule_dry_run=True)
    assert d.verdict == "dry_run"
    assert d.reason.startswith("rule fatal-xid dry run: would have been refused: max_unavail")
    assert p2.admit(req("evict", node="n1"), cluster(10), rule_dry_run=True).verdict == "dry_run"
    # a dry run commits nothing: the real one afterwards is not in cooldown
    p3 = policy(node_cooldown=Duration(600))
    p3.admit(req("cordon", node="n1"), cluster(), rule_dry_run=True)
    assert p3.admit(req("cordon", node="n1"), cluster()).verdict == "run"
    p4 = policy(dry_run=True, approval=["cordon"])
    assert p4.decide(req("cordon"), cluster()).reason == \
        "global dry run: would have waited for approval"


def breaker_policy(clock: ManualClock) -> SafetyPolicy:
    return policy(clock, breaker=BreakerSettings(window=Duration(120), max_faulted="20%",
                                                 min_faulted=3, hold=Duration(600)))


def test_breaker_opens_at_threshold_and_freezes_evictions_not_alerts() -> None:
    clock = ManualClock()
    p = breaker_policy(clock)
    for i in range(3):  # 3 of 16 is under 20% (3.2)
        assert p.note_fault(f"n{i}", 16) is None
        clock.advance(10)
    assert p.note_fault("n1", 16) is None  # the same node again counts once
    assert not p.breaker_state().open
    opened = p.note_fault("n3", 16)
    assert opened is not None
    assert opened.open
    assert opened.reason == "circuit breaker open: 4 of 16 nodes faulted within 2m"
    assert opened.since == clock.time()
    assert p.note_fault("n4", 16) is None  # already open: no second event
    for action in ("cordon", "evict", "failover", "restore"):
        d = p.decide(req(action), cluster(16))
        assert d.verdict == "refuse"
        assert d.reason == "circuit breaker open: 5 of 16 nodes faulted within 2m"
    for action in ("alert", "checkpoint", "throttle"):
        assert p.decide(req(action), cluster(16)).verdict == "run"


def test_breaker_window_forgets_old_faults() -> None:
    clock = ManualClock()
    p = breaker_policy(clock)
    for i in range(10):  # one fault every 50 s: never 4 within 2 minutes
        assert p.note_fault(f"n{i}", 16) is None
        clock.advance(50)
    assert not p.breaker_state().open


def test_breaker_min_faulted_in_small_clusters() -> None:
    clock = ManualClock()
    p = breaker_policy(clock)
    assert p.note_fault("n0", 4) is None  # 1 of 4 is 25% but one node is not a partition
    assert p.note_fault("n1", 4) is None
    assert p.note_fault("n2", 4) is not None


def test_breaker_closes_after_hold_without_new_trips() -> None:
    clock = ManualClock()
    p = breaker_policy(clock)
    for i in range(4):
        p.note_fault(f"n{i}", 16)
    assert p.breaker_state().open
    clock.advance(60)
    p.note_fault("n4", 16)  # 5 within 2m, still over the threshold: the hold starts again
    clock.advance(599)
    state = p.breaker_state()
    assert state.open
    assert state.until == pytest.approx(clock.time() + 1)
    clock.advance(1)
    assert p.breaker_state() == BreakerState(open=False)
    assert p.decide(req("evict"), cluster(16)).verdict == "run"


def test_breaker_restore_and_reset() -> None:
    clock = ManualClock()
    p = breaker_policy(clock)
    for i in range(4):
        p.note_fault(f"n{i}", 16)
    saved = p.breaker_state()
    clock.advance(100)
    fresh = breaker_policy(clock)  # a restarted controller
    fresh.restore_breaker(saved)
    state = fresh.breaker_state()
    assert state.open
    assert state.since == saved.since
    assert state.until == saved.until
    clock.advance(500)
    assert not fresh.breaker_state().open
    p.reset_breaker()
    assert not p.breaker_state().open


def test_the_breaker_closes_once_every_node_it_counted_is_back() -> None:
    clock = ManualClock()
    p = breaker_policy(clock)
    for i in range(4):
        p.note_fault(f"n{i}", 16)
    p.note_fault("n4", 16)  # faulted while open: counted too
    assert p.breaker_state().nodes == ("n0", "n1", "n2", "n3", "n4")
    assert p.note_healthy("n9") is False  # not one it counted
    for i in range(4):
        assert p.note_healthy(f"n{i}") is False
        assert p.breaker_state().open
    assert p.note_healthy("n4") is True  # the last one: the partition healed
    assert p.breaker_state() == BreakerState(open=False)
    assert p.decide(req("evict"), cluster(16)).verdict == "run"
    # the nodes that came back no longer count towards the next trip
    assert p.note_fault("n0", 16) is None
    assert not p.breaker_state().open


def test_a_breaker_opened_by_hand_waits_for_its_hold_or_a_person() -> None:
    clock = ManualClock()
    p = breaker_policy(clock)
    state = p.open_by_hand("switch maintenance (by alice)")
    assert state.open
    assert state.by_hand
    assert state.reason == "circuit breaker opened by hand: switch maintenance (by alice)"
    d = p.decide(req("evict"), cluster(16))
    assert (d.verdict, d.refusal) == ("refuse", Refusal.BREAKER)
    for i in range(5):  # faults and recoveries meanwhile change nothing
        p.note_fault(f"n{i}", 16)
        assert p.note_healthy(f"n{i}") is False
    assert p.breaker_state().reason == state.reason
    saved = p.breaker_state()
    fresh = breaker_policy(clock)
    fresh.restore_breaker(saved)
    assert fresh.breaker_state().by_hand
    p.reset_breaker()
    assert not p.breaker_state().open
    clock.advance(600)
    assert not fresh.breaker_state().open


@pytest.mark.parametrize(("settings", "request_", "out", "refusal"), [
    ({"max_unavailable": 1}, ("cordon", "n2"), ("n1",), Refusal.MAX_UNAVAILABLE),
    ({"rate_limit": RateLimitSettings(actions=1)}, ("evict", "n3"), (), Refusal.RATE_LIMIT),
    ({"node_cooldown": Duration(600)}, ("evict", "n1"), (), Refusal.COOLDOWN),
])
def test_every_refusal_says_which_limit_refused(settings, request_, out, refusal) -> None:
    p = policy(**settings)
    assert p.admit(req("evict", node="n1"), cluster(100)).runs
    decision = p.decide(req(*request_), cluster(100, *out))
    assert (decision.verdict, decision.refusal) == ("refuse", refusal)
    assert p.may_uncordon("n5", cordoned_by_us=False).refusal is Refusal.NOT_OURS


def test_remember_seeds_limits_after_restart() -> None:
    clock = ManualClock()
    p = policy(clock, node_cooldown=Duration(1800),
               rate_limit=RateLimitSettings(actions=2, window=Duration(600)))
    now = clock.time()
    p.remember([(req("cordon", node="n1"), now - 60), (req("evict", node="n2"), now - 700)])
    assert p.decide(req("cordon", node="n1"), cluster()).verdict == "refuse"  # cooldown
    assert p.admit(req("cordon", node="n3"), cluster()).verdict == "run"
    assert p.decide(req("cordon", node="n4"), cluster()).reason.startswith("rate limit")


def test_uncordon_guard() -> None:
    p = policy()
    assert p.may_uncordon("n1", cordoned_by_us=True).verdict == "run"
    refused = p.may_uncordon("n1", cordoned_by_us=False)
    assert refused.verdict == "refuse"
    assert "did not cordon n1" in refused.reason


def test_human_duration() -> None:
    assert [human_duration(s) for s in (0.5, 30, 120, 5400, 3661)] == \
        ["0.5s", "30s", "2m", "1h30m", "1h1m1s"]


def test_human_duration_rounds_what_a_clock_measured() -> None:
    assert [human_duration(s) for s in (0.0268811, 3.14159, 12.3456, 59.96)] == \
        ["0.03s", "3.14s", "12.3s", "60s"]
