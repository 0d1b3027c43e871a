"""The controller's end of a reports' stream (:mod:`sn_monitor.report_stream`).

Once :mod:`~sn_monitor.controller.api.report_lane` has upgraded a connection, every read on
it goes to a :class:`ReportStreamSession`: the frames it completes are ingested in order
by the same :class:`~sn_monitor.controller.api.report_gate.ReportGate` as posted reports, under the
identity the upgrade request proved, and only the reports that need an answer get one
(the rule is in :mod:`sn_monitor.report_stream`). The answers a read produced leave in
one write.

A report that carries events is answered once they are written (a
:class:`~sn_monitor.controller.storage.writer.PendingReply`), so that its answer acknowledges
them; the answers behind it wait with it, in order. The others never wait.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import msgspec

from sn_monitor.controller.api.report_gate import ReportGate
from sn_monitor.controller.api.statuses import retry_after_of, status_of
from sn_monitor.controller.errors import ControllerError
from sn_monitor.controller.security.auth import Identity
from sn_monitor.controller.storage.writer import PendingReply
from sn_monitor.model import StreamReply
from sn_monitor.report_stream import ACK, FrameReader, frame, report_head

_encoder = msgspec.json.Encoder()


#: An answer on its way out: ready, or (the reports it counts as accepted, the reply)
#: waiting for its report's events to be written.
_Outgoing = StreamReply | tuple[int, PendingReply]


class ReportStreamSession:
    """One upgraded connection's reports: :meth:`feed` each read to it."""

    __slots__ = ("_accepted", "_gate", "_identity", "_outbox", "_peer", "_reader",
                 "_soon", "_then", "_waits_on", "_write")

    def __init__(self, gate: ReportGate, identity: Identity, peer: str | None,
                 write: Callable[[bytes], None],
                 soon: Callable[[Callable[[], None]], object]) -> None:
        """A session writing its answers with ``write`` (on the event loop).

        ``soon`` schedules a call on the event loop from another thread
        (``loop.call_soon_threadsafe``): an answer that waited for its events.
        """
        self._gate = gate
        self._identity = identity
        self._peer = peer
        self._write = write
        self._soon = soon
        self._reader = FrameReader(gate.max_body_bytes)
        #: Reports accepted since the last answer.
        self._accepted = 0
        #: Answers not yet written, in order; the first one waits for its events.
        self._outbox: deque[_Outgoing] = deque()
        #: The pending reply the outbox's head waits on (a callback is registered).
        self._waits_on: PendingReply | None = None
        #: What to run once the outbox is empty (:meth:`after_answers`).
        self._then: Callable[[], None] | None = None

    def feed(self, data: bytes) -> bool:
        """Ingest the reports ``data`` completes and answer those that need it.

        False when the stream is to close (a frame over the limit, answered 413).
        """
        if self._reader.too_large is not None:
            return False  # answered 413 already: closing once the answers are out
        answers: list[_Outgoing] = []
        gate, identity, peer = self._gate, self._identity, self._peer
        for flags, payload in self._reader.feed(data):
            try:
                reply = gate.ingest(identity, payload, peer)
            except ControllerError as err:
                head = report_head(payload)  # to name the refused report in the answer
                answers.append(StreamReply(
                    status=status_of(err), accepted=self._accepted, node=head.node,
                    sequence=head.sequence, error=err.message, retry_after=retry_after_of(err)))
                self._accepted = 0
                continue
            self._accepted += 1
            if isinstance(reply, PendingReply):  # its events: acknowledged in its answer
                answers.append((self._accepted, reply))
                self._accepted = 0
            elif (flags & ACK or reply.commands or reply.edge_rules is not None
                    or reply.topology_wanted):
                answers.append(StreamReply(accepted=self._accepted, node=reply.node,
                                           sequence=reply.sequence, reply=reply))
                self._accepted = 0
        too_large = self._reader.too_large
        if too_large is not None:
            answers.append(StreamReply(status=413, accepted=self._accepted,
                                       error=f"report {too_large}"))
            self._accepted = 0
        if answers:
            self._outbox.extend(answers)
            self._flush()
        return too_large is None

    def after_answers(self, then: Callable[[], None]) -> None:
        """Run ``then`` once every answer so far is written (now, if none waits)."""
        if self._outbox:
            self._then = then
        else:
            then()

    def _flush(self) -> None:
        """Write the answers that are ready, up to the first that waits (on the loop)."""
        ready: list[bytes] = []
        outbox = self._outbox
        while outbox:
            head = outbox[0]
            if isinstance(head, tuple):
                accepted, pending = head
                if not pending.written.done():
                    if self._waits_on is not pending:
                        self._waits_on = pending
                        pending.written.add_done_callback(lambda _: self._soon(self._flush))
                    break
                reply = pending.reply()
                head = StreamReply(accepted=accepted, node=reply.node, sequence=reply.sequence,
                                   reply=reply)
            ready.append(frame(_encoder.encode(head)))
            outbox.popleft()
        if ready:
            self._write(b"".join(ready))
        if not outbox and self._then is not None:
            then, self._then = self._then, None
            then()
