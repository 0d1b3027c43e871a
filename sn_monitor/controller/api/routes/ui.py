"""The controller's own page (``sn_monitor/controller/api/ui``) and the redirect to it."""

from __future__ import annotations

from importlib import resources
from typing import Final

from starlette.responses import HTMLResponse, RedirectResponse, Response

from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation

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


async def topology_page(call: Call) -> Response:
    del call  # the page asks for everything itself
    return HTMLResponse(_page("topology.html"), headers=_PAGE_HEADERS)


async def home(call: Call) -> Response:
    del call
    # the controller's only page: a person who opens the bare address lands on it
    return RedirectResponse("/ui/topology", status_code=307)


ENDPOINTS = (
    Endpoint("GET", "/ui/topology", None, topology_page, Operation(
        "The topology page (HTML; it reads /api/v1/topology with the token in its URL's "
        "#token=)",
        {"200": {"description": "the page", "content": {"text/html": {
            "schema": {"type": "string"}}}}})),
    Endpoint("GET", "/", None, home, Operation(
        "Redirects to the topology page", {"307": {"description": "to /ui/topology"}})),
)
