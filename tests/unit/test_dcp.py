"""DCP checkpoints without torch: real torch fixtures, our writer, and hostile .metadata."""

from __future__ import annotations

import os
import pickle
import pickletools
import shutil
from pathlib import Path

import pytest

from sn_monitor import dcp
from sn_monitor.dcp import (
    METADATA_FILE,
    DcpError,
    Entry,
    dumps_metadata,
    is_complete,
    loads_metadata,
    read_metadata,
    write_checkpoint,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcp"
REAL = FIXTURES / "torch-2.13"


def test_reads_a_checkpoint_saved_by_torch():
    meta = read_metadata(REAL)
    assert meta.version == "1.0.0"
    assert meta.entries == {
        "model.linear.weight": Entry("tensor", (4, 4), "torch.float32"),
        "model.linear.bias": Entry("tensor", (4,), "torch.bfloat16"),
        "model.embedding": Entry("tensor", (2, 3), "torch.int64"),
        "step": Entry("bytes"),
        "rng": Entry("bytes"),
    }
    assert {item.fqn for item in meta.items} == set(meta.entries)
    assert meta.files == {"__0_0.distcp": (REAL / "__0_0.distcp").stat().st_size}


def test_the_torch_checkpoint_is_complete():
    verdict = is_complete(REAL)
    assert verdict.complete
    assert verdict.reason == ".metadata and 1 data file(s) with 7381 bytes"


def test_a_truncated_data_file_is_incomplete():
    verdict = is_complete(FIXTURES / "torch-2.13-truncated")
    assert not verdict
    assert verdict.reason == "data file __0_0.distcp is 7281 bytes, .metadata needs at least 7381"


def test_no_metadata_is_incomplete():
    verdict = is_complete(FIXTURES / "torch-2.13-no-metadata")
    assert not verdict.complete
    assert verdict.reason.startswith("no .metadata")


def test_a_missing_data_file_is_incomplete(tmp_path):
    copy = shutil.copytree(REAL, tmp_path / "ckpt")
    (copy / "__0_0.distcp").unlink()
    assert is_complete(copy).reason == "data file __0_0.distcp is missing"


def test_not_a_directory(tmp_path):
    assert is_complete(tmp_path / "nope").reason == "no such directory"
    (tmp_path / "file").write_text("x")
    assert is_complete(tmp_path / "file").reason == "not a directory"


def test_marker_mode_looks_only_at_the_marker(tmp_path):
    ckpt = tmp_path / "step_5"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    assert is_complete(ckpt, marker="COMPLETE") == dcp.Completeness(False, "no COMPLETE marker yet")
    (ckpt / "COMPLETE").write_text("")
    assert is_complete(ckpt, marker="COMPLETE") == dcp.Completeness(True, "marker COMPLETE present")


def test_write_checkpoint_round_trip(tmp_path):
    blobs = {"step": b"123", "rng": bytes(range(256)), "empty": b""}
    path = write_checkpoint(tmp_path, 123, blobs)
    assert path == tmp_path / "step_000000123"
    assert sorted(p.name for p in path.iterdir()) == [METADATA_FILE, "__0_0.distcp"]
    meta = read_metadata(path)
    assert meta.entries == {name: Entry("bytes") for name in blobs}
    data = (path / "__0_0.distcp").read_bytes()
    assert {item.fqn: data[item.offset:item.offset + item.length]
            for item in meta.items} == blobs
    assert is_complete(path).complete


def test_written_metadata_names_the_real_torch_classes(tmp_path):
    path = write_checkpoint(tmp_path, 1, {"a": b"x"}, name="ckpt")
    names = {str(arg) for op, arg, _ in pickletools.genops((path / METADATA_FILE).read_bytes())
             if op.name == "GLOBAL"}
    assert names == {
        "torch.distributed.checkpoint.metadata Metadata",
        "torch.distributed.checkpoint.metadata MetadataIndex",
        "torch.distributed.checkpoint.metadata BytesStorageMetadata",
        "torch.distributed.checkpoint.metadata StorageMeta",
        "torch.distributed.checkpoint.filesystem _StorageInfo",
    }


def test_a_crash_before_the_metadata_leaves_an_incomplete_checkpoint(tmp_path, monkeypatch):
    def crash(src, dst):
        raise OSError("killed")

    monkeypatch.setattr(dcp.os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        write_checkpoint(tmp_path, 7, {"a": b"x" * 100})
    path = tmp_path / "step_000000007"
    assert (path / "__0_0.distcp").stat().st_size == 100
    assert not (path / METADATA_FILE).exists()
    assert not is_complete(path).complete


def test_rewriting_a_checkpoint_drops_the_old_metadata_first(tmp_path, monkeypatch):
    path = write_checkpoint(tmp_path, 1, {"a": b"old"})
    monkeypatch.setattr(dcp.os, "replace", lambda src, dst: None)  # dies before the rename
    write_checkpoint(tmp_path, 1, {"a": b"new, longer"})
    assert not is_complete(path).complete


def test_big_integers_and_strings_encode(tmp_path):
    items = {"w": ("__0_0.distcp", 5 << 40, 300), "ü": ("__0_0.distcp", 0, 70000)}
    meta = loads_metadata(dumps_metadata(items))
    assert {(i.fqn, i.offset, i.length) for i in meta.items} == {
        ("w", 5 << 40, 300), ("ü", 0, 70000)}


class _Evil:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_a_malicious_metadata_is_refused_without_running_code(tmp_path):
    witness = tmp_path / "pwned"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / METADATA_FILE).write_bytes(pickle.dumps(_Evil(f"touch {witness}")))
    with pytest.raises(DcpError) as caught:
        read_metadata(ckpt)
    assert str(caught.value) == (
        f".metadata: refusing to load {os.system.__module__}.system: a DCP .metadata names "
        "only the torch.distributed.checkpoint metadata classes")
    verdict = is_complete(ckpt)
    assert not verdict.complete
    assert "refusing to load" in verdict.reason
    assert not witness.exists()


@pytest.mark.parametrize(
    "payload",
    [
        b"cbuiltins\neval\n(S'1+1'\ntR.",
        b"\x80\x02cbuiltins\ngetattr\n.",
        b"\x80\x02ctorch\nload\n.",
        b"\x80\x02ctorch.distributed.checkpoint.metadata\nos\n.",
        b"\x80\x02csubprocess\nPopen\n.",
    ],
)
def test_other_globals_are_refused(payload):
    with pytest.raises(DcpError, match="refusing to load"):
        loads_metadata(payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"not a pickle", "not a readable pickle"),
        (pickle.dumps({"storage_data": {}})[:-5], "not a readable pickle"),
        (pickle.dumps({"storage_data": {}}), "not a DCP Metadata object (got dict)"),
        (dumps_metadata({"a": ("../../etc/passwd", 0, 10)}),
         "storage entry of 'a' points outside the checkpoint: '../../etc/passwd'"),
        (dumps_metadata({"a": ("/etc/passwd", 0, 10)}), "points outside the checkpoint"),
        (dumps_metadata({"a": ("__0_0.distcp", -1, 10)}), "has a bad offset or length"),
    ],
)
def test_bad_metadata_is_a_clear_error(payload, message):
    with pytest.raises(DcpError, match=message.replace("(", r"\(").replace(")", r"\)")):
        loads_metadata(payload)


def test_fields_a_newer_torch_adds_are_tolerated():
    encoder = dcp._Encoder()
    meta = dcp._Global("torch.distributed.checkpoint.metadata", "Metadata",
                       {"state_dict_metadata": {}, "storage_data": {}, "shiny_new": [1]})
    assert loads_metadata(encoder.finish(meta)).items == ()


def test_an_oversized_metadata_is_not_read(tmp_path, monkeypatch):
    path = write_checkpoint(tmp_path, 1, {"a": b"x"})
    monkeypatch.setattr(dcp, "MAX_METADATA_BYTES", 10)
    with pytest.raises(DcpError, match="more than the 10 read"):
        read_metadata(path)
