"""NVIDIA's Xid catalogue as data: for each XID code, its name and NVIDIA's immediate action.

NVIDIA publishes, for Ampere and newer GPUs, a catalogue that gives every XID code a
"resolution bucket" for the action that gets the system back into service: RESTART_APP
(the application's own fault; the GPU is fine), RESET_GPU, RESTART_BM (reboot the node),
IGNORE, workflows that need more than the code (XID 45, 48, NVLink), and a few more.
Rules that list XID codes by hand drift from it and cannot tell an application's memory
fault from a broken GPU; with the catalogue as data they ask for "the codes NVIDIA says
need a GPU reset" instead, and an operator tunes one file.

The packaged file (``sn_monitor/rules/xid_catalog.yaml``) says where and when it was
taken; an operator's edited copy is named by the controller's ``xid_catalog:`` setting.
Both load through the one config loader, so a bad file names file, key path and line.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

from sn_monitor.config import ConfigError, Document, bind, load_yaml, optional, positive, setting

#: NVIDIA's bucket name, e.g. ``"RESTART_APP"``.
Resolution = str

#: The catalogue leaves the immediate action blank (XIDs 162-172 in the 2025-09-30 revision):
#: sn-monitor's own marker, so that "NVIDIA says nothing" is never mistaken for IGNORE.
UNSPECIFIED: Final = "UNSPECIFIED"

#: Every immediate-action bucket the catalogue uses (its "Xids" and "XID 144-150 Decode"
#: sheets), plus :data:`UNSPECIFIED`. Investigatory buckets (CHECK_APP/CUDA,
#: INVESTIGATE_SW, ...) say how to find a cause, not how to recover, and are not here.
RESOLUTIONS: Final[frozenset[str]] = frozenset({
    "RESTART_APP",           # restart the application; no GPU reset or reboot needed
    "RESET_GPU",             # reset the GPU; no reboot needed
    "RESTART_BM",            # reboot the node ("restart bare metal")
    "RESTART_VM",            # restart the VM that owns the GPU
    "CHECK_MECHANICALS",     # check seating and power connections
    "CHECK_UVM",             # RESET_GPU if UVM or vGPU is in use, else IGNORE
    "UPDATE_SWFW",           # update driver and firmware
    "CONTACT_SUPPORT",       # contact your support organisation
    "IGNORE",                # no action required
    "WORKFLOW_XID_45",       # alone: restart Fabric Manager; with other XIDs: follow those
    "WORKFLOW_XID_48",       # alone: RESET_GPU; with XID 63/64: drain and reset
    "WORKFLOW_NVLINK_ERR",   # decode XID 74's registers
    "WORKFLOW_NVLINK5_ERR",  # decode XIDs 144-150 (IGNORE, XID_154_EVAL or RESET_GPU)
    "XID_154",               # XID 154 names the action another XID needs
    "XID_154_EVAL",          # do what an accompanying XID 154 says; without one, RESTART_APP
    UNSPECIFIED,
})

#: The buckets after which the GPU cannot be trusted until it is reset or its node rebooted
#: (NVIDIA's RESET_GPU and RESTART_BM, and the workflows that end in one): the codes the
#: packaged ``fatal-xid`` rule acts on, and the ones the agent exports at 0 on every GPU.
GPU_FATAL_RESOLUTIONS: Final[frozenset[str]] = frozenset({
    "RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
    "CHECK_UVM",
})

#: The optional ``category`` of an entry: what part of the system the code is about.
CATEGORIES: Final[frozenset[str]] = frozenset({
    "application", "driver", "engine", "memory", "nvlink", "gsp", "firmware", "pcie", "c2c",
    "power", "hardware", "virtualization", "security", "informational", "unused",
})

#: The ``kind:`` of a catalogue file: how check-config and the rules loader recognise one.
KIND: Final = "XidCatalog"

#: The catalogue that ships inside the package.
PACKAGED_CATALOG: Final = Path(__file__).resolve().parent / "xid_catalog.yaml"


class CatalogError(ConfigError):
    """A bad XID catalogue file: which file, which key, which line, and what is wrong.

    A :class:`~sn_monitor.config.ConfigError` (so ``check-config`` and the controller's
    start-up report it as they report any bad file), hence a ``SnMonitorError``.
    """


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One XID code as the catalogue describes it."""

    code: int
    #: NVIDIA's short description ("Unused" for codes current GPUs no longer raise).
    name: str
    #: NVIDIA's immediate-action bucket, one of :data:`RESOLUTIONS`.
    resolution: str
    #: One line: what the code means for the job and the GPU.
    why: str
    #: One of :data:`CATEGORIES`, where the file gives one.
    category: str | None = None


@dataclass(frozen=True)
class XidCatalog:
    """The whole catalogue: where it came from, which revision, and its entries by code."""

    source: str
    version: str
    entries: Mapping[int, XidEntry]

    def get(self, code: int) -> XidEntry | None:
        """The entry of ``code``, or None when the catalogue does not list it."""
        return self.entries.get(code)

    def codes(self, resolutions: Iterable[str]) -> frozenset[int]:
        """The codes whose resolution is one of ``resolutions``.

        A name outside :data:`RESOLUTIONS` is a ValueError, not an empty answer: a typo
        in a rule must not silently match no XID at all.
        """
        if isinstance(resolutions, str):
            raise TypeError(f"resolutions must be a collection of names, not the string "
                            f"{resolutions!r}")
        wanted = frozenset(resolutions)
        unknown = sorted(wanted - RESOLUTIONS)
        if unknown:
            raise ValueError(f"unknown resolution {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(sorted(RESOLUTIONS))})")
        return frozenset(code for code, entry in self.entries.items()
                         if entry.resolution in wanted)

    def describe(self, code: int) -> str:
        """One line for a person: the code, its name, NVIDIA's resolution and why."""
        entry = self.entries.get(code)
        if entry is None:
            return f"XID {code}: not in NVIDIA's Xid catalogue ({self.version})"
        if entry.resolution == UNSPECIFIED:
            return (f"XID {code} ({entry.name}): NVIDIA's catalogue gives no resolution "
                    f"— {entry.why}")
        return f"XID {code} ({entry.name}): NVIDIA's resolution {entry.resolution} — {entry.why}"


# ---------------------------------------------------------------- the file, as the loader binds it


def _one_line(value: str) -> None:
    if not value.strip():
        raise ValueError("must not be empty")
    if "\n" in value.strip():
        raise ValueError("must be one line")


def _known_resolution(value: str) -> None:
    if value not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {value!r} (NVIDIA's buckets: "
                         f"{', '.join(sorted(RESOLUTIONS))})")


def _known_category(value: str) -> None:
    if value not in CATEGORIES:
        raise ValueError(f"unknown category {value!r} (known: {', '.join(sorted(CATEGORIES))})")


def _some_entries(value: list[Any]) -> None:
    if not value:
        raise ValueError("lists no XID codes")


@dataclass(frozen=True)
class _EntryFile:
    code: int = setting(check=positive)
    name: str = setting(check=_one_line)
    resolution: str = setting(check=_known_resolution)
    why: str = setting(check=_one_line)
    category: str | None = setting(default=None, check=optional(_known_category))


@dataclass(frozen=True)
class _CatalogFile:
    kind: Literal["XidCatalog"]
    source: str = setting(check=_one_line)
    version: str = setting(check=_one_line)
    entries: list[_EntryFile] = setting(check=_some_entries)


def is_catalog_document(data: object) -> bool:
    """Whether parsed YAML is an XID catalogue (``kind: XidCatalog``) rather than rules."""
    return isinstance(data, dict) and data.get("kind") == KIND


def parse_catalog(doc: Document) -> XidCatalog:
    """The catalogue in ``doc``; CatalogError naming file, key path and line if it is bad."""
    try:
        parsed = bind(_CatalogFile, doc)
    except ConfigError as err:
        raise CatalogError(err.file, err.key, err.line, err.message) from None
    entries: dict[int, XidEntry] = {}
    first_line: dict[int, int | None] = {}
    for index, item in enumerate(parsed.entries):
        line = doc.line(("entries", index, "code"))
        if item.code in entries:
            raise CatalogError(doc.path, f"entries[{index}].code", line,
                               f"duplicate code {item.code} (first at line "
                               f"{first_line[item.code]})")
        first_line[item.code] = line
        entries[item.code] = XidEntry(code=item.code, name=item.name.strip(),
                                      resolution=item.resolution, why=item.why.strip(),
                                      category=item.category)
    return XidCatalog(source=parsed.source.strip(), version=parsed.version.strip(),
                      entries=MappingProxyType(dict(sorted(entries.items()))))


def load_catalog(path: Path | None = None) -> XidCatalog:
    """The catalogue in ``path``; None: the packaged one (read once, then cached).

    Raises CatalogError (naming file, key path and line) for a missing, unreadable or
    malformed file.
    """
    if path is None:
        return _packaged_catalog()
    return _read(Path(path))


def gpu_fatal_codes() -> frozenset[int]:
    """The packaged catalogue's codes in :data:`GPU_FATAL_RESOLUTIONS`.

    19 in its 2025-09-30 revision: 46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136,
    140, 143, 151, 155, 156, 158, 159.
    """
    return _packaged_catalog().codes(GPU_FATAL_RESOLUTIONS)


@functools.cache
def _packaged_catalog() -> XidCatalog:
    return _read(PACKAGED_CATALOG)


def _read(path: Path) -> XidCatalog:
    try:
        doc = load_yaml(path)
    except ConfigError as err:
        raise CatalogError(err.file, err.key, err.line, err.message) from None
    return parse_catalog(doc)


def check_catalog_file(path: str) -> None:
    """A check for ``setting(check=...)``: ``path`` loads as a catalogue (else ValueError)."""
    try:
        load_catalog(Path(path))
    except CatalogError as err:
        raise ValueError(f"not a usable XID catalogue: {err}") from None
