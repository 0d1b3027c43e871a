"""One request to a route, as its handler reads it: who asks, what it names, its body.

Reading is where the API's limits on input live: the body's size, media type and shape
(:mod:`sn_monitor.controller.api.body_headers`, :mod:`sn_monitor.controller.api.bodies`),
and the query parameters a route takes.
"""

from __future__ import annotations

from starlette.requests import Request

from sn_monitor.controller.api.bodies import BodyRefused, check_shape
from sn_monitor.controller.api.body_headers import (
    JSON_MEDIA,
    JSON_OR_YAML_MEDIA,
    check_body_headers,
    whole_number,
)
from sn_monitor.controller.api.controller_api import ControllerApi
from sn_monitor.controller.errors import Invalid, Malformed, TooLarge
from sn_monitor.controller.security.auth import Identity


class Call:
    """A request, the identity that made it and the controller it asks."""

    def __init__(self, request: Request, identity: Identity, controller: ControllerApi,
                 max_body_bytes: int) -> None:
        self.request = request
        self.identity = identity
        self.controller = controller
        self._max_body_bytes = max_body_bytes

    @property
    def who(self) -> str:
        """The caller's name, for the audit trail."""
        return self.identity.name

    def path(self, name: str) -> str:
        """The path parameter ``name``."""
        value: str = self.request.path_params[name]
        return value

    def query(self, name: str) -> str | None:
        """The query parameter ``name``, if given."""
        return self.request.query_params.get(name)

    def only_query(self, *known: str) -> None:
        """Refuse a query parameter the route does not take (422, naming it).

        A misspelt filter (``?stat=open``) would otherwise be ignored, and the answer
        would look like one to the question asked.
        """
        for name in self.request.query_params:
            if name not in known:
                raise Invalid(f"unknown query parameter {name!r} "
                              f"(this route takes {', '.join(known)})")

    def limit(self) -> int:
        """``?limit=``: how many rows a listing answers (100 unless given; 1 to 1000)."""
        limit = whole_number(self.request.query_params.get("limit", "100"))
        if limit is None or not 0 < limit <= 1000:
            raise Invalid("limit must be a whole number from 1 to 1000")
        return limit

    async def body(self, *, shape: bool = True, yaml_allowed: bool = False) -> bytes:
        """The body, within the size limit and, with ``shape``, the limits of bodies.py.

        JSON, or with ``yaml_allowed`` JSON or YAML, by its Content-Type (415 otherwise:
        :func:`~sn_monitor.controller.api.body_headers.check_body_headers`).
        """
        headers = self.request.headers
        limit = self._max_body_bytes
        check_body_headers(headers.get("content-length"), headers.get("transfer-encoding"),
                           headers.get("content-type"), limit=limit,
                           accepted=JSON_OR_YAML_MEDIA if yaml_allowed else JSON_MEDIA)
        chunks: list[bytes] = []
        size = 0
        async for chunk in self.request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"body larger than {limit} bytes")
            chunks.append(chunk)
        body = b"".join(chunks)
        if shape:
            try:
                check_shape(body, yaml_allowed=yaml_allowed)
            except BodyRefused as err:
                raise Malformed(err.message) from None
        return body
