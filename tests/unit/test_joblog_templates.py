"""Template mining per job: masking, clustering, kept parameters, findings, state, bounds."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError, bind, parse_yaml
from sn_monitor.joblog.template_settings import KeptParameter, TemplateSettings
from sn_monitor.joblog.templates import (
    WILDCARD,
    JobTemplates,
    LineMasker,
    TemplateStateError,
    state_size_limit,
)

QUIET = TemplateSettings(warmup_lines=0, warmup_seconds=0)


def word(n: int) -> str:
    """A token of letters only, distinct for each n."""
    letters = string.ascii_lowercase
    out = ""
    while True:
        out += letters[n % 26]
        n //= 26
        if n == 0:
            return out


def distinct_line(i: int) -> str:
    """Lines that share no token with each other: one template each."""
    return f"{word(i)}q {word(i)}r {word(i)}s {word(i)}t"


@pytest.mark.parametrize(("line", "tokens"), [
    ("node-017:12345:12399 [3] NCCL INFO Channel 00/24 : 0 1",
     "node-<NUM>:<NUM>:<NUM> [<NUM>] NCCL INFO Channel <NUM>/<NUM> : <NUM> <NUM>"),
    ("[2024-03-01 12:00:01,123] api: [ERROR] failed (exitcode: -9) local_rank: 0 (pid: 4242)",
     "[<TIME>] api: [ERROR] failed (exitcode: <exitcode=-9>) local_rank: <NUM> (pid: <NUM>)"),
    ("Signal 9 (SIGKILL) received by PID 123",
     "Signal <signal=9> (<signal=SIGKILL>) received by PID <NUM>"),
    ("Attempted loss scale: 2, reducing to 1",
     "Attempted loss scale: <NUM>, reducing to <loss-scale=1>"),
    ("Attempted loss scale: 4096, reducing to 2048",
     "Attempted loss scale: <NUM>, reducing to <NUM>"),
    ("iteration 100/5000 | loss: nan | lr: 1.0e-04",
     "iteration <NUM>/<NUM> | loss: <value=nan> | lr: <NUM>"),
    ("connect to 10.0.0.12:29500 failed errno 111", "connect to <IP> failed errno <errno=111>"),
    ('File "/opt/conda/lib/python3.10/site-packages/torch/run.py", line 806, in main',
     'File "<PATH>", line <NUM>, in main'),
    ("id 123e4567-e89b-12d3-a456-426614174000 at 0x7f3a2c000000 commit 3f2a9c1d7e8b",
     "id <UUID> at <HEX> commit <HEX>"),
    ("Tried to allocate 2.00 GiB; 79.35GiB total; took 12ms; 45% used",
     "Tried to allocate <NUM> GiB; <NUM> total; took <NUM>; <NUM> used"),
    ("NCCL version 2.18.1+cuda12.1", "NCCL version 2.18.1+cuda12.1"),
    ("DataLoader worker (pid 25902) is killed by signal: Segmentation fault",
     "DataLoader worker (pid <NUM>) is killed by signal: <signal=Segmentation_fault>"),
    ("api.py:719] Received 15 death signal, shutting down workers",
     "api.py:<NUM>] Received <signal=15> death signal, shutting down workers"),
    ("loss scaler 0 reducing loss scale to 8.165126103939127e-202",
     "loss scaler <NUM> reducing loss scale to <loss-scale=below-1>"),
    ("Attempted loss scale: 2, but hysteresis is 2. Reducing hysteresis to 1",
     "Attempted loss scale: <NUM>, but hysteresis is <NUM>. Reducing hysteresis to <NUM>"),
    ("{'grad_norm': nan, 'learning_rate': 1.4999999999999999e-05}",
     "{'grad_norm': <value=nan>, 'learning_rate': <NUM>}"),
])
def test_masking_keeps_the_words_and_pins_the_kept_values(line: str, tokens: str) -> None:
    assert " ".join(LineMasker(TemplateSettings()).tokens(line)) == tokens


def test_nccl_info_lines_with_varying_numbers_make_one_template() -> None:
    job = JobTemplates(QUIET, ManualClock())
    for rank in range(8):
        for channel in range(4):
            job.observe(f"gpu-node-{rank // 4:03d}:{4000 + rank}:{4100 + rank} [{rank}] "
                        f"NCCL INFO Channel {channel:02d}/24 : {rank} {(rank + 1) % 8}")
    assert [s.template for s in job.summaries()] == [
        "gpu-node-<NUM>:<NUM>:<NUM> [<NUM>] NCCL INFO Channel <NUM>/<NUM> : <NUM> <NUM>"]
    assert job.summaries()[0].count == 32


def test_progress_lines_make_one_template_and_other_messages_their_own() -> None:
    job = JobTemplates(QUIET, ManualClock())
    for step in range(1, 50):
        job.observe(f" iteration {step * 10:>6}/ 5000 | consumed samples: {step * 640} | "
                    f"lm loss: {2.5 - step / 100:.6E} | loss scale: 65536.0 | "
                    f"grad norm: {1 + step / 7:.3f} | number of skipped iterations: 0")
    job.observe("node-1:4242:4243 [0] NCCL INFO Using network IB")
    job.observe("node-1:4242:4243 [0] NCCL INFO Connected all rings")
    job.observe("saving checkpoint at iteration 500 to /ckpt/run-1")
    summaries = job.summaries()
    assert len(summaries) == 4, [s.template for s in summaries]
    assert summaries[0].count == 49
    assert "<value=" not in summaries[0].template


@pytest.mark.parametrize("lines", [
    ["failed (exitcode: -9) local_rank: 0 (pid: 4242) of binary: /usr/bin/python3",
     "failed (exitcode: 1) local_rank: 0 (pid: 4242) of binary: /usr/bin/python3"],
    ["worker 3 got signal 9 and stopped", "worker 3 got signal 15 and stopped"],
    ["Sending process 1234 closing signal SIGTERM", "Sending process 1234 closing signal SIGKILL"],
    ["Skipping step, attempted loss scale: 2, reducing to 1",
     "Skipping step, attempted loss scale: 4096, reducing to 2048"],
    ["step 10 | lm loss: nan | grad norm: 3.2 | lr: 1e-4",
     "step 10 | lm loss: 2.31 | grad norm: 3.2 | lr: 1e-4"],
    ["DataLoader worker (pid 1817) is killed by signal: Killed.",
     "DataLoader worker (pid 1817) is killed by signal: Bus error."],
    ["Gradient overflow. Skipping step, loss scaler 0 reducing loss scale to 32768.0",
     "Gradient overflow. Skipping step, loss scaler 0 reducing loss scale to 8.1e-202"],
    ["connect() failed: errno 111 to host 10.1.1.1",
     "connect() failed: errno 110 to host 10.1.1.1"],
])
def test_lines_whose_meaning_is_in_a_kept_parameter_are_not_merged(lines: list[str]) -> None:
    job = JobTemplates(QUIET, ManualClock())
    for line in lines:
        job.observe(line)
    templates = [s.template for s in job.summaries()]
    assert len(templates) == 2, templates
    assert all(WILDCARD not in t for t in templates), templates


def test_a_wildcard_does_not_take_a_kept_value() -> None:
    job = JobTemplates(QUIET, ManualClock())
    for word_ in ("alpha", "beta", "SIGKILL"):
        job.observe(f"rank 3 worker stopped by {word_} after the barrier")
    assert [s.template for s in job.summaries()] == [
        "rank <NUM> worker stopped by <*> after the barrier",
        "rank <NUM> worker stopped by <signal=SIGKILL> after the barrier"]


def test_a_value_outside_the_kept_set_is_a_number_like_any_other() -> None:
    job = JobTemplates(QUIET, ManualClock())
    job.observe("Skipping step, attempted loss scale: 8192, reducing to 4096")
    job.observe("Skipping step, attempted loss scale: 4096, reducing to 2048")
    assert [s.count for s in job.summaries()] == [2]


def test_differing_words_past_the_leading_tokens_become_a_wildcard() -> None:
    job = JobTemplates(QUIET, ManualClock())
    job.observe("shard finished on worker alpha cleanly")
    job.observe("shard finished on worker beta cleanly")
    assert [s.template for s in job.summaries()] == ["shard finished on worker <*> cleanly"]
    assert job.template_of("shard finished on worker gamma cleanly") == \
        "shard finished on worker <*> cleanly"


def test_a_new_template_after_the_warm_up_is_a_finding_and_not_before() -> None:
    clock = ManualClock(start=1000.0)
    job = JobTemplates(TemplateSettings(warmup_lines=20, warmup_seconds=60), clock)
    startup = [job.observe(distinct_line(i)) for i in range(30)]
    assert all(findings == () for findings in startup), "30 lines, but only 0 s: still warm-up"
    clock.advance(61)
    assert job.observe(distinct_line(3)) == ()  # seen in the warm-up: not new
    (finding,) = job.observe("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert finding.kind == "new-template"
    assert finding.template == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert (finding.count, finding.first_seen, finding.last_seen) == (1, 1061.0, 1061.0)
    assert job.observe("RuntimeError: CUDA error: an illegal memory access was encountered") == ()


def test_the_warm_up_needs_its_lines_too() -> None:
    clock = ManualClock()
    job = JobTemplates(TemplateSettings(warmup_lines=20, warmup_seconds=60), clock)
    job.observe(distinct_line(0))
    clock.advance(600)
    assert job.observe(distinct_line(1)) == ()  # 600 s, but only one line before it
    for i in range(2, 21):
        job.observe(distinct_line(i))
    assert [f.kind for f in job.observe(distinct_line(99))] == ["new-template"]


def steady_job(clock: ManualClock, settings: TemplateSettings) -> JobTemplates:
    """A job that has printed one progress line every 10 s for 1000 s."""
    job = JobTemplates(settings, clock)
    for step in range(100):
        job.observe(f"step {step} loss {2.0 - step / 1000:.4f}")
        job.observe(f"worker {step % 4} heartbeat ok")
        clock.advance(10)
    return job


BURSTS = TemplateSettings(warmup_lines=10, warmup_seconds=60, burst_window_seconds=60,
                          burst_buckets=12, burst_factor=5, burst_min_count=20)


def test_a_burst_is_one_finding_when_it_starts() -> None:
    clock = ManualClock(start=0.0)
    job = steady_job(clock, BURSTS)
    findings = []
    for i in range(200):
        findings += job.observe(f"NCCL WARN Call to ibv_poll_cq failed on dev {i % 8}")
        clock.advance(0.1)
    kinds = [(f.kind, f.template) for f in findings]
    assert kinds == [("new-template", "NCCL WARN Call to ibv_poll_cq failed on dev <NUM>"),
                     ("template-burst", "NCCL WARN Call to ibv_poll_cq failed on dev <NUM>")]
    burst = findings[1]
    assert burst.window_count == BURSTS.burst_min_count == burst.count
    assert burst.first_seen == 1000.0


def test_a_steady_template_never_bursts_and_a_burst_needs_its_minimum() -> None:
    clock = ManualClock(start=0.0)
    job = steady_job(clock, BURSTS)
    findings = []
    for step in range(100):
        findings += job.observe(f"step {step} loss 1.0")
        clock.advance(10)
    for _ in range(BURSTS.burst_min_count - 1):  # fast, but one short of the minimum
        findings += job.observe("worker 0 heartbeat ok")
    assert findings == []


def test_a_burst_ends_and_a_later_one_is_a_finding_again() -> None:
    clock = ManualClock(start=0.0)
    job = steady_job(clock, BURSTS)
    bursts = []
    for _ in range(2):
        for i in range(60):
            bursts += [f for f in job.observe(f"worker {i % 4} heartbeat ok")
                       if f.kind == "template-burst"]
        clock.advance(600)
        job.observe("worker 0 heartbeat ok")  # a quiet window: the burst is over
    assert len(bursts) == 2


def test_state_round_trip_restores_the_same_job(tmp_path: Path) -> None:
    clock = ManualClock(start=0.0)
    job = steady_job(clock, BURSTS)
    job.observe("Signal 9 (SIGKILL) received by PID 77")
    path = tmp_path / "job-7.json"
    job.save(path)
    restored = JobTemplates.load(path, BURSTS, clock)
    assert restored.to_state() == job.to_state()
    assert json.loads(path.read_text())["version"] == 1
    assert not list(tmp_path.glob(".*.tmp"))
    later = ["Signal 15 (SIGTERM) received by PID 78", "step 5 loss 0.1",
             *[f"worker {i % 4} heartbeat ok" for i in range(25)]]
    assert [restored.observe(line) for line in later] == [job.observe(line) for line in later]
    assert restored.to_state() == job.to_state()


def state_of_a_small_job() -> dict[str, object]:
    job = JobTemplates(QUIET, ManualClock())
    job.observe("shard finished on worker alpha cleanly")
    job.observe("NCCL INFO Using network IB")
    return job.to_state()


def edited(change: str) -> object:
    """The small job's state with one thing made wrong."""
    doc: dict[str, object] = state_of_a_small_job()
    first: dict[str, object] = doc["templates"][0]  # type: ignore[index]
    if change == "py/reduce":
        return {"py/reduce": [{"py/function": "os.system"}, {"py/tuple": ["touch pwned"]}]}
    if change == "jsonpickle template":
        first["py/object"] = "drain3.drain.LogCluster"
    elif change == "version":
        doc["version"] = 2
    elif change == "count":
        first["count"] = -1
    elif change == "tokens":
        first["tokens"] = ["two words"]
    elif change == "route":
        first["route"] = ["somewhere", "else"]
    elif change == "duplicate":
        doc["templates"] = [first, first]
    elif change == "id":
        first["id"] = 99
    elif change == "window":
        first["window"] = [0]
    elif change == "too many":
        doc["templates"] = [first] * (QUIET.max_templates + 1)
    return doc


@pytest.mark.parametrize(("change", "key", "words"), [
    ("py/reduce", "", "unknown key 'py/reduce'"),
    ("jsonpickle template", "templates[0]", "unknown key 'py/object'"),
    ("version", "version", "version 2"),
    ("count", "templates[0].count", "integer >= 1"),
    ("tokens", "templates[0].tokens[0]", "no blanks"),
    ("route", "templates[0].route", "leading tokens"),
    ("duplicate", "templates[1].id", "twice"),
    ("id", "templates[0].id", "next_id"),
    ("window", "templates[0].window", "12 counts"),
    ("too many", "templates", "at most 1000"),
])
def test_a_wrong_state_is_rejected_naming_the_file_and_key(
        tmp_path: Path, change: str, key: str, words: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(edited(change)))
    with pytest.raises(TemplateStateError) as caught:
        JobTemplates.load(path, QUIET)
    assert (caught.value.file, caught.value.key) == (str(path), key)
    assert words in caught.value.message
    assert str(path) in str(caught.value)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(("data", "words"), [
    (b"{not json", "not JSON"),
    (b'{"format": NaN}', "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b'["a list"]', "expected an object"),
    (b" " * (state_size_limit(QUIET) + 1), "larger than"),
])
def test_a_file_that_is_not_a_state_is_rejected(tmp_path: Path, data: bytes, words: str) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(data)
    with pytest.raises(TemplateStateError, match=words):
        JobTemplates.load(path, QUIET)


def test_a_time_that_is_not_finite_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        JobTemplates(QUIET, ManualClock()).observe("a line", at=float("nan"))


def test_a_missing_state_file_is_a_state_error(tmp_path: Path) -> None:
    with pytest.raises(TemplateStateError, match="cannot read"):
        JobTemplates.load(tmp_path / "absent.json")


def test_the_least_recent_template_is_evicted_and_is_new_again() -> None:
    job = JobTemplates(TemplateSettings(max_templates=5, warmup_lines=0, warmup_seconds=0),
                       ManualClock())
    for i in range(20):
        job.observe(distinct_line(i))
        job.observe(distinct_line(0))  # kept recent
    assert len(job.summaries()) == 5
    assert job.summaries()[-1].template == distinct_line(0)
    (finding,) = job.observe(distinct_line(1))
    assert finding.kind == "new-template"
    assert finding.template_id == 21


def test_eviction_prunes_the_tree() -> None:
    job = JobTemplates(TemplateSettings(max_templates=3), ManualClock())
    for i in range(200):
        job.observe(" ".join([word(i) + "x"] * (1 + i % 9)))
    assert len(job.tree) == 3
    assert job.tree.node_count() <= 3 * (1 + job.settings.leading_tokens)


def test_a_node_holds_at_most_max_children() -> None:
    job = JobTemplates(TemplateSettings(max_children=4), ManualClock())
    for i in range(50):
        job.observe(f"{word(i)}z said hello")
    assert max(job.tree.children_counts()) == 4
    assert job.template_of(f"{word(49)}z said hello") == "<*> said hello"


def test_a_line_is_cut_to_its_bounds() -> None:
    settings = TemplateSettings(max_tokens=16, max_line_chars=200)
    masker = LineMasker(settings)
    assert len(masker.tokens("word " * 1000)) == 16
    assert masker.tokens("x" * 10_000) == ["x" * 200]


def test_a_kept_parameter_needs_one_group() -> None:
    with pytest.raises(ValueError, match="exactly one group"):
        KeptParameter("exitcode", r"exit code \d+")
    with pytest.raises(ValueError, match="name"):
        KeptParameter("Exit Code", r"exit code (\d+)")
    with pytest.raises(ValueError, match="hints"):
        KeptParameter("exitcode", r"exit code (\d+)", ["Exit"])


def test_a_kept_parameter_of_ones_own_is_pinned_and_its_hint_gates_it() -> None:
    settings = TemplateSettings(warmup_lines=0, warmup_seconds=0, kept=[
        KeptParameter("health", r"\bhealth (ok|degraded|failed)\b", ["health"])])
    job = JobTemplates(settings, ManualClock())
    for state in ("ok", "ok", "degraded", "failed"):
        job.observe(f"link mlx5_0 port 1 health {state} after 3 checks")
    assert [s.template for s in job.summaries()] == [
        "link mlx5_0 port <NUM> health <health=ok> after <NUM> checks",
        "link mlx5_0 port <NUM> health <health=degraded> after <NUM> checks",
        "link mlx5_0 port <NUM> health <health=failed> after <NUM> checks"]
    masker = LineMasker(settings)
    assert masker.tokens("exitcode: -9") == ["exitcode:", "<NUM>"]  # only its own kept


def test_settings_bind_from_yaml_with_durations_and_kept_parameters() -> None:
    doc = parse_yaml("similarity: 0.7\nwarmup_seconds: 2m\nkept:\n"
                     "  - {name: health, pattern: 'health (ok|bad)', hints: [health]}\n",
                     "templates.yaml")
    settings = bind(TemplateSettings, doc)
    assert (settings.similarity, settings.warmup_seconds) == (0.7, 120.0)
    assert [k.name for k in settings.kept] == ["health"]


@pytest.mark.parametrize(("text", "where"), [
    ("burst_factor: 1\n", "templates.yaml:1: burst_factor: must be above 1"),
    ("max_children: 1\n", "templates.yaml:1: max_children: must be at least 2"),
    ("similarity: 0\n", "templates.yaml:1: similarity: must be a fraction"),
    ("kept:\n  - {name: x, pattern: 'no group'}\n", "templates.yaml:2: kept[0]:"),
])
def test_bad_settings_name_the_key_and_line(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        bind(TemplateSettings, parse_yaml(text, "templates.yaml"))
    assert str(caught.value).startswith(where), str(caught.value)


def test_settings_built_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match="max_templates: must be at least 1"):
        TemplateSettings(max_templates=0)
