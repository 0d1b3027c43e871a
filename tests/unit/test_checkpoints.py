"""The checkpoint registry: only complete checkpoints count, newest first."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.jobs import checkpoints
from sn_monitor.controller.jobs.checkpoints import CheckpointRegistry, parse_step
from sn_monitor.dcp import METADATA_FILE, write_checkpoint

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "dcp" / "torch-2.13"


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("step_000123", 123), ("step-123", 123), ("step123", 123), ("checkpoint-500", 500),
        ("checkpoint_7", 7), ("global_step1000", 1000), ("global_step_1000", 1000),
        ("iter_0001000", 1000), ("ckpt-42", 42), ("STEP_9", 9), ("step_0", 0),
        ("step_000123.tmp", None), ("step_", None), ("latest", None), ("best-123x", None),
        ("123", None), ("my-step-5", None), (".step_5", None),
    ],
)
def test_step_parsing(name, step):
    assert parse_step(name) == step


@pytest.fixture
def clock():
    return ManualClock()


def _registry(tmp_path, clock, **kwargs):
    return CheckpointRegistry("job-a", tmp_path, clock=clock, **kwargs)


def test_a_half_written_newer_checkpoint_is_skipped(tmp_path, clock):
    write_checkpoint(tmp_path, 100, {"a": b"x" * 10})
    newer = write_checkpoint(tmp_path, 200, {"a": b"y" * 10})
    (newer / METADATA_FILE).unlink()  # the writer is still at it
    registry = _registry(tmp_path, clock)
    found = registry.scan()
    assert [(c.step, c.complete) for c in found] == [(100, True), (200, False)]
    assert found[1].reason.startswith("no .metadata")
    latest = registry.latest_complete()
    assert latest is not None
    assert latest.step == 100
    assert latest.source == "scanned"
    assert latest.size_bytes > 10


def test_a_truncated_torch_checkpoint_is_skipped(tmp_path, clock):
    shutil.copytree(REAL, tmp_path / "step_000010")
    broken = shutil.copytree(REAL, tmp_path / "step_000020")
    data = broken / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:-1])
    registry = _registry(tmp_path, clock)
    registry.scan()
    assert registry.latest_complete().step == 10


def test_the_newer_checkpoint_counts_once_finished(tmp_path, clock):
    write_checkpoint(tmp_path, 1, {"a": b"x"})
    registry = _registry(tmp_path, clock)
    (tmp_path / "step_2").mkdir()
    registry.scan()
    assert registry.latest_complete().step == 1
    write_checkpoint(tmp_path, 2, {"a": b"x"}, name="step_2")
    registry.scan()
    assert registry.latest_complete().step == 2


def test_marker_mode(tmp_path, clock):
    for step in (5, 6):
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(b"w" * 64)
    (tmp_path / "checkpoint-5" / "COMPLETE").write_text("")
    registry = _registry(tmp_path, clock, marker="COMPLETE")
    found = registry.scan()
    assert [(c.step, c.complete, c.reason) for c in found] == [
        (5, True, "marker COMPLETE present"), (6, False, "no COMPLETE marker yet")]
    assert registry.latest_complete().step == 5


def test_reported_but_incomplete_is_refused(tmp_path, clock):
    registry = _registry(tmp_path, clock)
    good = write_checkpoint(tmp_path, 10, {"a": b"x"})
    assert registry.report(10, good).complete
    half = write_checkpoint(tmp_path, 20, {"a": b"x"})
    (half / METADATA_FILE).unlink()
    refused = registry.report(20, half)
    assert not refused.complete
    assert refused.source == "reported"
    assert registry.latest_complete().step == 10


def test_a_report_the_client_marks_unfinished_does_not_count(tmp_path, clock):
    registry = _registry(tmp_path, clock)
    path = write_checkpoint(tmp_path, 3, {"a": b"x"})
    record = registry.report(3, path, complete_hint=False)
    assert not record.complete
    assert registry.latest_complete() is None


def test_relative_reports_are_inside_the_checkpoint_dir(tmp_path, clock):
    write_checkpoint(tmp_path, 4, {"a": b"x"}, name="step-4")
    registry = _registry(tmp_path, clock)
    record = registry.report(4, "step-4")
    assert record.path == tmp_path / "step-4"
    assert record.complete
    registry.scan()  # the scan finds the same one: still one record, still "reported"
    assert [(c.step, c.source) for c in registry.checkpoints()] == [(4, "reported")]


def test_reports_outside_the_directory_and_without_one(tmp_path, clock):
    elsewhere = write_checkpoint(tmp_path / "other", 8, {"a": b"x"})
    registry = CheckpointRegistry("job-a", None, clock=clock)
    assert registry.scan() == []
    registry.report(8, elsewhere)
    registry.scan()
    assert registry.latest_complete().path == elsewhere


def test_deleted_checkpoints_are_forgotten(tmp_path, clock):
    write_checkpoint(tmp_path, 1, {"a": b"x"})
    newest = write_checkpoint(tmp_path, 2, {"a": b"x"})
    registry = _registry(tmp_path, clock)
    registry.scan()
    shutil.rmtree(newest)
    assert registry.latest_complete(verify=True).step == 1
    registry.scan()
    assert [c.step for c in registry.checkpoints()] == [1]


def test_age_is_measured_from_when_it_was_written(tmp_path, clock):
    registry = _registry(tmp_path, clock)
    assert registry.age_seconds() is None
    path = write_checkpoint(tmp_path, 1, {"a": b"x"})
    os.utime(path / METADATA_FILE, (clock.time() - 30, clock.time() - 30))
    registry.scan()
    clock.advance(60)
    assert registry.age_seconds() == pytest.approx(90)


def test_memory_is_bounded_but_the_latest_complete_stays(tmp_path, clock):
    registry = _registry(tmp_path, clock, keep=3)
    write_checkpoint(tmp_path, 1, {"a": b"x"})
    for step in range(2, 10):
        (tmp_path / f"step_{step}").mkdir()  # all newer ones still being written
    registry.scan()
    steps = [c.step for c in registry.checkpoints()]
    assert len(steps) == 3
    assert steps == [9, 8, 1]
    assert registry.latest_complete().step == 1


def test_an_unreadable_directory_is_reported(tmp_path, clock):
    registry = _registry(tmp_path / "missing", clock)
    assert registry.scan() == []
    assert registry.last_scan_error is not None
    assert "cannot list" in registry.last_scan_error


def test_files_and_other_names_are_ignored(tmp_path, clock):
    (tmp_path / "step_5").write_text("a file, not a checkpoint")
    (tmp_path / "latest").mkdir()
    write_checkpoint(tmp_path, 6, {"a": b"x"})
    assert [c.step for c in _registry(tmp_path, clock).scan()] == [6]


def test_a_scan_checks_only_the_newest_keep(tmp_path, clock, monkeypatch):
    for step in range(1, 21):
        write_checkpoint(tmp_path, step, {"a": b"x"}, fsync=False)
    registry = _registry(tmp_path, clock, keep=5)
    checked = []
    real = checkpoints.is_complete

    def counting(path, marker=None):
        checked.append(Path(path).name)
        return real(path, marker)

    monkeypatch.setattr(checkpoints, "is_complete", counting)
    assert [c.step for c in registry.scan()] == [16, 17, 18, 19, 20]
    assert len(checked) == 5
    checked.clear()
    registry.scan()  # finished checkpoints are not read again
    assert checked == []
