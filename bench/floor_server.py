"""A bare HTTP/1.1 responder: the least CPU any server can spend on simulate's reports.

``python -m bench.floor_server PORT`` answers every request on 127.0.0.1:PORT with
``200 {}`` on uvloop, reading nothing but the head's Content-Length. Under the same
simulate load as the controller, its CPU is what the reads, the writes and the event
loop cost on this machine at that moment (simulate_bench's "floor"): the machine's
speed varies from hour to hour, and the controller's CPU beside it tells how much is
the controller's own.

It takes reports' streams (:mod:`sn_monitor.report_stream`) too: it switches protocols
when asked, reads the frames, and answers those that ask (ACK) with the least answer
simulate reads (who it answers, how many reports since the last answer).
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import msgspec
import uvloop

from sn_monitor.model import ReportReply, StreamReply
from sn_monitor.report_stream import ACK, SWITCHING, FrameReader, frame, report_head

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class Responder(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.stream: FrameReader | None = None
        self.accepted = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if self.stream is not None:
            self._frames(data)
            return
        if data.startswith(b"GET "):  # the reports' stream: the upgrade asked, no body
            end = data.find(b"\r\n\r\n")
            self.transport.write(SWITCHING)
            self.stream = FrameReader(1 << 26)
            self._frames(data[end + 4:])
            return
        buffer = self.buffer + data
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            at = buffer.lower().find(b"content-length:", 0, end)
            length = int(buffer[at + 15:buffer.find(b"\r\n", at)]) if at >= 0 else 0
            if len(buffer) < end + 4 + length:
                break
            buffer = buffer[end + 4 + length:]
            assert self.transport is not None
            self.transport.write(ANSWER)
        self.buffer = buffer

    def _frames(self, data: bytes) -> None:
        assert self.stream is not None
        assert self.transport is not None
        answers = []
        for flags, payload in self.stream.feed(data):
            self.accepted += 1
            if flags & ACK:
                head = report_head(payload)
                answers.append(frame(encode(StreamReply(
                    accepted=self.accepted, node=head.node, sequence=head.sequence,
                    reply=ReportReply(sequence=head.sequence)))))
                self.accepted = 0
        if answers:
            self.transport.write(b"".join(answers))


encode = msgspec.json.Encoder().encode


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Responder, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
