"""Every API the topology page reads answers its token, which has role ``read``.

The paths are taken from the page itself (each ``"../api/v1/..."`` in its script), so a
panel added later that reads a route an operator's token needs is caught here.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.api import make_api

PAGE = Path(__file__).resolve().parents[2] / "sn_monitor/controller/api/ui/topology.html"


def page_reads() -> list[str]:
    """The API paths (with their query) the page's script reads."""
    return sorted(set(re.findall(r'"\.\./(api/v1/[^"]+)"', PAGE.read_text(encoding="utf-8"))))


def test_the_page_reads_the_incidents_actions_jobs_recoveries_breaker_and_topology() -> None:
    # the overview of every node, and the topology document of the few nodes in view
    paths = {p.split("?")[0] for p in page_reads()}
    assert paths == {"api/v1/topology", "api/v1/topology/overview", "api/v1/incidents",
                     "api/v1/actions", "api/v1/jobs", "api/v1/recoveries", "api/v1/breaker"}


def test_each_read_answers_a_read_token(tmp_path: Path) -> None:
    api, _ = make_api(tmp_path)
    for path in page_reads():
        reply = api.get(f"/{path}")  # the read role's token
        assert reply.status_code == 200, (path, reply.status_code, reply.text)
        assert api.client.get(f"/{path}").status_code == 401, path
