"""The controller's HTTP API (v1), an ASGI app.

Only HTTP lives here: reading bodies within limits, authentication, status codes and
JSON. Every decision is the :class:`~sn_monitor.controller.service.Controller`'s, and
its refusals are domain errors (:mod:`sn_monitor.controller.errors`) that
:data:`STATUS_OF`, here alone, turns into HTTP statuses.

Where a handler's work runs (one rule for all of them). The event loop reads every
agent's report, so it runs only what answers from memory in microseconds and never
waits on a disk, a lock held across I/O or another system: the reports (the lane, and
its ASGI twin) and the probes (``/healthz``, ``/readyz``, ``/livez``,
``/openapi.json``). Every other handler makes its controller call in the thread pool
(:func:`off_loop`): those read the store, take the job orchestrator's lock, verify
checkpoints on shared storage, call Alertmanager or a driver, or render thousands of
rows. Their answers are encoded there too (:func:`json_off_loop`): the topology of
4,096 nodes is tens of MB of JSON. ``tests/unit/test_api_threads.py`` checks every
route against this rule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any, Final, ParamSpec, Protocol, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sn_monitor import __version__
from sn_monitor.controller.api.bodies import BodyRefused, check_shape
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
from sn_monitor.controller.security.auth import OPEN_ACCESS, Identity, Role, TokenBook
from sn_monitor.controller.security.peer_identity import (
    SCOPE_EXTENSION,
    AgentAuth,
    ClientCertificate,
    report_identity,
)
from sn_monitor.controller.storage.writer import PendingReply
from sn_monitor.model import (
    NODE_NAME_MAX_LENGTH,
    NODE_NAME_PATTERN,
    CheckpointBody,
    ProgressBody,
    Report,
    ReportReply,
)
from sn_monitor.rules.alerts import webhook_schema_types

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()


class BreakerChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /api/v1/breaker``: close it (evictions go on) or open it (they freeze)."""

    open: bool
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]


class ControllerApi(Protocol):
    """What the HTTP layer needs from the controller."""

    def ingest(self, body: bytes, identity: Identity,
               peer: str | None) -> ReportReply | PendingReply: ...
    def ingest_alerts(self, body: bytes, who: str) -> dict[str, Any]: ...
    def list_nodes(self) -> list[dict[str, Any]]: ...
    def get_node(self, name: str) -> dict[str, Any] | None: ...
    def manual_action(self, action: str, node: str, who: str, reason: str) -> dict[str, Any]: ...
    def list_incidents(self, status: str | None, node: str | None,
                       limit: int) -> list[dict[str, Any]]: ...
    def get_incident(self, incident_id: int) -> dict[str, Any] | None: ...
    def list_actions(self, node: str | None, state: str | None,
                     limit: int) -> list[dict[str, Any]]: ...
    def approve(self, action_id: str, who: str) -> dict[str, Any]: ...
    def list_events(self, node: str | None, kind: str | None,
                    limit: int) -> list[dict[str, Any]]: ...
    def add_job(self, body: bytes, who: str, admin: bool = False) -> dict[str, Any]: ...
    def list_jobs(self) -> list[dict[str, Any]]: ...
    def get_job(self, name: str) -> dict[str, Any] | None: ...
    def delete_job(self, name: str, who: str) -> None: ...
    def job_progress(self, name: str, body: bytes) -> dict[str, Any]: ...
    def job_checkpoint(self, name: str, body: bytes) -> dict[str, Any]: ...
    def restore_point(self, name: str) -> dict[str, Any] | None: ...
    def list_recoveries(self, job: str | None, limit: int) -> list[dict[str, Any]]: ...
    def list_repairs(self, node: str | None, limit: int) -> list[dict[str, Any]]: ...
    def topology(self, job: str | None) -> dict[str, Any]: ...
    def approve_recovery(self, recovery_id: str, who: str) -> dict[str, Any]: ...
    def return_to_pool(self, job: str, node: str, who: str) -> dict[str, Any]: ...
    def breaker_state(self) -> dict[str, Any]: ...
    def set_breaker(self, open_it: bool, who: str, reason: str) -> dict[str, Any]: ...
    def service_discovery(self) -> list[dict[str, Any]]: ...
    def health(self) -> tuple[bool, dict[str, Any]]: ...
    def metrics(self) -> bytes: ...


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


_P = ParamSpec("_P")
_T = TypeVar("_T")


async def off_loop(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``fn(*args, **kwargs)`` in the thread pool (the rule in the module docstring)."""
    return await run_in_threadpool(fn, *args, **kwargs)


async def json_off_loop(answer: Callable[[], Any], status: int = 200) -> Response:
    """``answer()``, made and encoded as JSON in the thread pool (the module's rule).

    A :class:`~sn_monitor.controller.errors.ControllerError` it raises comes back here.
    """
    body = await run_in_threadpool(lambda: _encoder.encode(answer()))
    return Response(body, status_code=status, media_type="application/json")


def _found(doc: _T | None, missing: str) -> _T:
    """``doc``, or NotFound saying ``missing`` when there is none."""
    if doc is None:
        raise NotFound(missing)
    return doc


def _json(data: Any, status: int = 200) -> Response:
    return Response(_encoder.encode(data), status_code=status, media_type="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    response = _json({"error": message}, status)
    response.headers.update(headers or {})
    return response


def _refusal(err: ControllerError) -> Response:
    return _error(status_of(err), err.message, error_headers(err))


Handler = Callable[[Request], Awaitable[Response]]

#: The largest id SQLite stores; a bigger one in a path names nothing.
_MAX_ID = 2**63 - 1


def _whole_number(text: str) -> int | None:
    """``text`` as a non-negative integer if it is one in ASCII digits, else None.

    ``str.isdigit`` alone lets through characters ``int`` refuses (``²``).
    """
    return int(text) if text.isascii() and text.isdigit() else None


#: What the JSON routes read; ``POST /api/v1/jobs`` reads YAML too (its registered type
#: and the two older names clients still send).
JSON_MEDIA: Final = ("application/json",)
JSON_OR_YAML_MEDIA: Final = (*JSON_MEDIA, "application/yaml", "application/x-yaml",
                             "text/yaml")


def declared_length(value: str | None) -> int | None:
    """A ``Content-Length`` value as a number; None when there is none (or it is no number)."""
    return _whole_number(value) if value is not None else None


def announces_over(length: str | None, limit: int) -> bool:
    """Whether a ``Content-Length`` value announces more than ``limit`` bytes."""
    declared = declared_length(length)
    return declared is not None and declared > limit


def check_body_headers(length: str | None, encoding: str | None, media_type: str | None, *,
                       limit: int, accepted: tuple[str, ...]) -> None:
    """Refuse a body by its headers, before any of it is read: TooLarge or UnsupportedMedia.

    413: ``Content-Length`` announces more than ``limit`` bytes. 415: a body is announced
    (a ``Content-Length`` other than 0, or a ``Transfer-Encoding``) and its
    ``Content-Type`` is none of ``accepted`` (parameters such as ``; charset=utf-8``
    aside, in any case), or it has none: the API never guesses what a body is. A
    request without a body needs no Content-Type.
    """
    if announces_over(length, limit):
        raise TooLarge(f"body larger than {limit} bytes")
    if encoding is None and (length is None or declared_length(length) == 0):
        return
    if media_type is None:
        raise UnsupportedMedia(f"a body without a Content-Type: send {' or '.join(accepted)}")
    if media_type.partition(";")[0].strip().lower() not in accepted:
        raise UnsupportedMedia(f"unsupported media type {media_type[:100]!r}: send "
                               f"{' or '.join(accepted)}")


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


REPORTS_PATH = "/api/v1/reports"


class ReportGate:
    """Who may report, how large a report may be, and the answer to one: one copy of it.

    Used by the ASGI handler (``ControllerApp``) and by uvicorn's protocol for the
    reports' lane (:mod:`sn_monitor.controller.api.report_lane`), which bypasses ASGI.
    With ``certificates`` (the server verifies client certificates) a report may come
    with a token, a client certificate or both, as ``agent_auth`` says
    (:mod:`sn_monitor.controller.security.peer_identity`).
    """

    def __init__(self, controller: ControllerApi, tokens: TokenBook | None,
                 max_body_bytes: int, *, certificates: bool = False,
                 agent_auth: AgentAuth = "either") -> None:
        self._controller = controller
        self._tokens = tokens
        self.max_body_bytes = max_body_bytes
        self.certificates = certificates
        self._agent_auth = agent_auth

    def admit(self, headers: dict[bytes, bytes],
              certificate: ClientCertificate | None = None) -> Identity:
        """Check the headers and client certificate; Unauthenticated, Forbidden, 413, 415.

        Runs before the body is read. ``certificate`` is the connection's verified client
        certificate, if any.
        """
        identity = OPEN_ACCESS
        if self.certificates:
            authorization = headers.get(b"authorization")
            identity = report_identity(
                self._tokens, authorization.decode("latin-1") if authorization else None,
                certificate, self._agent_auth)
        elif self._tokens is not None:
            found = self._tokens.identify(headers.get(b"authorization", b"").decode("latin-1"))
            if found is None:
                raise Unauthenticated("missing or unknown bearer token")
            if not found.at_least("agent"):
                raise Forbidden(f"{found.name} ({found.role}) may not report")
            identity = found
        check_body_headers(_latin1(headers.get(b"content-length")),
                           _latin1(headers.get(b"transfer-encoding")),
                           _latin1(headers.get(b"content-type")),
                           limit=self.max_body_bytes, accepted=JSON_MEDIA)
        return identity

    def announces_too_much(self, headers: dict[bytes, bytes]) -> bool:
        """Whether ``headers`` announce a body over the limit (one never to be read)."""
        return announces_over(_latin1(headers.get(b"content-length")), self.max_body_bytes)

    def answer(self, identity: Identity, body: bytes, peer: str | None
               ) -> tuple[int, bytes] | PendingReply:
        """Ingest one report: (HTTP status, JSON body), or the reply its events wait for.

        A :class:`PendingReply` is answered once its ``written`` future is done
        (:meth:`answer_when_written`), and nothing behind it on the connection before.
        """
        try:
            reply = self.ingest(identity, body, peer)
        except ControllerError as err:
            return status_of(err), self.error_body(err.message)
        if isinstance(reply, PendingReply):
            return reply
        return 200, _encoder.encode(reply)

    def ingest(self, identity: Identity, body: bytes, peer: str | None
               ) -> ReportReply | PendingReply:
        """Ingest one report; ControllerError if refused (the stream answers it itself)."""
        return self._controller.ingest(body, identity, peer)

    @staticmethod
    def answer_when_written(pending: PendingReply) -> ASGIApp:
        """An ASGI app that answers ``pending`` once its report's events are written."""
        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            await asyncio.wrap_future(pending.written)
            await _send_report_answer(send, 200, _encoder.encode(pending.reply()))
        return answer

    @staticmethod
    def error_body(message: str) -> bytes:
        return _encoder.encode({"error": message})


class ControllerApp:
    """The ASGI app: the reports' hot path, then Starlette's router for the rest."""

    def __init__(self, reports: ASGIApp, router: Starlette, gate: ReportGate) -> None:
        self._reports = reports
        self.router = router
        self.routes = router.routes
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] == REPORTS_PATH
                and scope["method"] == "POST"):
            await self._reports(scope, receive, send)
        else:
            await self.router(scope, receive, send)


def build_app(
    controller: ControllerApi,
    tokens: TokenBook | None,
    max_body_bytes: int = 1 << 20,
    *,
    certificates: bool = False,
    agent_auth: AgentAuth = "either",
) -> ControllerApp:
    """The ASGI app; ``tokens`` None means no authentication (development only).

    ``certificates``: the server verifies client certificates, which may then identify
    agents on the reports' route (see :class:`ReportGate`).

    ``POST /api/v1/reports`` — thousands a second — is answered by a bare ASGI handler
    in front of Starlette's router (no Request/Response objects on the hot path); the
    rest of the API is ordinary Starlette routes.
    """
    router = _build_router(controller, tokens, max_body_bytes)
    gate = ReportGate(controller, tokens, max_body_bytes, certificates=certificates,
                      agent_auth=agent_auth)

    async def reports(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            headers = dict(scope["headers"])
            # the lane protocol puts the connection's client certificate here
            certificate = scope.get("extensions", {}).get(SCOPE_EXTENSION, {}).get("certificate")
            identity = gate.admit(headers, certificate)
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > max_body_bytes:
                    raise TooLarge(f"body larger than {max_body_bytes} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            client = scope.get("client")
            answer = gate.answer(identity, b"".join(chunks), client[0] if client else None)
        except ControllerError as err:
            answer = status_of(err), gate.error_body(err.message)
        if isinstance(answer, PendingReply):
            await gate.answer_when_written(answer)(scope, receive, send)
            return
        await _send_report_answer(send, *answer)

    return ControllerApp(reports, router, gate)


async def _send_report_answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _build_router(
    controller: ControllerApi,
    tokens: TokenBook | None,
    max_body_bytes: int,
) -> Starlette:
    """Every route but the reports' hot path."""

    def identify(request: Request, role: Role) -> Identity:
        if tokens is None:
            return OPEN_ACCESS
        identity = tokens.identify(request.headers.get("authorization"))
        if identity is None:
            raise Unauthenticated("missing or unknown bearer token")
        if not identity.at_least(role):
            raise Forbidden(f"{identity.name} ({identity.role}) may not do this")
        return identity

    async def read_body(request: Request, *, shape: bool = True,
                        yaml_allowed: bool = False) -> bytes:
        """The body, within the size limit and, with ``shape``, the limits of bodies.py.

        JSON, or with ``yaml_allowed`` JSON or YAML, by its Content-Type (415 otherwise:
        :func:`check_body_headers`).
        """
        headers = request.headers
        check_body_headers(headers.get("content-length"), headers.get("transfer-encoding"),
                           headers.get("content-type"), limit=max_body_bytes,
                           accepted=JSON_OR_YAML_MEDIA if yaml_allowed else JSON_MEDIA)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise TooLarge(f"body larger than {max_body_bytes} bytes")
            chunks.append(chunk)
        body = b"".join(chunks)
        if shape:
            try:
                check_shape(body, yaml_allowed=yaml_allowed)
            except BodyRefused as err:
                raise Malformed(err.message) from None
        return body

    def guarded(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except ControllerError as err:
                return _refusal(err)
        return run

    @guarded
    async def post_report(request: Request) -> Response:
        identity = identify(request, "agent")
        body = await read_body(request, shape=False)  # decode_report refuses any shape
        reply = controller.ingest(body, identity, request.client.host if request.client else None)
        if isinstance(reply, PendingReply):
            await asyncio.wrap_future(reply.written)
            reply = reply.reply()
        return Response(_encoder.encode(reply), media_type="application/json")

    @guarded
    async def alertmanager(request: Request) -> Response:
        identity = identify(request, "operate")
        body = await read_body(request)
        return await json_off_loop(lambda: controller.ingest_alerts(body, identity.name))

    @guarded
    async def nodes(request: Request) -> Response:
        identify(request, "read")
        return await json_off_loop(lambda: {"nodes": controller.list_nodes()})

    @guarded
    async def node(request: Request) -> Response:
        identify(request, "read")
        name = request.path_params["name"]
        return await json_off_loop(lambda: _found(controller.get_node(name),
                                                  f"no node {name!r}"))

    def node_action(action: str) -> Handler:
        @guarded
        async def run(request: Request) -> Response:
            identity = identify(request, "operate")
            name = request.path_params["name"]
            body = await read_body(request)
            reason = "by hand"
            if body:
                try:
                    doc = msgspec.json.decode(body)
                except msgspec.DecodeError as err:
                    raise Malformed(f"malformed JSON: {err}") from None
                if not isinstance(doc, dict) or not isinstance(doc.get("reason", ""), str):
                    raise Invalid("expected {\"reason\": \"...\"}")
                reason = doc.get("reason") or reason
            if await off_loop(controller.get_node, name) is None:
                raise NotFound(f"no node {name!r}")
            return await json_off_loop(
                lambda: controller.manual_action(action, name, identity.name, reason), 202)
        return run

    def _limit(request: Request) -> int:
        limit = _whole_number(request.query_params.get("limit", "100"))
        if limit is None or not 0 < limit <= 1000:
            raise Invalid("limit must be a whole number from 1 to 1000")
        return limit

    def only_query(request: Request, *known: str) -> None:
        """Refuse a query parameter the route does not take (422, naming it).

        A misspelt filter (``?stat=open``) would otherwise be ignored, and the answer
        would look like one to the question asked.
        """
        for name in request.query_params:
            if name not in known:
                raise Invalid(f"unknown query parameter {name!r} "
                                    f"(this route takes {', '.join(known)})")

    @guarded
    async def incidents(request: Request) -> Response:
        identify(request, "read")
        only_query(request, "status", "node", "limit")
        status = request.query_params.get("status")
        if status not in (None, "open", "closed"):
            raise Invalid("status must be open or closed")
        node, limit = request.query_params.get("node"), _limit(request)
        return await json_off_loop(
            lambda: {"incidents": controller.list_incidents(status, node, limit)})

    @guarded
    async def incident(request: Request) -> Response:
        identify(request, "read")
        raw = request.path_params["incident_id"]
        number = _whole_number(raw)
        if number is None or number > _MAX_ID:
            raise NotFound(f"no incident {raw!r}")
        return await json_off_loop(lambda: _found(controller.get_incident(number),
                                                  f"no incident {raw!r}"))

    @guarded
    async def actions(request: Request) -> Response:
        identify(request, "read")
        only_query(request, "node", "state", "limit")
        node, state, limit = (request.query_params.get("node"),
                              request.query_params.get("state"), _limit(request))
        return await json_off_loop(
            lambda: {"actions": controller.list_actions(node, state, limit)})

    @guarded
    async def events(request: Request) -> Response:
        identify(request, "read")
        only_query(request, "node", "kind", "limit")
        node, kind, limit = (request.query_params.get("node"),
                             request.query_params.get("kind"), _limit(request))
        return await json_off_loop(lambda: {"events": controller.list_events(node, kind, limit)})

    @guarded
    async def jobs(request: Request) -> Response:
        if request.method == "POST":
            identity = identify(request, "operate")
            body = await read_body(request, yaml_allowed=True)
            admin = identity.at_least("admin")
            return await json_off_loop(lambda: controller.add_job(body, identity.name, admin),
                                       201)
        identify(request, "read")
        return await json_off_loop(lambda: {"jobs": controller.list_jobs()})

    @guarded
    async def job(request: Request) -> Response:
        name = request.path_params["name"]
        if request.method == "DELETE":
            identity = identify(request, "operate")
            await off_loop(controller.delete_job, name, identity.name)
            return Response(status_code=204)
        identify(request, "read")
        return await json_off_loop(lambda: _found(controller.get_job(name), f"no job {name!r}"))

    @guarded
    async def job_progress(request: Request) -> Response:
        identify(request, "agent")
        body = await read_body(request)
        name = request.path_params["name"]
        return await json_off_loop(lambda: controller.job_progress(name, body))

    @guarded
    async def job_checkpoints(request: Request) -> Response:
        identify(request, "agent")
        body = await read_body(request)
        name = request.path_params["name"]
        return await json_off_loop(lambda: controller.job_checkpoint(name, body))

    @guarded
    async def restore_point(request: Request) -> Response:
        identify(request, "agent")
        name = request.path_params["name"]
        return await json_off_loop(lambda: _found(controller.restore_point(name),
                                                  "no complete checkpoint yet"))

    @guarded
    async def return_to_pool(request: Request) -> Response:
        identity = identify(request, "operate")
        name, node = request.path_params["name"], request.path_params["node"]
        return await json_off_loop(lambda: controller.return_to_pool(name, node, identity.name))

    @guarded
    async def recoveries(request: Request) -> Response:
        identify(request, "read")
        only_query(request, "job", "limit")
        job, limit = request.query_params.get("job"), _limit(request)
        return await json_off_loop(
            lambda: {"recoveries": controller.list_recoveries(job, limit)})

    @guarded
    async def repairs(request: Request) -> Response:
        identify(request, "read")
        only_query(request, "node", "limit")
        node, limit = request.query_params.get("node"), _limit(request)
        return await json_off_loop(lambda: {"repairs": controller.list_repairs(node, limit)})

    @guarded
    async def topology(request: Request) -> Response:
        identify(request, "read")
        only_query(request, "job")
        job = request.query_params.get("job")
        return await json_off_loop(lambda: controller.topology(job))

    async def topology_page(request: Request) -> Response:
        return HTMLResponse(_page("topology.html"), headers=_PAGE_HEADERS)

    async def home(request: Request) -> Response:
        # the controller's only page: a person who opens the bare address lands on it
        return RedirectResponse("/ui/topology", status_code=307)

    @guarded
    async def approve_recovery(request: Request) -> Response:
        identity = identify(request, "operate")
        recovery = request.path_params["recovery_id"]
        return await json_off_loop(lambda: controller.approve_recovery(recovery, identity.name))

    @guarded
    async def approve(request: Request) -> Response:
        identity = identify(request, "operate")
        action = request.path_params["action_id"]
        return await json_off_loop(lambda: controller.approve(action, identity.name))

    @guarded
    async def breaker(request: Request) -> Response:
        if request.method == "GET":
            identify(request, "read")
            return await json_off_loop(controller.breaker_state)
        identity = identify(request, "operate")
        body = await read_body(request)
        try:
            doc = msgspec.json.decode(body, type=BreakerChange)
        except msgspec.ValidationError as err:
            raise Invalid(f"invalid body: {err}") from None
        except msgspec.DecodeError as err:
            raise Malformed(f"malformed JSON: {err}") from None
        return await json_off_loop(lambda: controller.set_breaker(doc.open, identity.name,
                                                                  doc.reason))

    @guarded
    async def service_discovery(request: Request) -> Response:
        identify(request, "read")
        return await json_off_loop(controller.service_discovery)

    async def healthz(request: Request) -> Response:
        ok, body = controller.health()
        return _json(body, 200 if ok else 503)

    async def livez(request: Request) -> Response:
        # alive (do not restart me) even when not ready: a full disk is not cured by a
        # restart, and a standby is alive without being ready (ha/standby.py)
        return _json({"status": "alive", "role": "active"})

    async def metrics(request: Request) -> Response:
        return Response(await off_loop(controller.metrics),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    routes = [
        Route("/api/v1/reports", post_report, methods=["POST"]),
        Route("/api/v1/alertmanager", alertmanager, methods=["POST"]),
        Route("/api/v1/nodes", nodes, methods=["GET"]),
        Route("/api/v1/nodes/{name}", node, methods=["GET"]),
        Route("/api/v1/nodes/{name}/cordon", node_action("cordon"), methods=["POST"]),
        Route("/api/v1/nodes/{name}/uncordon", node_action("uncordon"), methods=["POST"]),
        Route("/api/v1/incidents", incidents, methods=["GET"]),
        Route("/api/v1/incidents/{incident_id}", incident, methods=["GET"]),
        Route("/api/v1/actions", actions, methods=["GET"]),
        Route("/api/v1/events", events, methods=["GET"]),
        Route("/api/v1/jobs", jobs, methods=["GET", "POST"]),
        Route("/api/v1/jobs/{name}", job, methods=["GET", "DELETE"]),
        Route("/api/v1/jobs/{name}/progress", job_progress, methods=["POST"]),
        Route("/api/v1/jobs/{name}/checkpoints", job_checkpoints, methods=["POST"]),
        Route("/api/v1/jobs/{name}/restore-point", restore_point, methods=["GET"]),
        Route("/api/v1/jobs/{name}/spares/{node}", return_to_pool, methods=["POST"]),
        Route("/api/v1/recoveries", recoveries, methods=["GET"]),
        Route("/api/v1/remediation", repairs, methods=["GET"]),
        Route("/api/v1/recoveries/{recovery_id}/approve", approve_recovery, methods=["POST"]),
        Route("/api/v1/actions/{action_id}/approve", approve, methods=["POST"]),
        Route("/api/v1/breaker", breaker, methods=["GET", "POST"]),
        Route("/api/v1/sd", service_discovery, methods=["GET"]),
        Route("/api/v1/topology", topology, methods=["GET"]),
        Route("/ui/topology", topology_page, methods=["GET"]),
        Route("/", home, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", healthz, methods=["GET"]),
        Route("/livez", livez, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        """Starlette's own refusals (no such route, method not allowed) as JSON too."""
        if not isinstance(exc, HTTPException):  # pragma: no cover - registered for it
            raise exc
        response = _error(exc.status_code, exc.detail)
        response.headers.update(exc.headers or {})
        return response

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


#: The controller's pages load nothing from elsewhere and talk only to the controller.
_PAGE_HEADERS: Final = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'"),
}


def _page(name: str) -> str:
    """A page of the controller's own UI (``sn_monitor/controller/api/ui``), packaged."""
    return (resources.files("sn_monitor.controller.api") / "ui" / name).read_text("utf-8")


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 for the v1 API; the report schemas come from the wire types themselves."""
    _, components = msgspec.json.schema_components([Report, ReportReply, ProgressBody,
                                                    CheckpointBody, BreakerChange,
                                                    *webhook_schema_types()],
                                                   ref_template="#/components/schemas/{name}")
    error = {"description": "error", "content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}}}}
    any_json = {"description": "ok",
                "content": {"application/json": {"schema": {"type": "object"}}}}

    def op(summary: str, responses: dict[str, Any], *, public: bool = False,
           **extra: Any) -> dict[str, Any]:
        if public:  # no token needed: probes and scrapers
            return {"summary": summary, "responses": responses, "security": [], **extra}
        # every authenticated route answers 401 (no or unknown token) and 403 (role)
        return {"summary": summary, "responses": {**responses, "401": error, "403": error},
                **extra}

    # Path parameters say what a name or an id looks like: anything else names nothing
    # (404), and the schema-driven fuzz (tests/integration/test_api_fuzz.py) tries it.
    node_name = {"type": "string", "minLength": 1, "maxLength": NODE_NAME_MAX_LENGTH,
                 "pattern": NODE_NAME_PATTERN}
    job_name = {"type": "string", "minLength": 1, "maxLength": 63,
                "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
    hex_id = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": r"^[0-9a-f]+$"}
    node_param = [{"name": "name", "in": "path", "required": True, "schema": node_name}]
    name_param = [{"name": "name", "in": "path", "required": True, "schema": job_name}]
    reason_body = {"required": False, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"reason": {"type": "string"}}}}}}
    # 202 whatever the policy said (the record's state tells); 503: no audit record possible
    by_hand = {"202": any_json, "400": error, "404": error, "413": error, "415": error,
               "422": error, "503": error}
    listing = [
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                    "maximum": 1000}},
        {"name": "node", "in": "query", "schema": {"type": "string"}},
    ]
    paths: dict[str, Any] = {
        "/api/v1/reports": {"post": op(
            "An agent's report; the reply carries commands",
            {"200": {"description": "stored", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/ReportReply"}}}},
             "400": error, "401": error, "403": error, "413": error, "415": error,
             "422": error},
            requestBody={"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Report"}}}},
            # an agent's token, or its client certificate (tls.agent_auth says which)
            security=[{"bearer": []}, {"mutualTLS": []}])},
        "/api/v1/alertmanager": {"post": op(
            "Alertmanager's webhook (operate role): alerts that alert rules match open and "
            "resolve incidents, acted on through the safety policy",
            {"200": {"description": "applied", "content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "accepted": {"type": "integer"}, "skipped": {"type": "integer"},
                    "unmatched": {"type": "integer"}, "findings": {"type": "integer"},
                    "by": {"type": "string"}},
                "required": ["accepted", "skipped", "unmatched", "findings", "by"]}}}},
             "400": error, "413": error, "415": error},
            requestBody={"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/WebhookPayload"}}}})},
        "/api/v1/nodes": {"get": op("Every node", {"200": any_json})},
        "/api/v1/nodes/{name}": {"get": op("One node", {"200": any_json, "404": error},
                                           parameters=node_param)},
        "/api/v1/nodes/{name}/cordon": {"post": op(
            "Cordon a node by hand (through the safety policy)", by_hand,
            parameters=node_param, requestBody=reason_body)},
        "/api/v1/nodes/{name}/uncordon": {"post": op(
            "Uncordon a node sn-monitor cordoned", by_hand,
            parameters=node_param, requestBody=reason_body)},
        "/api/v1/incidents": {"get": op("Incidents", {"200": any_json, "422": error},
                                        parameters=[*listing, {
                                            "name": "status", "in": "query",
                                            "schema": {"enum": ["open", "closed"]}}])},
        "/api/v1/incidents/{incident_id}": {"get": op(
            "One incident with its actions", {"200": any_json, "404": error},
            parameters=[{"name": "incident_id", "in": "path", "required": True,
                         "schema": {"type": "integer"}}])},
        "/api/v1/actions": {"get": op("The audit trail of actions",
                                      {"200": any_json, "422": error},
                                      parameters=[*listing, {"name": "state", "in": "query",
                                                             "schema": {"type": "string"}}])},
        "/api/v1/events": {"get": op("Events the agents reported (XIDs, GPU lost, guard)",
                                     {"200": any_json, "422": error},
                                     parameters=[*listing, {"name": "kind", "in": "query",
                                                            "schema": {"type": "string"}}])},
        "/api/v1/jobs": {
            "get": op("Every DistributedJob with its state", {"200": any_json}),
            "post": op("Add or replace a DistributedJob (JSON, or YAML: application/yaml, "
                       "application/x-yaml or text/yaml)",
                       {"201": any_json, "400": error, "413": error, "415": error,
                        "422": error, "409": error},
                       requestBody={"required": True, "content": {
                           "application/json": {"schema": {"type": "object"}},
                           "application/yaml": {"schema": {"type": "string"}}}})},
        "/api/v1/jobs/{name}": {
            "get": op("One job with its recent recoveries", {"200": any_json, "404": error,},
                      parameters=name_param),
            "delete": op("Stop managing a job", {"204": {"description": "removed"},
                                                 "404": error},
                         parameters=name_param)},
        "/api/v1/jobs/{name}/progress": {"post": op(
            "A rank's progress (the training client, batched); the reply asks for "
            "checkpoints and carries restores",
            {"200": any_json, "400": error, "404": error, "413": error, "415": error,
             "422": error},
            parameters=name_param, requestBody={"required": True, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ProgressBody"}}}})},
        "/api/v1/jobs/{name}/checkpoints": {"post": op(
            "A checkpoint the job saved (verified before it counts)",
            {"200": any_json, "400": error, "404": error, "413": error, "415": error,
             "422": error},
            parameters=name_param, requestBody={"required": True, "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/CheckpointBody"}}}})},
        "/api/v1/jobs/{name}/restore-point": {"get": op(
            "The latest complete checkpoint to resume from", {"200": any_json, "404": error},
            parameters=name_param)},
        "/api/v1/jobs/{name}/spares/{node}": {"post": op(
            "Return a repaired node to the job's spare pool",
            {"200": any_json, "404": error, "409": error},
            parameters=[*name_param, {"name": "node", "in": "path", "required": True,
                                     "schema": node_name}])},
        "/api/v1/recoveries": {"get": op(
            "Job recoveries, newest first", {"200": any_json, "422": error},
            parameters=[{"name": "job", "in": "query", "schema": {"type": "string"}},
                        listing[0]])},
        "/api/v1/remediation": {"get": op(
            "Remediation ladders (reset, reboot, replace; each verified), newest first",
            {"200": any_json, "422": error},
            parameters=listing)},
        "/api/v1/recoveries/{recovery_id}/approve": {"post": op(
            "Approve a manual recovery", {"200": any_json, "404": error, "409": error},
            parameters=[{"name": "recovery_id", "in": "path", "required": True,
                         "schema": hex_id}])},
        "/api/v1/actions/{action_id}/approve": {"post": op(
            "Approve an action waiting for approval", {"200": any_json, "404": error,
                                                        "409": error},
            parameters=[{"name": "action_id", "in": "path", "required": True,
                         "schema": hex_id}])},
        "/api/v1/breaker": {
            "get": op("The circuit breaker: open or closed, why, since and until when, the "
                      "nodes it counted", {"200": any_json}),
            "post": op("Close the breaker by hand (evictions go on) or open it (they freeze "
                       "for its hold); audited (operate role)",
                       {"200": any_json, "400": error, "413": error, "415": error,
                        "422": error, "503": error},
                       requestBody={"required": True, "content": {"application/json": {
                           "schema": {"$ref": "#/components/schemas/BreakerChange"}}}})},
        "/api/v1/topology": {"get": op(
            "The fleet graph: supernodes, racks, nodes (GPUs, NICs, NVLink peers, PCIe "
            "affinity), rails, live link rates and health, jobs and fail-slow bottlenecks",
            {"200": any_json, "422": error},
            parameters=[{"name": "job", "in": "query", "schema": {"type": "string"}}])},
        "/ui/topology": {"get": op(
            "The topology page (HTML; it reads /api/v1/topology with the token in its "
            "URL's #token=)",
            {"200": {"description": "the page", "content": {"text/html": {
                "schema": {"type": "string"}}}}}, public=True)},
        "/": {"get": op("Redirects to the topology page", {"307": {
            "description": "to /ui/topology"}}, public=True)},
        "/api/v1/sd": {"get": op("Prometheus HTTP service discovery of every agent",
                                 {"200": {"description": "targets", "content": {
                                     "application/json": {"schema": {"type": "array"}}}}})},
        "/healthz": {"get": op("Ready to take reports and act (the same as /readyz)",
                               {"200": any_json, "503": any_json}, public=True)},
        "/readyz": {"get": op("Ready: the active controller, its store taking writes "
                              "(503 on a standby or while the store refuses writes)",
                              {"200": any_json, "503": any_json}, public=True)},
        "/livez": {"get": op("Alive (a standby is alive too)", {"200": any_json},
                             public=True)},
        "/metrics": {"get": op("Prometheus metrics", {"200": {
            "description": "text exposition", "content": {"text/plain": {
                "schema": {"type": "string"}}}}}, public=True)},
        "/openapi.json": {"get": op("This document", {"200": any_json}, public=True)},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "sn-monitor controller", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "mutualTLS": {"type": "mutualTLS", "description": (
                    "A client certificate from tls.client_ca_file; its one DNS name (else "
                    "its CN) is the only node it may report for")},
            },
        },
        "security": [{"bearer": []}],
    }
