"""sn_monitor.client against a real HTTP server on 127.0.0.1 that implements the job API."""

from __future__ import annotations

import json
import logging
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sn_monitor.client import MAX_UPDATES_PER_POST, JobClient, RestorePoint
from tests.drivers.servers import wait_until
from tests.support.client import JOB, PREFIX, FakeController
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------- the fake controller


@pytest.fixture
def controller() -> Iterator[FakeController]:
    fake = FakeController()
    yield fake
    fake.stop()


class FakeClock:
    """Monotonic seconds that move only when a test moves them.

    ``reads`` counts the calls: the client's thread reads the clock first thing in each
    flush pass (and after a failed request, to back off), so three more reads mean at
    least one whole pass began and ended in between (see :func:`wait_for_a_flush_pass`).
    """

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def wait_for_a_flush_pass(clock: FakeClock) -> None:
    """Return once the client's thread ran a whole flush pass after this call began:
    whatever it would send now has been sent (the calls before this one are done)."""
    seen = clock.reads
    assert wait_until(lambda: clock.reads >= seen + 3), "the client's thread stopped"


def make_client(url: str, **kwargs: Any) -> JobClient:
    kwargs.setdefault("flush_interval", 0.01)
    kwargs.setdefault("timeout", 2.0)
    return JobClient(url, JOB, 3, 16, "node-a", **kwargs)


# ---------------------------------------------------------------------------- progress


def test_progress_is_batched_with_latest_steps_and_step_time(controller: FakeController):
    clock = FakeClock()
    client = make_client(controller.url, flush_interval=0.2, clock=clock)
    for step in range(100):
        clock.now = 1000.0 + step * 0.25
        client.progress(step)
    client.close()

    bodies = controller.progress_bodies()
    assert 1 <= len(bodies) <= 3
    last = bodies[-1]
    assert last["rank"] == 3
    assert last["node"] == "node-a"
    assert last["world_size"] == 16
    steps = [u["step"] for u in last["updates"]]
    assert steps[-1] == 99
    assert len(steps) <= MAX_UPDATES_PER_POST
    assert steps == list(range(100 - len(steps), 100))
    assert all(isinstance(u["time"], float) and u["time"] > 1e9 for u in last["updates"])
    assert last["step_time_seconds"] == pytest.approx(0.25)


def test_first_post_has_no_step_time_and_updates_are_not_resent(controller: FakeController):
    clock = FakeClock()
    client = make_client(controller.url, clock=clock)
    client.progress(7)
    assert wait_until(lambda: controller.progress_bodies())
    client.progress(8)
    assert wait_until(lambda: len(controller.progress_bodies()) >= 2)
    wait_for_a_flush_pass(clock)  # one more pass with nothing new: no more posts
    client.close()
    bodies = controller.progress_bodies()
    assert [[u["step"] for u in b["updates"]] for b in bodies] == [[7], [8]]
    assert bodies[0]["step_time_seconds"] is None


def test_going_back_a_step_restarts_the_step_time_estimate(controller: FakeController):
    clock = FakeClock()
    client = make_client(controller.url, flush_interval=60, clock=clock)
    for step, now in [(10, 0.0), (11, 5.0), (12, 10.0), (3, 11.0), (4, 12.0), (5, 13.0)]:
        clock.now = now
        client.progress(step)
    client.close()
    assert controller.progress_bodies()[-1]["step_time_seconds"] == pytest.approx(1.0)


def test_close_sends_what_is_queued_and_is_idempotent(controller: FakeController):
    client = make_client(controller.url, flush_interval=3600)
    client.progress(1)
    client.checkpoint_saved(1, Path("/ckpt/step_000001"))
    client.close()
    client.close()
    assert controller.latest_step() == 1
    assert controller.checkpoint_bodies() == [
        {"rank": 3, "node": "node-a", "step": 1, "path": "/ckpt/step_000001"}]
    client.progress(2)  # after close: ignored, no error
    assert controller.latest_step() == 1


def test_progress_does_no_io_against_a_controller_that_never_answers():
    # A listening socket that never accepts: a connection attempt is queued and hangs.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    client = make_client(url, timeout=60.0)
    try:
        client.progress(0)
        # The background thread is now stuck in a request (the connection is pending) ...
        readable, _, _ = select.select([listener], [], [], 10)
        assert readable, "the background thread never tried to reach the controller"
        # ... and the training loop's calls still return at once.
        for step in range(1, 10_000):
            client.progress(step)
        client.checkpoint_saved(9_999, "/ckpt/step_009999")
        assert client.should_checkpoint() is False
        assert client.last_reply is None
    finally:
        listener.close()  # resets the queued connection: the hung request fails
        client.close()


def test_all_io_happens_on_the_background_thread(controller: FakeController):
    release = threading.Event()
    callers: list[str] = []

    class BlockingSession(requests.Session):
        def request(self, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
            callers.append(threading.current_thread().name)
            release.wait(10)
            return super().request(*args, **kwargs)

    client = make_client(controller.url, session=BlockingSession())
    client.progress(1)
    assert wait_until(lambda: callers)
    for step in range(2, 1000):  # returns although the sender is blocked
        client.progress(step)
    client.checkpoint_saved(999, "/ckpt/x")
    release.set()
    client.close()
    assert set(callers) == {"sn-monitor-client"}
    assert threading.current_thread().name not in callers
    assert controller.latest_step() == 999


def test_concurrent_progress_from_many_threads(controller: FakeController):
    client = make_client(controller.url)
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(2000):
                client.progress(offset + i)
        except BaseException as err:  # noqa: BLE001 - collected for the assert
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k * 10_000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    assert errors == []
    assert all(len(b["updates"]) <= MAX_UPDATES_PER_POST for b in controller.progress_bodies())


# ---------------------------------------------------------------------- outages


def client_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sn_monitor.client" and r.levelno == level]


def test_controller_down_never_raises_logs_once_and_backs_off(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="sn_monitor.client")
    calls: list[str] = []

    class CountingSession(requests.Session):
        def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            calls.append(url)
            return super().request(method, url, *args, **kwargs)

    clock = FakeClock()
    client = make_client(f"http://127.0.0.1:{free_port()}", clock=clock,
                         session=CountingSession())
    try:
        assert client.restore_point() is None  # refused: no exception, backoff starts
        assert client._failover.delay == pytest.approx(client.flush_interval)
        for step in range(50):
            client.progress(step)
            client.should_checkpoint()
        client.checkpoint_saved(49, "/ckpt/step_000049")
        # The clock stands still, so that backoff never ends: no request at all.
        wait_for_a_flush_pass(clock)
        assert len(calls) == 1
        clock.now += 1000
        assert wait_until(
            lambda: client._failover.delay == pytest.approx(2 * client.flush_interval))
        wait_for_a_flush_pass(clock)
        assert len(calls) == 2  # one try, then backing off again, twice as long
        clock.now += 1000
        assert wait_until(
            lambda: client._failover.delay == pytest.approx(4 * client.flush_interval))
        assert len(calls) == 3
    finally:
        client.close()

    warnings = client_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "unreachable" in warnings[0].getMessage()
    assert client.failures_total >= 3


def test_outage_then_recovery_delivers_latest_progress_and_every_checkpoint(
        controller: FakeController, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="sn_monitor.client")
    controller.fail_status = 503
    client = make_client(controller.url, max_backoff=0.05)
    for step in range(1, 201):
        client.progress(step)
        if step % 10 == 0:
            client.checkpoint_saved(step, f"/ckpt/step_{step:06d}")
    assert wait_until(lambda: len(controller.requests) >= 3)  # retried while down
    assert controller.checkpoint_bodies()[0]["step"] == 10  # always the oldest first
    controller.fail_status = None
    assert wait_until(lambda: controller.latest_step() == 200)
    client.close()

    # Every checkpoint report arrives (20 of them, in order), none is dropped for space.
    delivered = controller.checkpoint_bodies()[-20:]
    assert [b["step"] for b in delivered] == list(range(10, 201, 10))
    ok_progress = controller.progress_bodies()[-1]
    assert ok_progress["updates"][-1]["step"] == 200
    assert len(ok_progress["updates"]) == MAX_UPDATES_PER_POST
    assert len(client_records(caplog, logging.WARNING)) == 1
    infos = [r.getMessage() for r in client_records(caplog, logging.INFO)]
    assert any("reachable again" in m for m in infos)
    assert client._failover.delay == 0.0


def test_refused_checkpoint_report_is_dropped_with_an_error(
        controller: FakeController, caplog: pytest.LogCaptureFixture):
    controller.checkpoint_status = 400
    clock = FakeClock()
    client = make_client(controller.url, max_backoff=0.01, clock=clock)
    client.checkpoint_saved(5, "/ckpt/step_000005")
    client.checkpoint_saved(10, "/ckpt/step_000010")
    assert wait_until(lambda: len(controller.checkpoint_bodies()) >= 2)
    clock.now += 1000  # past any backoff: a retry would go out in the next pass
    wait_for_a_flush_pass(clock)
    client.close()
    assert [b["step"] for b in controller.checkpoint_bodies()] == [5, 10]  # no retries
    errors = [r.getMessage() for r in client_records(caplog, logging.ERROR)]
    assert any("refused the checkpoint report of step 5" in m for m in errors)


# ---------------------------------------------------------------- checkpoint requests


def test_should_checkpoint_is_true_once_per_checkpoint_id(controller: FakeController):
    reply: dict[str, Any] = {"checkpoint_requested": False, "checkpoint_id": None,
                             "restore": None}
    controller.progress_reply = lambda body: dict(reply)
    client = make_client(controller.url)

    def step(n: int) -> None:
        """Report step n and wait until the reply to it has been applied."""
        client.progress(n)
        assert wait_until(lambda: controller.latest_step() == n)
        client.progress(n + 1000)  # the next POST is only sent after that reply is applied
        assert wait_until(lambda: controller.latest_step() == n + 1000)

    step(1)
    assert client.should_checkpoint() is False
    reply.update(checkpoint_requested=True, checkpoint_id="ckpt-1")
    step(2)
    assert client.should_checkpoint() is True
    assert client.should_checkpoint() is False  # reading clears it
    step(3)  # the controller keeps asking with the same id until it sees the checkpoint
    assert client.should_checkpoint() is False
    reply.update(checkpoint_id="ckpt-2")  # a new request (e.g. a node is degrading)
    step(4)
    assert client.last_reply is not None
    assert client.last_reply.checkpoint_id == "ckpt-2"
    assert client.should_checkpoint() is True
    assert client.should_checkpoint() is False
    # Without an id: once per run of replies that ask.
    reply.update(checkpoint_requested=False, checkpoint_id=None)
    step(5)
    assert client.should_checkpoint() is False
    reply.update(checkpoint_requested=True)
    step(5)
    assert client.should_checkpoint() is True
    step(6)
    assert client.should_checkpoint() is False
    reply.update(checkpoint_requested=False)
    step(7)
    reply.update(checkpoint_requested=True)
    step(8)
    assert client.should_checkpoint() is True
    client.close()


def test_restore_in_progress_reply_is_parsed(controller: FakeController):
    controller.progress_reply = {
        "checkpoint_requested": False, "checkpoint_id": None,
        "restore": {"step": 300, "path": "/ckpt/step_000300", "nodes": ["a", "b"],
                    "generation": 4}}
    client = make_client(controller.url)
    client.progress(1)
    assert wait_until(lambda: client.last_reply is not None)
    client.close()
    assert client.last_reply is not None
    assert client.last_reply.restore == RestorePoint(300, "/ckpt/step_000300", 4, ("a", "b"))


# ------------------------------------------------------------------------ restore point


def test_restore_point_is_parsed(controller: FakeController):
    controller.restore = (200, {"step": 120, "path": "/ckpt/job/step_000120",
                                "generation": 2})
    client = make_client(controller.url)
    point = client.restore_point()
    client.close()
    assert point == RestorePoint(step=120, path="/ckpt/job/step_000120", generation=2)
    (get,) = controller.recorded("/restore-point", "GET")
    assert get.path == PREFIX + "/restore-point"


@pytest.mark.parametrize("reply", [
    (404, {"error": "no restore point"}),
    (204, b""),
    (200, None),
    (200, b"not json"),
    (200, {"step": "ten", "path": "/x", "generation": 1}),
    (200, {"step": -1, "path": "/x", "generation": 1}),
    (200, {"step": 3, "generation": 1}),
    (200, {"step": 3, "path": 7, "generation": 1}),
    (200, [1, 2]),
    (500, {"error": "boom"}),
    (401, {"error": "bad token"}),
])
def test_restore_point_is_none_when_there_is_none_or_it_is_unusable(
        controller: FakeController, reply: tuple[int, Any]):
    controller.restore = reply
    client = make_client(controller.url)
    assert client.restore_point() is None
    client.close()


def test_restore_point_with_an_empty_path_means_from_scratch(controller: FakeController):
    controller.restore = (200, {"step": 0, "path": "", "generation": 3})
    client = make_client(controller.url)
    assert client.restore_point() == RestorePoint(0, "", 3)
    client.close()


def test_restore_point_is_none_when_unreachable():
    client = make_client(f"http://127.0.0.1:{free_port()}")
    assert client.restore_point() is None
    client.close()


# ------------------------------------------------------------------------------ token


def test_bearer_token_is_sent_and_never_shown(
        controller: FakeController, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    controller.token = "s3cret-token"
    controller.restore = (200, {"step": 1, "path": "/c/step_000001", "generation": 0})
    client = make_client(controller.url, token="s3cret-token")
    assert client.restore_point() is not None
    client.progress(1)
    client.checkpoint_saved(1, "/c/step_000001")
    client.close()
    assert controller.requests
    assert {r.headers["Authorization"] for r in controller.requests} == {
        "Bearer s3cret-token"}
    assert "s3cret" not in repr(client)

    controller.token = "another"  # now refused: the error line does not echo the token
    bad = make_client(controller.url, token="s3cret-token")
    bad.progress(1)
    bad.close()
    assert "s3cret" not in caplog.text
    assert any("401" in r.getMessage() for r in caplog.records)


def test_no_token_no_authorization_header(controller: FakeController):
    client = make_client(controller.url)
    client.progress(1)
    client.close()
    assert "Authorization" not in controller.requests[0].headers


# --------------------------------------------------------------------------- from_env


def test_from_env_torchrun(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text("tok-123\n")
    client = JobClient.from_env({
        "SN_CONTROLLER_URL": "http://ctl:9848/", "SN_JOB": "llm", "SN_NODE": "gpu-017",
        "SN_TOKEN_FILE": str(token_file), "RANK": "9", "WORLD_SIZE": "16",
        "LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
        "SN_FLUSH_INTERVAL": "0.5",
    })
    assert (client.url, client.job, client.node) == ("http://ctl:9848", "llm", "gpu-017")
    assert (client.rank, client.world_size, client.local_rank) == (9, 16, 1)
    assert client._token == "tok-123"
    assert client.flush_interval == 0.5
    client.close()


def test_from_env_slurm_and_defaults():
    client = JobClient.from_env({
        "SN_CONTROLLER_URL": "http://ctl:9848", "SN_JOB": "llm",
        "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "5",
    })
    assert (client.rank, client.world_size, client.local_rank) == (5, 8, 5)
    assert client.node == socket.gethostname()
    assert client._token is None
    assert client.flush_interval == 1.0
    client.close()

    single = JobClient.from_env({"SN_CONTROLLER_URL": "http://ctl", "SN_JOB": "j"},
                                flush_interval=0.3)
    assert (single.rank, single.world_size, single.local_rank) == (0, 1, 0)
    assert single.flush_interval == 0.3


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SN_CONTROLLER_URL", "http://ctl:1")
    monkeypatch.setenv("SN_JOB", "from-os")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    client = JobClient.from_env()
    assert (client.job, client.rank, client.world_size) == ("from-os", 2, 4)


@pytest.mark.parametrize(("env", "message"), [
    ({"SN_JOB": "j"}, "SN_CONTROLLER_URL"),
    ({"SN_CONTROLLER_URL": "http://c"}, "SN_JOB"),
    ({"SN_CONTROLLER_URL": "http://c", "SN_JOB": "j", "RANK": "x"}, "RANK"),
    ({"SN_CONTROLLER_URL": "http://c", "SN_JOB": "j", "RANK": "4", "WORLD_SIZE": "4"},
     "world size"),
    ({"SN_CONTROLLER_URL": "http://c", "SN_JOB": "j", "SN_FLUSH_INTERVAL": "soon"},
     "SN_FLUSH_INTERVAL"),
    ({"SN_CONTROLLER_URL": "http://c", "SN_JOB": "j", "SN_TOKEN_FILE": "/nonexistent/t"},
     "/nonexistent/t"),
])
def test_from_env_errors_name_the_problem(env: dict[str, str], message: str):
    with pytest.raises(ValueError, match=message):
        JobClient.from_env(env)


def test_bad_token_file_error_does_not_show_the_token(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text("two words-secret\n")
    with pytest.raises(ValueError, match="one word") as info:
        JobClient.from_env({"SN_CONTROLLER_URL": "http://c", "SN_JOB": "j",
                            "SN_TOKEN_FILE": str(token_file)})
    assert "secret" not in str(info.value)


# ---------------------------------------------------------------------- import cost


def test_importing_the_client_pulls_in_nothing_else_from_sn_monitor():
    code = ("import sys, sn_monitor.client; "
            "print(sorted(m for m in sys.modules if m.startswith('sn_monitor')"
            " or m.split('.')[0] in ('pynvml', 'prometheus_client', 'msgspec', 'yaml',"
            " 'starlette')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=60)
    assert json.loads(out.stdout.replace("'", '"')) == ["sn_monitor", "sn_monitor.client"]


# ------------------------------------------------------------ a pair of controllers


def test_a_dead_first_controller_costs_one_request_not_a_backoff(
        controller: FakeController) -> None:
    clock = FakeClock()  # frozen: a backoff would hold every request back
    dead = f"http://127.0.0.1:{free_port()}"
    client = make_client(f"{dead}, {controller.url}/", clock=clock)
    assert client.urls == [dead, controller.url]
    assert client.restore_point() is None  # asked the dead one, then the live one
    assert controller.recorded("/restore-point", "GET")
    client.progress(1)
    assert wait_until(lambda: controller.progress_bodies())
    assert client.url == controller.url  # and it stays there
    client.progress(2)
    assert wait_until(lambda: len(controller.progress_bodies()) >= 2)
    client.close()


def test_a_standby_answer_moves_to_the_other_controller_at_once(
        controller: FakeController) -> None:
    standby = FakeController(fail_status=503)
    clock = FakeClock()
    try:
        client = make_client(f"{standby.url},{controller.url}", clock=clock)
        client.checkpoint_saved(40, "/ckpt/step_40")
        client.progress(41)
        assert wait_until(lambda: controller.checkpoint_bodies() and controller.progress_bodies())
        assert len(standby.requests) == 1  # one refused request, then the active only
        assert controller.checkpoint_bodies()[0]["step"] == 40
        client.close()
    finally:
        standby.stop()


def test_when_every_controller_fails_the_client_backs_off(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    first, second = FakeController(fail_status=503), FakeController(fail_status=502)
    clock = FakeClock()
    try:
        client = make_client(f"{first.url},{second.url}", clock=clock)
        client.progress(1)
        assert wait_until(lambda: len(first.requests) + len(second.requests) >= 2)
        wait_for_a_flush_pass(clock)  # frozen clock, so all backing off
        assert len(first.requests) + len(second.requests) == 2
        clock.now += 60  # past any backoff: one more round
        assert wait_until(lambda: len(first.requests) + len(second.requests) >= 3)
        client.close()
    finally:
        first.stop()
        second.stop()
    warnings = [r.getMessage() for r in client_records(caplog, logging.WARNING)]
    assert any(first.url in w and second.url in w for w in warnings), warnings
