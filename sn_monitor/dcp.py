"""PyTorch Distributed Checkpoint (DCP) directories, read and written without torch.

What ``torch.distributed.checkpoint.save`` leaves on a file system (FileSystemWriter)::

    step_000123/
      __0_0.distcp      data files, written first (one or more per rank)
      __1_0.distcp
      .metadata         a pickle of torch.distributed.checkpoint.metadata.Metadata,
                        written last (to .metadata.tmp, then renamed)

``Metadata.storage_data`` maps each stored item (a ``MetadataIndex``) to a
``torch.distributed.checkpoint.filesystem._StorageInfo(relative_path, offset, length)``:
where its bytes are. A checkpoint is complete when ``.metadata`` is there and every
byte range it names exists; a writer that died half-way leaves no ``.metadata`` (or
short data files), so such a directory is never taken for a checkpoint to restore.

``.metadata`` is a pickle, and unpickling runs code. :func:`read_metadata` therefore
uses a restricted unpickler: the only globals it resolves are the handful of DCP
classes, torch constants (dtypes, layouts, memory formats, ``torch.Size``) and plain
containers, each mapped to an inert stand-in defined here; anything else (``os.system``,
``builtins.eval``, any other class) is refused. torch is never imported.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, ClassVar, Literal

from sn_monitor.errors import SnMonitorError

METADATA_FILE = ".metadata"
#: A .metadata bigger than this is refused unread (a huge model's is tens of MB).
MAX_METADATA_BYTES = 512 << 20
#: The DCP format version torch writes today (Metadata.version).
DCP_VERSION = "1.0.0"

_DCP = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"
_SHARD = "torch.distributed._shard.sharded_tensor.metadata"  # torch <= 2.1


class DcpError(SnMonitorError):
    """A .metadata file that cannot be read, or that is not what DCP writes."""


# --- what we read: the parts of the metadata sn-monitor needs -----------------------------


@dataclass(frozen=True)
class StoredItem:
    """One stored piece of the state dict: ``length`` bytes at ``offset`` in a data file."""

    fqn: str
    relative_path: str
    offset: int
    length: int


@dataclass(frozen=True)
class Entry:
    """One state-dict entry: a tensor (with its global shape and dtype) or bytes."""

    kind: Literal["tensor", "bytes"]
    shape: tuple[int, ...] | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class DcpMetadata:
    version: str | None
    entries: Mapping[str, Entry]
    items: tuple[StoredItem, ...]

    @property
    def files(self) -> dict[str, int]:
        """Each referenced data file and the size it must have at least."""
        need: dict[str, int] = {}
        for item in self.items:
            need[item.relative_path] = max(need.get(item.relative_path, 0),
                                           item.offset + item.length)
        return need

    @property
    def data_bytes(self) -> int:
        return sum(item.length for item in self.items)


@dataclass(frozen=True)
class Completeness:
    complete: bool
    reason: str

    def __bool__(self) -> bool:
        return self.complete


# --- the restricted unpickler and its stand-ins -------------------------------------------


class _Record:
    """Stand-in for a DCP dataclass: takes the state pickle gives it and nothing else."""

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._positional(args)
        for name, value in kwargs.items():
            self._set(name, value)

    def _positional(self, values: tuple[Any, ...]) -> None:
        if len(values) > len(self.fields):
            raise DcpError(f"{type(self).__name__} takes at most {len(self.fields)} fields")
        for name, value in zip(self.fields, values, strict=False):
            self.__dict__[name] = value

    def _set(self, name: Any, value: Any) -> None:
        # Fields a newer torch adds are kept as plain data; names are never dunders.
        if not isinstance(name, str) or name.startswith("__"):
            raise DcpError(f"unexpected field {name!r} in {type(self).__name__}")
        self.__dict__[name] = value

    def __setstate__(self, state: Any) -> None:
        slots: Any = None
        if (isinstance(state, tuple) and len(state) == 2
                and isinstance(state[1], dict) and (state[0] is None
                                                    or isinstance(state[0], dict))):
            state, slots = state
        if isinstance(state, dict):
            for name, value in state.items():
                self._set(name, value)
        elif isinstance(state, tuple):  # TensorProperties pickles a tuple of its fields
            self._positional(state)
        elif state is not None:
            raise DcpError(f"unexpected state for {type(self).__name__}")
        for name, value in (slots or {}).items():
            self._set(name, value)

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__.get(name, default)


class _Metadata(_Record):
    fields = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version")


class _MetadataIndex(_Record):
    fields = ("fqn", "offset", "index")


class _StorageInfo(_Record):
    fields = ("relative_path", "offset", "length", "transform_descriptors")


class _BytesStorageMetadata(_Record):
    fields = ()


class _TensorStorageMetadata(_Record):
    fields = ("properties", "size", "chunks")


class _ChunkStorageMetadata(_Record):
    fields = ("offsets", "sizes")


class _TensorProperties(_Record):
    fields = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")


class _StorageMeta(_Record):
    fields = ("checkpoint_id", "save_id", "load_id", "modules")


class _Size(tuple[int, ...]):
    """Stand-in for torch.Size."""


@dataclass(frozen=True)
class _TorchConstant:
    """Stand-in for a torch dtype, layout or memory format: just its name."""

    name: str

    def __str__(self) -> str:
        return self.name


def _get_layout(name: object) -> _TorchConstant:
    return _TorchConstant(str(name))


def _memory_format(value: object) -> _TorchConstant:
    return _TorchConstant(f"memory_format:{value}")


_DTYPES = (
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "half", "float", "double", "short", "int", "long", "cfloat", "cdouble", "chalf",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
)
_LAYOUTS = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc",
            "_mkldnn", "jagged")
_MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")

_ALLOWED: dict[tuple[str, str], Any] = {
    (_DCP, "Metadata"): _Metadata,
    (_DCP, "MetadataIndex"): _MetadataIndex,
    (_DCP, "BytesStorageMetadata"): _BytesStorageMetadata,
    (_DCP, "TensorStorageMetadata"): _TensorStorageMetadata,
    (_DCP, "ChunkStorageMetadata"): _ChunkStorageMetadata,
    (_DCP, "TensorProperties"): _TensorProperties,
    (_DCP, "StorageMeta"): _StorageMeta,
    (_DCP, "_MEM_FORMAT_ENCODING"): _memory_format,
    (_SHARD, "TensorProperties"): _TensorProperties,
    (_SHARD, "MEM_FORMAT_ENCODING"): _memory_format,
    (_FS, "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): _Size,
    ("torch.serialization", "_get_layout"): _get_layout,
    ("pathlib", "PosixPath"): PurePosixPath,
    ("pathlib", "PurePosixPath"): PurePosixPath,
    ("pathlib", "WindowsPath"): PureWindowsPath,
    ("pathlib", "PureWindowsPath"): PureWindowsPath,
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    **{("torch", name): _TorchConstant(f"torch.{name}")
       for name in (*_DTYPES, *_LAYOUTS, *_MEMORY_FORMATS)},
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise DcpError(
                f"refusing to load {module}.{name}: a DCP .metadata names only the "
                f"torch.distributed.checkpoint metadata classes") from None

    def persistent_load(self, pid: Any) -> Any:
        raise DcpError("refusing a persistent id: DCP .metadata has none")


def loads_metadata(data: bytes) -> DcpMetadata:
    """Decode the bytes of a .metadata file (raises DcpError)."""
    try:
        root = _RestrictedUnpickler(io.BytesIO(data)).load()
    except DcpError:
        raise
    except (pickle.UnpicklingError, EOFError) as err:
        raise DcpError(f"not a readable pickle: {err or 'truncated'}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError,
            struct.error, MemoryError, RecursionError) as err:
        raise DcpError(f"not a DCP metadata pickle: {err}") from None
    if not isinstance(root, _Metadata):
        raise DcpError(f"not a DCP Metadata object (got {type(root).__name__})")
    return _digest(root)


def _digest(root: _Metadata) -> DcpMetadata:
    """What the unpickled Metadata says, checked: its entries and where each item is stored."""
    entries = {fqn: _entry(fqn, value)
               for fqn, value in (root.get("state_dict_metadata") or {}).items()}
    storage = root.get("storage_data")
    if not isinstance(storage, dict):
        raise DcpError("storage_data is missing (not written by a FileSystemWriter?)")
    items = tuple(_stored_item(index, info) for index, info in storage.items())
    version = root.get("version")
    return DcpMetadata(version=version if isinstance(version, str) else None,
                       entries=entries, items=items)


def _entry(fqn: object, value: object) -> Entry:
    """One ``state_dict_metadata`` entry: a tensor (its size and dtype) or bytes."""
    if not isinstance(fqn, str):
        raise DcpError(f"state_dict_metadata key {fqn!r} is not a string")
    if isinstance(value, _TensorStorageMetadata):
        props = value.get("properties")
        dtype = props.get("dtype") if isinstance(props, _TensorProperties) else None
        size = value.get("size")
        return Entry("tensor", tuple(int(n) for n in size) if size is not None else None,
                     str(dtype) if dtype is not None else None)
    if isinstance(value, _BytesStorageMetadata):
        return Entry("bytes")
    raise DcpError(f"state_dict_metadata[{fqn!r}] is not tensor or bytes metadata")


def _stored_item(index: object, info: object) -> StoredItem:
    """One ``storage_data`` entry: a file inside the checkpoint, an offset and a length."""
    if not isinstance(index, _MetadataIndex) or not isinstance(info, _StorageInfo):
        raise DcpError("storage_data must map MetadataIndex to _StorageInfo")
    fqn = index.get("fqn")
    rel, offset, length = (info.get("relative_path"), info.get("offset"),
                           info.get("length"))
    if not isinstance(rel, str) or not _inside(rel):
        raise DcpError(f"storage entry of {fqn!r} points outside the checkpoint: {rel!r}")
    if (not isinstance(offset, int) or not isinstance(length, int) or offset < 0
            or length < 0 or isinstance(offset, bool) or isinstance(length, bool)):
        raise DcpError(f"storage entry of {fqn!r} has a bad offset or length")
    return StoredItem(str(fqn), rel, offset, length)


def _inside(relative_path: str) -> bool:
    path = PurePosixPath(relative_path)
    return (bool(relative_path) and not path.is_absolute() and ".." not in path.parts
            and "\\" not in relative_path and "\0" not in relative_path)


def read_metadata(directory: str | Path) -> DcpMetadata:
    """Read ``directory/.metadata`` with the restricted unpickler (raises DcpError)."""
    path = Path(directory) / METADATA_FILE
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_METADATA_BYTES:
                raise DcpError(f"{METADATA_FILE} is {size} bytes, more than the "
                               f"{MAX_METADATA_BYTES} read")
            data = handle.read()
    except FileNotFoundError:
        raise DcpError(f"no {METADATA_FILE}") from None
    except OSError as err:
        raise DcpError(f"cannot read {METADATA_FILE}: {err.strerror or err}") from None
    try:
        return loads_metadata(data)
    except DcpError as err:
        raise DcpError(f"{METADATA_FILE}: {err}") from None


def is_complete(directory: str | Path, marker: str | None = None) -> Completeness:
    """Whether ``directory`` holds a finished checkpoint, and why (not).

    With ``marker`` (a file name such as ``COMPLETE``) the marker file decides; without,
    the DCP layout does: ``.metadata`` readable, every file it references present and
    at least ``offset + length`` bytes long.
    """
    root = Path(directory)
    if not root.is_dir():
        return Completeness(False, "no such directory" if not root.exists()
                            else "not a directory")
    if marker is not None:
        if (root / marker).is_file():
            return Completeness(True, f"marker {marker} present")
        return Completeness(False, f"no {marker} marker yet")
    if not (root / METADATA_FILE).exists():
        return Completeness(False, f"no {METADATA_FILE} (still being written, "
                                   "or not a PyTorch distributed checkpoint)")
    try:
        meta = read_metadata(root)
    except DcpError as err:
        return Completeness(False, str(err))
    for rel, need in sorted(meta.files.items()):
        try:
            have = (root / rel).stat().st_size
        except FileNotFoundError:
            return Completeness(False, f"data file {rel} is missing")
        except OSError as err:
            return Completeness(False, f"cannot stat data file {rel}: {err.strerror or err}")
        if have < need:
            return Completeness(False, f"data file {rel} is {have} bytes, "
                                       f"{METADATA_FILE} needs at least {need}")
    return Completeness(True, f"{METADATA_FILE} and {len(meta.files)} data file(s) "
                              f"with {meta.data_bytes} bytes")


# --- writing: the same layout, the same order, pickles naming the real torch classes ---------


@dataclass(eq=False)  # identity hash: instances are dict keys (MetadataIndex)
class _Global:
    """An object to pickle as ``module.name`` + NEWOBJ + BUILD(state)."""

    module: str
    name: str
    state: dict[str, Any] = field(default_factory=dict)


class _Encoder:
    """A minimal protocol-2 pickle writer for plain data and :class:`_Global` objects.

    The standard pickler insists on importing a class to name it; DCP's classes live in
    torch, which sn-monitor does not import, so the GLOBAL opcodes are written here.
    """

    def __init__(self) -> None:
        self.out = bytearray(pickle.PROTO + bytes([2]))

    def finish(self, value: Any) -> bytes:
        self.encode(value)
        self.out += pickle.STOP
        return bytes(self.out)

    def encode(self, value: Any) -> None:
        out = self.out
        if value is None:
            out += pickle.NONE
        elif value is True or value is False:
            out += pickle.NEWTRUE if value else pickle.NEWFALSE
        elif isinstance(value, int):
            self._int(value)
        elif isinstance(value, str):
            raw = value.encode("utf-8", "surrogatepass")
            out += pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw
        elif isinstance(value, _Global):
            self._global(value.module, value.name)
            out += pickle.EMPTY_TUPLE + pickle.NEWOBJ
            self.encode(value.state)
            out += pickle.BUILD
        elif isinstance(value, tuple):
            out += pickle.MARK
            for item in value:
                self.encode(item)
            out += pickle.TUPLE
        elif isinstance(value, list):
            out += pickle.EMPTY_LIST
            if value:
                out += pickle.MARK
                for item in value:
                    self.encode(item)
                out += pickle.APPENDS
        elif isinstance(value, dict):
            out += pickle.EMPTY_DICT
            if value:
                out += pickle.MARK
                for key, item in value.items():
                    self.encode(key)
                    self.encode(item)
                out += pickle.SETITEMS
        else:
            raise TypeError(f"cannot encode {type(value).__name__} in DCP metadata")

    def _int(self, value: int) -> None:
        if 0 <= value < 256:
            self.out += pickle.BININT1 + bytes([value])
        elif -(1 << 31) <= value < (1 << 31):
            self.out += pickle.BININT + struct.pack("<i", value)
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.out += pickle.LONG1 + bytes([len(raw)]) + raw

    def _global(self, module: str, name: str) -> None:
        self.out += pickle.GLOBAL + f"{module}\n{name}\n".encode("ascii")


def dumps_metadata(items: Mapping[str, tuple[str, int, int]],
                   checkpoint_id: str | None = None) -> bytes:
    """A DCP .metadata for bytes entries: ``fqn -> (relative_path, offset, length)``."""
    state_dict_metadata = {fqn: _Global(_DCP, "BytesStorageMetadata") for fqn in items}
    planner_data = {fqn: (fqn,) for fqn in items}
    storage_data = {
        _Global(_DCP, "MetadataIndex", {"fqn": fqn, "index": None}):
            _Global(_FS, "_StorageInfo",
                    {"relative_path": rel, "offset": offset, "length": length})
        for fqn, (rel, offset, length) in items.items()
    }
    storage_meta = _Global(_DCP, "StorageMeta", {
        "checkpoint_id": checkpoint_id, "save_id": str(uuid.uuid4()), "load_id": None,
        "modules": []})
    metadata = _Global(_DCP, "Metadata", {
        "state_dict_metadata": state_dict_metadata, "planner_data": planner_data,
        "storage_data": storage_data, "storage_meta": storage_meta, "version": DCP_VERSION})
    return _Encoder().finish(metadata)


def write_checkpoint(directory: str | Path, step: int, blobs: Mapping[str, bytes],
                     *, name: str | None = None,
                     fsync: bool = True) -> Path:
    """Write ``blobs`` as a DCP checkpoint ``directory/step_{step:09d}`` (or ``name``).

    The order is torch's: the data file first, then ``.metadata`` through a temporary
    file and a rename, so a writer that dies part-way leaves a directory that
    :func:`is_complete` rejects. Each blob is a bytes entry of the state dict (torch's
    own loader passes such entries to ``torch.load``; read them back with a planner that
    keeps the raw bytes, or store ``torch.save`` output in them).
    """
    if step < 0:
        raise ValueError(f"a step is not negative, got {step}")
    target = Path(directory) / (name if name is not None else f"step_{step:09d}")
    target.mkdir(parents=True, exist_ok=True)
    metadata_path = target / METADATA_FILE
    if metadata_path.exists():  # rewriting: the directory is incomplete until the end
        metadata_path.unlink()
    data_file = "__0_0.distcp"
    items: dict[str, tuple[str, int, int]] = {}
    with (target / data_file).open("wb") as handle:
        offset = 0
        for fqn, blob in blobs.items():
            handle.write(blob)
            items[fqn] = (data_file, offset, len(blob))
            offset += len(blob)
        _sync(handle, fsync)
    encoded = dumps_metadata(items, checkpoint_id=str(target))
    tmp = target / f"{METADATA_FILE}.tmp"
    with tmp.open("wb") as handle:
        handle.write(encoded)
        _sync(handle, fsync)
    os.replace(tmp, metadata_path)
    if fsync:
        _sync_directory(target)
    return target


def _sync(handle: Any, enabled: bool) -> None:
    if enabled:
        handle.flush()
        os.fsync(handle.fileno())


def _sync_directory(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = [
    "DCP_VERSION",
    "METADATA_FILE",
    "Completeness",
    "DcpError",
    "DcpMetadata",
    "Entry",
    "StoredItem",
    "dumps_metadata",
    "is_complete",
    "loads_metadata",
    "read_metadata",
    "write_checkpoint",
]
