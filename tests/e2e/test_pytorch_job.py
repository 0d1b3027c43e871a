"""A real PyTorch job brought back by sn-monitor: torchrun, gloo, DCP, a dead node, a spare.

Every process is real: ``sn-monitor controller``, an ``sn-monitor agent --simulate 8``
per node, and per node of the job a ``torchrun`` agent with one rank of
``examples/pytorch/train.py`` (DDP on gloo, ``torch.distributed.checkpoint``), started and
restarted by ``examples/pytorch/launcher.py``, the job's ``spec.control`` command.

The job runs on sim-0..sim-3 with sim-4 as its spare, and saves when the controller
asks (``checkpointInterval: 2s``). Generation 0's second save writes its data but stalls
before ``.metadata``; then sim-2 takes a fatal XID and dies (its torchrun agent, rank and
sn-monitor agent SIGKILLed). sn-monitor evicts it, takes the spare, and the launcher's
warm restore brings in the spare's pre-warmed standby and starts again the survivors,
which the stalled save keeps from leaving the broken generation; the ranks load the
latest complete checkpoint (never the newer incomplete one) and train to the end. The
final weights are compared, byte for byte, with an uninterrupted run of the same job.

The second test kills a node of a job with no stalled save: the three survivors leave
the broken generation and join the next in their own processes, with the standby, and
the job still ends with the same bytes.

``make e2e`` runs it (torch: ``pip install -e '.[examples]'``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.dcp import is_complete, read_metadata
from tests.e2e.torch_job import CONFIG, LAUNCHER, ROUTES, TRAIN, TorchJob
from tests.integration.cluster import Cluster
from tests.support.torch_env import torch_available

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not torch_available(), reason="torch is not installed")]

STEPS = 200
#: Every save is the controller's request (``checkpointInterval``), none the script's own.
NEVER = 10**9
INTERVAL = "2s"
#: Generation 0's second save writes its data but never its .metadata.
STALLED_SAVE = 2
STEP_TIME = 0.05
FAILED = "sim-2"
#: Bounded waits, generous for a loaded two-core machine (each rank imports torch).
START_WAIT = 180.0
WAIT = 180.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, nodes=5, config=CONFIG, routes=ROUTES)
    jobs: list[TorchJob] = []
    c.torch_jobs = jobs  # type: ignore[attr-defined]
    try:
        c.start(timeout=90)
        yield c
    finally:
        for job in jobs:
            job.close()
        c.close()


def reference_run(root: Path) -> Path:
    """The same job, never interrupted: one torchrun with four ranks, no controller."""
    root.mkdir(parents=True)
    weights = root / "reference.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SN_")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "4", str(TRAIN), "--steps", str(STEPS),
         "--checkpoint-every", "20", "--checkpoint-dir", str(root / "ckpt"),
         "--final-weights", str(weights)],
        capture_output=True, text=True, timeout=WAIT, check=False, env=env, cwd=root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return weights


def test_a_dead_node_of_a_torchrun_job_is_replaced_and_training_ends_bit_identical(
        cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    job = TorchJob(c, "torch", ["sim-0", "sim-1", "sim-2", "sim-3"], ["sim-4"],
                   steps=STEPS, checkpoint_every=NEVER, step_time=STEP_TIME,
                   checkpoint_interval=INTERVAL,
                   first_generation_args=f"--stall-save {STALLED_SAVE}")
    c.torch_jobs.append(job)  # type: ignore[attr-defined]
    job.post()
    job.start()
    job.wait_checkpoint(1, START_WAIT)
    marker = c.wait_for(lambda: next(job.ckpt.glob("stalled-step_*"), None), WAIT,
                        f"generation 0's save {STALLED_SAVE} stalled before its .metadata")
    stalled = job.ckpt / marker.name.removeprefix("stalled-")
    assert list(stalled.glob("*.distcp")), "the stalled save wrote no data"
    assert not is_complete(stalled)
    # generation 0 can save nothing more (the next save waits for the stalled one)
    complete = sorted(int(p.name[5:]) for p in job.ckpt.glob("step_*") if is_complete(p))
    assert complete, "no complete checkpoint before the stalled one"
    assert max(complete) < int(stalled.name[5:])
    # every save was the controller's: on its schedule, through the progress replies
    saves = [m for m in job.timeline() if m["event"] == "checkpoint"]
    assert [m["step"] for m in saves] == complete
    assert {m["why"] for m in saves} == {"requested"}

    # sim-2: a fatal XID, then the node is gone (ranks, torchrun agent, sn-monitor agent)
    c.agents[FAILED].fault("xid", 0, code=48)
    c.wait_for(lambda: [i for i in c.incidents(node=FAILED) if i["rule"] == "fatal-xid"],
               WAIT, f"a fatal-xid incident for {FAILED}")
    job.kill_node(FAILED)

    rec = job.wait_recovery("done", WAIT)
    assert rec["failed_nodes"] == [FAILED]
    assert rec["replacement_nodes"] == ["sim-4"]
    assert rec["nodes"] == ["sim-0", "sim-1", "sim-4", "sim-3"]
    assert rec["generation"] == 1
    # the latest complete checkpoint, never the newer incomplete one
    point = rec["checkpoint"]
    assert point is not None
    assert point["path"] != str(stalled)
    assert point["step"] == max(complete), (point, complete)
    assert is_complete(point["path"])
    # a real DCP checkpoint: every rank wrote a share, rank 0 the .metadata
    meta = read_metadata(point["path"])
    assert {item.relative_path for item in meta.items} == {f"__{r}_0.distcp" for r in range(4)}
    assert any(name.startswith("model.") for name in meta.entries)
    assert any(name.startswith("optim.") for name in meta.entries)

    # the launcher restarted torchrun once, on the new node list, with that checkpoint
    restores = [x for x in job.state()["calls"] if x["action"] == "restore"]
    assert len([x for x in restores if not x["duplicate"]]) == 1, restores
    assert restores[0]["params"]["nodes"] == rec["nodes"]
    assert restores[0]["params"]["checkpoint"] == point
    assert [a["node"] for a in job.state()["agents"]] == rec["nodes"]
    # warm: the spare's standby joined; every survivor still had the stalled save in
    # flight (rank 0 writes it, the others wait for its end), so none could leave the
    # broken generation cleanly: each was started again
    assert restores[0]["standbys_used"] == ["sim-4"]
    assert restores[0]["kept"] == []
    assert restores[0]["cold"] == ["sim-0", "sim-1", "sim-3"]

    loaded = job.wait_mark("loaded", 1, WAIT)
    assert loaded["step"] == point["step"]
    assert loaded["path"] == point["path"]
    job.wait_mark("done", 1, WAIT)
    assert job.marks(1)["done"]["step"] == STEPS
    c.wait_for(lambda: job.weights.exists(), 30, "the final weights")

    # the launcher said what it did (the action's record keeps it), and a repeated
    # restore (the controller retrying one action id) is a no-op
    (action,) = [a for a in c.actions() if a["action"] == "restore"]
    assert action["state"] == "succeeded", action
    assert "torchrun on 4 nodes" in action["outcome"], action
    agents = job.state()["agents"]
    again = subprocess.run(
        [*LAUNCHER, "--state", str(job.state_path)], capture_output=True, text=True,
        timeout=60, check=True, env={**os.environ, "SN_ACTION": "restore",
                                     "SN_ACTION_ID": restores[0]["action_id"],
                                     "SN_PARAMS": json.dumps(restores[0]["params"])})
    assert "already done" in again.stdout
    assert job.state()["agents"] == agents
    assert job.state()["calls"][-1]["duplicate"]

    assert_same_bytes(job.weights, reference_run(tmp_path / "reference"))

def assert_same_bytes(weights: Path, reference: Path) -> None:
    import torch

    expected = torch.load(reference, weights_only=True)
    resumed = torch.load(weights, weights_only=True)
    assert list(resumed) == list(expected)
    for name, tensor in expected.items():
        assert resumed[name].dtype == tensor.dtype == torch.float32
        assert torch.equal(resumed[name].view(torch.int32), tensor.view(torch.int32)), name


def test_the_survivors_of_a_warm_restore_rejoin_in_their_processes_bit_identical(
        cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    job = TorchJob(c, "warm", ["sim-0", "sim-1", "sim-2", "sim-3"], ["sim-4"],
                   steps=STEPS, checkpoint_every=20, step_time=STEP_TIME)
    c.torch_jobs.append(job)  # type: ignore[attr-defined]
    job.post()
    job.start()
    job.wait_checkpoint(20, START_WAIT)
    before = {a["node"]: a["pid"] for a in job.state()["agents"]}
    standby = job.state()["standbys"]["sim-4"]["pid"]

    c.agents[FAILED].fault("xid", 0, code=48)
    c.wait_for(lambda: [i for i in c.incidents(node=FAILED) if i["rule"] == "fatal-xid"],
               WAIT, f"a fatal-xid incident for {FAILED}")
    job.kill_node(FAILED)
    rec = job.wait_recovery("done", WAIT)
    assert rec["nodes"] == ["sim-0", "sim-1", "sim-4", "sim-3"]

    (restore,) = [x for x in job.state()["calls"] if x["action"] == "restore"]
    assert restore["kept"] == ["sim-0", "sim-1", "sim-3"], restore
    assert restore["standbys_used"] == ["sim-4"]
    assert restore["cold"] == []
    # the same processes: the survivors' torchrun agents and the standby, none started anew
    after = {a["node"]: a["pid"] for a in job.state()["agents"]}
    assert after == {**{n: before[n] for n in ("sim-0", "sim-1", "sim-3")}, "sim-4": standby}
    (action,) = [a for a in c.actions() if a["action"] == "restore"]
    assert "warm: 3 ranks kept, 1 standbys joined, 0 started again" in action["outcome"]

    loaded = job.wait_mark("loaded", 1, WAIT)
    assert loaded["step"] == rec["checkpoint"]["step"]
    job.wait_mark("done", 1, WAIT)
    assert job.marks(1)["done"]["step"] == STEPS
    c.wait_for(lambda: job.weights.exists(), 30, "the final weights")
    assert_same_bytes(job.weights, reference_run(tmp_path / "reference"))
