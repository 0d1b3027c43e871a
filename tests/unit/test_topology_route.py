"""``GET /ui/topology``: the page from the package, without a token, never cached, and
loading nothing from anywhere but the controller."""

from __future__ import annotations

from pathlib import Path

from tests.support.api import make_api

PAGE = Path(__file__).resolve().parents[2] / "sn_monitor/controller/api/ui/topology.html"


def test_the_page_is_served_without_a_token_and_not_cached(tmp_path: Path) -> None:
    api, _ = make_api(tmp_path)
    reply = api.client.get("/ui/topology")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/html")
    assert reply.headers["cache-control"] == "no-store"
    assert "connect-src 'self'" in reply.headers["content-security-policy"]
    assert reply.content == PAGE.read_bytes()
    # the data it draws still needs a token
    assert api.client.get("/api/v1/nodes").status_code == 401


def test_the_bare_address_redirects_to_the_page_without_a_token(tmp_path: Path) -> None:
    api, _ = make_api(tmp_path)
    reply = api.client.get("/", follow_redirects=False)
    assert reply.status_code == 307
    assert reply.headers["location"] == "/ui/topology"
    followed = api.client.get("/")
    assert followed.status_code == 200
    assert followed.content == PAGE.read_bytes()


def test_the_page_loads_nothing_from_elsewhere() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert 'data-app="sn-topology"' in page
    for outside in ("http://", "https://", "//cdn", "<script src", "<link rel=\"stylesheet"):
        assert outside not in page.replace('xmlns="http://www.w3.org/2000/svg"', ""), outside
    assert "../api/v1/topology" in page
