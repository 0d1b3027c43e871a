"""What one report attempt comes back with: the controller's reply, or a failure.

The reply is decoded leniently: its commands are decoded one by one
(:func:`decode_commands`), so a command this agent does not understand is answered with a
failed result instead of making the whole reply undecodable. Imports nothing of the
package.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.model import Command, CommandResult

log = logging.getLogger(__package__)  # the reporter's one logger, named as before the split


class Reply(msgspec.Struct, frozen=True):
    """:class:`ReportReply` with the commands and rules left raw, to decode one by one."""

    sequence: int
    events_stored_through: int = -1
    commands: list[msgspec.Raw] = []
    edge_rules: msgspec.Raw = msgspec.Raw(b"")  # absent: empty
    topology_wanted: bool = False


class _CommandId(msgspec.Struct):
    id: str = ""


@dataclass(frozen=True)
class Failure:
    """One report attempt that failed."""

    message: str
    retry_after: float | None = None
    #: Already logged (a refusal, once per distinct message).
    quiet: bool = False
    #: The controller is unreachable or a standby: the next one gets the report at once.
    fail_over: bool = False
    #: The controller refused this report for what it says (400, 422): sent again as it
    #: is, it would be refused again.
    refused: bool = False


def decode_reply(body: bytes, named: str) -> Reply | Failure:
    """The reply in ``body``, or the failure it is; ``named`` names the controller."""
    try:
        return msgspec.json.decode(body, type=Reply)
    except msgspec.DecodeError as err:
        return Failure(f"{named}: its reply is not a report reply: {err}")


def decode_commands(
    raw: Sequence[msgspec.Raw], clock: Clock
) -> tuple[list[Command], list[CommandResult]]:
    """The commands this agent understands, and a failed result for each it does not."""
    commands: list[Command] = []
    results: list[CommandResult] = []
    for item in raw:
        try:
            commands.append(msgspec.json.decode(item, type=Command))
        except msgspec.DecodeError as err:
            command_id = _command_id(item)
            log.error("cannot carry out command %r: %s", command_id or "?", err)
            if command_id:
                results.append(CommandResult(
                    id=command_id[:128], ok=False, time_seconds=clock.time(),
                    message=f"agent cannot decode the command: {err}"[:4096],
                ))
    return commands, results


def _command_id(raw: msgspec.Raw) -> str | None:
    try:
        value = msgspec.json.decode(raw, type=_CommandId).id
    except msgspec.DecodeError:
        return None
    return value or None
