"""The controller's end of a reports' stream (:mod:`sn_monitor.report_stream`).

Once :mod:`~sn_monitor.controller.report_lane` has upgraded a connection, every read on
it goes to a :class:`ReportStreamSession`: the frames it completes are ingested in order
by the same :class:`~sn_monitor.controller.app.ReportGate` as posted reports, under the
identity the upgrade request proved, and only the reports that need an answer get one
(the rule is in :mod:`sn_monitor.report_stream`). The answers a read produced leave in
one write.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from sn_monitor.controller.app import ReportGate, retry_after_of, status_of
from sn_monitor.controller.auth import Identity
from sn_monitor.controller.errors import ControllerError
from sn_monitor.model import StreamReply
from sn_monitor.report_stream import ACK, FrameReader, frame, report_head

_encoder = msgspec.json.Encoder()


class ReportStreamSession:
    """One upgraded connection's reports: :meth:`feed` each read to it."""

    __slots__ = ("_accepted", "_gate", "_identity", "_peer", "_reader", "_write")

    def __init__(self, gate: ReportGate, identity: Identity, peer: str | None,
                 write: Callable[[bytes], None]) -> None:
        self._gate = gate
        self._identity = identity
        self._peer = peer
        self._write = write
        self._reader = FrameReader(gate.max_body_bytes)
        #: Reports accepted since the last answer.
        self._accepted = 0

    def feed(self, data: bytes) -> bool:
        """Ingest the reports ``data`` completes and answer those that need it.

        False when the stream is to close (a frame over the limit, answered 413).
        """
        answers: list[StreamReply] = []
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
            if (flags & ACK or reply.commands or reply.edge_rules is not None
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
            self._write(b"".join(frame(_encoder.encode(a)) for a in answers))
        return too_large is None
