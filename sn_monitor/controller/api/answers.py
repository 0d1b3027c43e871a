"""How a route answers: JSON bodies, refusals, and where a handler's work runs.

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

An answer the controller keeps encoded (an :class:`~.topology_desk.Edition`: the
topology, built once for every viewer) is sent as the request asks
(:func:`edition_answer`): ``304 Not Modified`` with no body when ``If-None-Match`` names
its entity tag, its gzip (made once, with it) when ``Accept-Encoding`` takes gzip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.responses import Response

from sn_monitor.controller.api.statuses import error_headers, status_of
from sn_monitor.controller.errors import ControllerError, NotFound
from sn_monitor.controller.service.topology_desk import Edition

_encoder = msgspec.json.Encoder()

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


def json_answer(data: Any, status: int = 200) -> Response:
    """``data`` as JSON, encoded here (on the loop: only for small answers)."""
    return Response(_encoder.encode(data), status_code=status, media_type="application/json")


def error_answer(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """``{"error": message}`` with ``status`` (and ``headers``)."""
    response = json_answer({"error": message}, status)
    response.headers.update(headers or {})
    return response


def refusal(err: ControllerError) -> Response:
    """The answer to a domain error: its status (STATUS_OF), message and headers."""
    return error_answer(status_of(err), err.message, error_headers(err))


def found(doc: _T | None, missing: str) -> _T:
    """``doc``, or NotFound saying ``missing`` when there is none."""
    if doc is None:
        raise NotFound(missing)
    return doc


def edition_answer(headers: Headers, edition: Edition) -> Response:
    """``edition`` as the request's ``headers`` ask (module docstring); in the thread pool.

    ``Vary: Accept-Encoding`` on every answer, so that a cache keeps the two bodies apart.
    """
    tags = {"ETag": edition.etag, "Vary": "Accept-Encoding"}
    held = _entity_tags(headers.get("if-none-match", ""))
    if edition.etag in held or "*" in held:
        return Response(status_code=304, headers=tags)
    if _takes_gzip(headers.get("accept-encoding", "")):
        return Response(edition.gzipped(), media_type="application/json",
                        headers={**tags, "Content-Encoding": "gzip"})
    return Response(edition.body, media_type="application/json", headers=tags)


def _entity_tags(value: str) -> set[str]:
    """The tags an ``If-None-Match`` names (weakly compared: ``W/`` dropped)."""
    return {tag.strip().removeprefix("W/") for tag in value.split(",") if tag.strip()}


def _takes_gzip(value: str) -> bool:
    """Whether an ``Accept-Encoding`` takes gzip (named, or ``*``, with a q above 0)."""
    for item in value.split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() not in ("gzip", "*"):
            continue
        q = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
        try:
            return float(q) > 0
        except ValueError:
            return False
    return False
