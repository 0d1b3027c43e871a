"""The one table from the controller's domain errors to HTTP statuses, and Retry-After.

Every decision is the :class:`~sn_monitor.controller.service.Controller`'s, and its
refusals are domain errors (:mod:`sn_monitor.controller.errors`); :data:`STATUS_OF`,
here alone, turns them into HTTP statuses for every route and both report lanes.
"""

from __future__ import annotations

from typing import Final

from sn_monitor.controller.errors import (
    Conflict,
    ControllerError,
    Forbidden,
    Invalid,
    Malformed,
    NotFound,
    TooLarge,
    Unauthenticated,
    Unavailable,
    UnsupportedMedia,
)

#: The one table from domain errors to HTTP statuses (the most specific class wins).
STATUS_OF: Final[dict[type[ControllerError], int]] = {
    Malformed: 400,
    Invalid: 422,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    TooLarge: 413,
    UnsupportedMedia: 415,
    Unavailable: 503,
}


def status_of(err: ControllerError) -> int:
    """The HTTP status that answers ``err`` (STATUS_OF; 500 for an unmapped kind)."""
    for kind in type(err).__mro__:
        status = STATUS_OF.get(kind)
        if status is not None:
            return status
    return 500


def retry_after_of(err: ControllerError) -> float | None:
    """Seconds after which asking again may succeed: an Unavailable's, if it says."""
    return err.retry_after if isinstance(err, Unavailable) else None


def error_headers(err: ControllerError) -> dict[str, str]:
    """Headers an error answer carries: when to ask again, for an Unavailable."""
    retry_after = retry_after_of(err)
    if retry_after is not None:
        return {"retry-after": str(max(1, round(retry_after)))}
    return {}
