"""The agent's on-disk spool of events the controller has not yet acknowledged.

Events are never dropped, only retried (DESIGN.md): an XID seen while the controller is
down, or just before the agent restarts, must still reach it. So every event is written
here first, numbered, and stays until a reply says the controller stored it.

Layout of ``directory``:

* ``events-<first id>.jsonl``: append-only segments, one msgspec-encoded
  :class:`EventRecord` per line. Each append is flushed and fsynced (events are rare;
  losing one to a power cut is what the spool is for). A new segment starts when the
  current one passes ``segment_bytes``.
* ``ack.json``: ``{"acknowledged_through": N}``, replaced atomically. Segments whose
  records are all acknowledged are deleted; a partly acknowledged one stays and its
  acknowledged records are skipped.

Ids keep increasing across restarts: the next id is one past the highest id found in the
segments or the ack marker. A crash in the middle of an append leaves a torn last line;
it is cut off at open (that append never returned, so its id was never handed out).

Only events are spooled: metrics are not, because when the controller is back it sees
fresh samples. The spool is bounded by ``max_bytes``: past it the OLDEST segments are
deleted, counted in :attr:`EventSpool.dropped_total` and logged, so that a controller
outage during an event storm cannot fill the node's disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from sn_monitor.agent.report import event_record
from sn_monitor.clock import Clock
from sn_monitor.durable import fsync_directory, write_atomically
from sn_monitor.model import Event, EventRecord

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
ACK_FILE = "ack.json"
_SEGMENT = re.compile(r"events-(\d{20})\.jsonl")
_DROP_WARNING_INTERVAL_SECONDS = 60.0


def _segment_name(first_id: int) -> str:
    return f"events-{first_id:020d}.jsonl"


@dataclass(slots=True)
class _Segment:
    """What the spool remembers about one segment file (its records stay on disk)."""

    path: Path
    first_id: int
    last_id: int
    count: int
    size_bytes: int


class EventSpool:
    """Bounded, persistent queue of :class:`EventRecord`, oldest first; thread-safe."""

    def __init__(
        self,
        directory: Path,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Clock | None = None,
        *,
        segment_bytes: int | None = None,
    ) -> None:
        if max_bytes < 1024:
            raise ValueError(f"max_bytes must be at least 1024, got {max_bytes}")
        self._directory = Path(directory)
        self._max_bytes = max_bytes
        self._segment_bytes = segment_bytes or max(512, max_bytes // 16)
        if not 0 < self._segment_bytes <= max_bytes // 2:
            raise ValueError(
                f"segment_bytes must be in (0, max_bytes/2], got {self._segment_bytes}"
            )
        self._clock = clock
        self._lock = threading.Lock()
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(EventRecord)
        self._segments: list[_Segment] = []
        self._acknowledged = -1
        self._next_id = 0
        self._pending = 0
        self._last_drop_warning: float | None = None
        #: Events deleted unacknowledged because the spool was over ``max_bytes``.
        self.dropped_total = 0
        self._directory.mkdir(parents=True, exist_ok=True)
        self._open()

    # ---------------------------------------------------------------- state

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def pending_count(self) -> int:
        """Events spooled and not yet acknowledged."""
        return self._pending

    @property
    def size_bytes(self) -> int:
        """Bytes on disk in segments (acknowledged records of a partial segment included)."""
        return sum(s.size_bytes for s in self._segments)

    @property
    def acknowledged_through(self) -> int:
        """The highest id the controller has stored (-1: none yet)."""
        return self._acknowledged

    @property
    def next_id(self) -> int:
        """The id the next appended event gets."""
        return self._next_id

    # ---------------------------------------------------------------- open

    def _open(self) -> None:
        self._acknowledged = self._read_ack()
        highest = self._acknowledged
        paths = sorted(p for p in self._directory.iterdir() if _SEGMENT.fullmatch(p.name))
        for index, path in enumerate(paths):
            segment = self._scan(path, last=index == len(paths) - 1)
            if segment is None:
                continue
            highest = max(highest, segment.last_id)
            if segment.last_id <= self._acknowledged:
                self._unlink(segment.path)
                continue
            self._segments.append(segment)
        self._next_id = highest + 1
        self._pending = sum(self._unacknowledged(s) for s in self._segments)
        if self._pending:
            log.info("event spool holds %d unacknowledged events (next id %d)",
                     self._pending, self._next_id)

    def _read_ack(self) -> int:
        path = self._directory / ACK_FILE
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            return -1
        except (OSError, ValueError) as err:
            # The marker is replaced atomically, so this is outside damage: replaying
            # events the controller already has is better than losing any.
            log.error("cannot read %s (%s): resending every spooled event", path, err)
            return -1
        value = doc.get("acknowledged_through") if isinstance(doc, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            log.error("%s has no acknowledged_through: resending every spooled event", path)
            return -1
        return value

    def _scan(self, path: Path, *, last: bool) -> _Segment | None:
        """Index one segment; cut a torn last line; skip (and log) corrupt lines elsewhere."""
        data = path.read_bytes()
        first_id: int | None = None
        last_id = -1
        count = 0
        good_end = 0
        offset = 0
        while offset < len(data):
            newline = data.find(b"\n", offset)
            end = len(data) if newline < 0 else newline + 1
            line = data[offset:end]
            try:
                if newline < 0:
                    raise msgspec.DecodeError("no end of line")
                record = self._decoder.decode(line)
            except msgspec.DecodeError as err:
                if last and end == len(data):
                    log.warning("%s: cutting a torn last line (%d bytes): %s",
                                path.name, len(line), err)
                    break
                log.error("%s: skipping a corrupt line at byte %d: %s", path.name, offset, err)
            else:
                first_id = record.id if first_id is None else first_id
                last_id = max(last_id, record.id)
                count += 1
                good_end = end
            offset = end
        if good_end < len(data) and last:
            with open(path, "r+b") as handle:
                handle.truncate(good_end)
                handle.flush()
                os.fsync(handle.fileno())
        if first_id is None:
            self._unlink(path)
            return None
        return _Segment(path, first_id, last_id, count, good_end if last else len(data))

    def _unacknowledged(self, segment: _Segment) -> int:
        if segment.first_id > self._acknowledged:
            return segment.count
        return sum(1 for r in self._read_segment(segment) if r.id > self._acknowledged)

    # ---------------------------------------------------------------- append

    def append(self, event: Event) -> EventRecord:
        """Number ``event``, write it durably, and return its record."""
        return self.extend([event])[0]

    def extend(self, events: Iterable[Event]) -> list[EventRecord]:
        """Number and write several events with one fsync (an XID storm comes in bursts)."""
        with self._lock:
            records: list[EventRecord] = []
            for event in events:
                records.append(event_record(event, self._next_id))
                self._next_id += 1
            if not records:
                return records
            segment = self._writable_segment(records[0].id)
            payload = b"".join(self._encoder.encode(r) + b"\n" for r in records)
            with open(segment.path, "ab") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            segment.last_id = records[-1].id
            segment.count += len(records)
            segment.size_bytes += len(payload)
            self._pending += len(records)
            self._enforce_bound()
            return records

    def _writable_segment(self, first_id: int) -> _Segment:
        if self._segments and self._segments[-1].size_bytes < self._segment_bytes:
            return self._segments[-1]
        path = self._directory / _segment_name(first_id)
        path.touch()
        fsync_directory(self._directory)
        segment = _Segment(path, first_id, first_id - 1, 0, 0)
        self._segments.append(segment)
        return segment

    def _enforce_bound(self) -> None:
        """Delete the oldest segments (never the one being written) until under the bound."""
        dropped = 0
        while self.size_bytes > self._max_bytes and len(self._segments) > 1:
            oldest = self._segments.pop(0)
            lost = self._unacknowledged(oldest)
            self._unlink(oldest.path)
            dropped += lost
        if not dropped:
            return
        self._pending -= dropped
        self.dropped_total += dropped
        now = self._clock.monotonic() if self._clock is not None else None
        if (
            now is None
            or self._last_drop_warning is None
            or now - self._last_drop_warning >= _DROP_WARNING_INTERVAL_SECONDS
        ):
            self._last_drop_warning = now
            log.warning(
                "event spool over %d bytes: dropped the %d oldest unacknowledged events "
                "(%d dropped since start)", self._max_bytes, dropped, self.dropped_total,
            )

    # ---------------------------------------------------------------- read, acknowledge

    def pending(self, limit: int | None = None) -> list[EventRecord]:
        """Unacknowledged records, oldest first, at most ``limit``."""
        with self._lock:
            out: list[EventRecord] = []
            for segment in self._segments:
                if segment.last_id <= self._acknowledged:
                    continue
                for record in self._read_segment(segment):
                    if record.id <= self._acknowledged:
                        continue
                    if limit is not None and len(out) >= limit:
                        return out
                    out.append(record)
            return out

    def acknowledge(self, through_id: int) -> None:
        """The controller stored every event up to ``through_id``: forget them."""
        with self._lock:
            through_id = min(through_id, self._next_id - 1)
            if through_id <= self._acknowledged:
                return
            write_atomically(
                self._directory / ACK_FILE,
                json.dumps({"acknowledged_through": through_id}).encode(),
            )
            self._acknowledged = through_id
            kept: list[_Segment] = []
            for segment in self._segments:
                if segment.last_id <= through_id:
                    self._unlink(segment.path)
                else:
                    kept.append(segment)
            self._segments = kept
            self._pending = sum(self._unacknowledged(s) for s in self._segments)

    def _read_segment(self, segment: _Segment) -> list[EventRecord]:
        try:
            data = segment.path.read_bytes()[: segment.size_bytes]
        except OSError as err:
            log.error("cannot read event spool segment %s: %s", segment.path, err)
            return []
        records: list[EventRecord] = []
        for line in data.splitlines():
            try:
                records.append(self._decoder.decode(line))
            except msgspec.DecodeError:
                continue  # reported once, when the segment was scanned at open
        return records

    def _unlink(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
