"""The controller's domain errors: what went wrong, never which HTTP status says so.

The controller, the jobs and the rules raise these; the API edge alone turns them into
statuses, in one table (:data:`sn_monitor.controller.api.statuses.STATUS_OF`). The kinds are those
of any resource API (Kubernetes' ``StatusReason``, gRPC's codes): the thing named does not
exist, it changed meanwhile, the request is wrong, the caller may not, or the controller
cannot now and says when to try again.
"""

from __future__ import annotations

from sn_monitor.errors import SnMonitorError


class ControllerError(SnMonitorError):
    """A request the controller refuses; ``message`` says why, for the caller."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(ControllerError):
    """The node, job, incident, action or recovery named does not exist."""


class Conflict(ControllerError):
    """The request is valid but the thing changed meanwhile or is in the wrong state."""


class Invalid(ControllerError):
    """The request is readable but wrong: a field out of bounds, a name not allowed."""


class Malformed(Invalid):
    """The body cannot be read at all: not JSON, empty, nested too deeply."""


class Unauthenticated(ControllerError):
    """No credentials, or ones nobody issued."""


class Forbidden(ControllerError):
    """The caller is known but may not do this (its role, or the node it is bound to)."""


class TooLarge(ControllerError):
    """A body over the controller's limit (announced or sent)."""


class UnsupportedMedia(ControllerError):
    """A body of a media type the route does not read."""


class Unavailable(ControllerError):
    """The controller cannot do this now (its store takes no writes); ask again later.

    ``retry_after``: seconds after which asking again may succeed (None: unknown).
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
