"""The example training loop (sn_monitor/sim/train.py) as a real process against a local fake
controller (tests/unit/test_client.py).

Progress and checkpoint reports arrive, a controller's checkpoint request is honoured once,
a crash leaves only complete checkpoints behind, a restart resumes where the controller
says (and ends bit-for-bit where an uninterrupted run ends), a hang stops progress.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.dcp import is_complete
from tests.drivers.servers import wait_until
from tests.support.client import JOB, FakeController

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DATA_FILE = "__0_0.distcp"


@pytest.fixture
def controller() -> Iterator[FakeController]:
    fake = FakeController()
    yield fake
    fake.stop()


def job_env(controller: FakeController) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("SLURM_")}
    env.update(SN_CONTROLLER_URL=controller.url, SN_JOB=JOB, SN_NODE="node-7",
               SN_FLUSH_INTERVAL="0.02", PYTHONPATH=str(ROOT))
    return env


def train_args(ckpt: Path, *args: object) -> list[str]:
    return [sys.executable, "-m", "sn_monitor.sim.train", "--checkpoint-dir", str(ckpt),
            "--step-time", "0.005", "--width", "8", *map(str, args)]


def train(controller: FakeController, ckpt: Path,
          *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(train_args(ckpt, *args), env=job_env(controller), cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def checkpoints(ckpt: Path) -> dict[int, Path]:
    """Every step_* directory under ``ckpt`` (complete or not), by step."""
    return {int(d.name.removeprefix("step_")): d
            for d in ckpt.iterdir() if d.name.startswith("step_")} if ckpt.is_dir() else {}


def assert_complete(path: Path) -> None:
    complete = is_complete(path)
    assert complete, f"{path}: {complete.reason}"
    assert (path / ".metadata").is_file()


def progress_steps(controller: FakeController) -> list[int]:
    return [u["step"] for b in controller.progress_bodies() for u in b["updates"]]


def test_reports_progress_and_checkpoints(controller: FakeController, tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    result = train(controller, ckpt, "--steps", 20, "--checkpoint-every", 5)
    assert result.returncode == 0, result.stderr
    assert "done at step 20" in result.stdout

    saved = checkpoints(ckpt)
    assert sorted(saved) == [5, 10, 15, 20]
    for path in saved.values():
        assert_complete(path)
    assert all(path.name.startswith("step_0000") for path in saved.values())

    assert controller.latest_step() == 20
    steps = progress_steps(controller)
    assert steps == sorted(steps)
    last = controller.progress_bodies()[-1]
    assert (last["rank"], last["world_size"], last["node"]) == (0, 1, "node-7")
    assert last["step_time_seconds"] > 0
    bodies = controller.checkpoint_bodies()
    assert [{k: v for k, v in b.items() if k != "save_seconds"} for b in bodies] == [
        {"rank": 0, "node": "node-7", "step": s, "path": str(saved[s])} for s in (5, 10, 15, 20)]
    assert all(0 <= b["save_seconds"] < 60 for b in bodies)  # how long training stood still
    assert controller.recorded("/restore-point", "GET")  # asked once at start-up


def test_checkpoint_requested_by_the_controller_is_saved_once(
        controller: FakeController, tmp_path: Path):
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        asked = max(u["step"] for u in body["updates"]) >= 10
        return {"checkpoint_requested": asked, "checkpoint_id": "pre-1" if asked else None,
                "restore": None}

    controller.progress_reply = reply
    ckpt = tmp_path / "ckpt"
    result = train(controller, ckpt, "--steps", 80, "--checkpoint-every", 1000,
                   "--step-time", 0.01)
    assert result.returncode == 0, result.stderr
    saved = checkpoints(ckpt)
    assert len(saved) == 1, saved  # the controller kept asking with one id: one checkpoint
    (step,) = saved
    assert 10 < step < 80
    assert_complete(saved[step])
    assert "requested by the controller" in result.stdout
    assert [b["step"] for b in controller.checkpoint_bodies()] == [step]


def test_crash_then_resume_from_the_restore_point(controller: FakeController, tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    crashed = train(controller, ckpt, "--steps", 20, "--checkpoint-every", 5, "--crash-at", 13)
    assert crashed.returncode != 0
    assert "simulated node failure at step 13" in crashed.stderr
    saved = checkpoints(ckpt)
    assert sorted(saved) == [5, 10]  # only complete checkpoints are left behind
    for path in saved.values():
        assert_complete(path)
    assert max(progress_steps(controller)) <= 12

    # The controller restores the job from its latest complete checkpoint.
    controller.requests.clear()
    controller.restore = (200, {"step": 10, "path": str(saved[10]), "generation": 1})
    resumed = train(controller, ckpt, "--steps", 20, "--checkpoint-every", 5)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from step 10" in resumed.stdout
    steps = progress_steps(controller)
    assert steps[0] == 11
    assert steps[-1] == 20
    assert [b["step"] for b in controller.checkpoint_bodies()] == [15, 20]

    # ... and ends exactly where a run that never failed ends.
    controller.restore = (404, {"error": "none"})
    straight = train(controller, tmp_path / "straight", "--steps", 20, "--checkpoint-every", 5)
    assert straight.returncode == 0, straight.stderr
    assert "starting from step 0" in straight.stdout
    assert (checkpoints(ckpt)[20] / DATA_FILE).read_bytes() == (
        checkpoints(tmp_path / "straight")[20] / DATA_FILE).read_bytes()


def test_the_controllers_restore_point_wins_over_the_latest_local_one(
        controller: FakeController, tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    first = train(controller, ckpt, "--steps", 10, "--checkpoint-every", 5)
    assert first.returncode == 0, first.stderr
    # Without a restore point from the controller the latest local checkpoint is used ...
    local = train(controller, ckpt, "--steps", 12, "--checkpoint-every", 5)
    assert "resuming from step 10" in local.stdout
    # ... but the controller may know better (step 10 was incomplete on another rank).
    controller.requests.clear()
    controller.restore = (200, {"step": 5, "path": str(checkpoints(ckpt)[5]),
                                "generation": 2})
    chosen = train(controller, ckpt, "--steps", 6, "--checkpoint-every", 5)
    assert chosen.returncode == 0, chosen.stderr
    assert "resuming from step 5" in chosen.stdout
    assert progress_steps(controller) == [6]
    # An empty path is the controller saying "from scratch", local checkpoints or not.
    controller.requests.clear()
    controller.restore = (200, {"step": 0, "path": "", "generation": 3})
    scratch = train(controller, ckpt, "--steps", 2, "--checkpoint-every", 5)
    assert scratch.returncode == 0, scratch.stderr
    assert "starting from step 0" in scratch.stdout
    assert progress_steps(controller)[0] == 1


def test_an_incomplete_restore_point_is_refused(controller: FakeController, tmp_path: Path):
    partial = tmp_path / "ckpt" / "step_000000005"
    partial.mkdir(parents=True)
    (partial / DATA_FILE).write_bytes(b"{}")  # no .metadata: never finished
    controller.restore = (200, {"step": 5, "path": str(partial), "generation": 1})
    result = train(controller, tmp_path / "ckpt", "--steps", 10)
    assert result.returncode == 3
    assert "not a complete checkpoint" in result.stderr
    assert controller.progress_bodies() == []


def _said(proc: subprocess.Popen[str], said: list[str], needle: str) -> bool:
    """Whether ``proc`` has written ``needle`` on its stderr (read as it comes, into
    ``said``, without waiting for more)."""
    assert proc.stderr is not None
    if select.select([proc.stderr], [], [], 0)[0]:
        said.append(os.read(proc.stderr.fileno(), 65536).decode(errors="replace"))
    return needle in "".join(said)


def test_hang_stops_progress_but_keeps_running(controller: FakeController, tmp_path: Path):
    proc = subprocess.Popen(train_args(tmp_path / "ckpt", "--steps", 1000, "--hang-at", 6),
                            env=job_env(controller), cwd=ROOT, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    said: list[str] = []
    try:
        assert wait_until(lambda: controller.latest_step() == 5, timeout=20)
        # at the start of step 6, before reporting it: hung from then on, still running
        assert wait_until(lambda: _said(proc, said, "simulated hang at step 6"), timeout=20)
        assert proc.poll() is None
        assert max(progress_steps(controller)) == 5
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert "simulated hang at step 6" in "".join(said) + err
