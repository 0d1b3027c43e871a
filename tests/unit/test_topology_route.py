"""``GET /ui/topology``: the page from the package, without a token, never cached, and
allowed to reach nothing but the controller."""

from __future__ import annotations

from pathlib import Path

from sn_monitor.controller.ui import topology_page
from tests.unit.test_controller_api import make_api


def test_the_page_is_served_without_a_token_and_not_cached(tmp_path: Path) -> None:
    api, _ = make_api(tmp_path)
    reply = api.client.get("/ui/topology")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/html")
    assert reply.headers["cache-control"] == "no-store"
    policy = reply.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "connect-src 'self'" in policy
    assert reply.content == topology_page()
    # the data it draws still needs a token
    assert api.client.get("/api/v1/nodes").status_code == 401


def test_the_page_loads_nothing_from_elsewhere() -> None:
    page = topology_page().decode()
    assert 'data-app="sn-topology"' in page
    for outside in ("http://", "https://", "//cdn", "<script src", "<link rel=\"stylesheet"):
        assert outside not in page.replace('xmlns="http://www.w3.org/2000/svg"', ""), outside
    assert "../api/v1/topology" in page
