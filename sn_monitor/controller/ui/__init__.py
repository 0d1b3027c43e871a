"""The pages the controller serves itself: plain HTML and inline JavaScript, no build step.

They read the controller's JSON API from the browser (a bearer token, when one is needed,
comes from the page URL's ``#token=`` fragment) and fetch nothing from elsewhere: the
Content-Security-Policy they are served with allows only the controller itself.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

#: What the pages may load: their own inline script and style, the controller's API.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


@cache
def topology_page() -> bytes:
    """``topology.html`` from the installed package (read once)."""
    return files(__name__).joinpath("topology.html").read_bytes()
