"""The topology's answers at fleet size: shared builds, versions, ETag/304, gzip, ``since``.

Against the real controller behind the HTTP app (``make_api``), and the desk alone with
a source of inputs that a test holds, to count builds.
"""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.fabric.view import FabricScope, FleetFabric
from sn_monitor.controller.jobs.spec import job_from_json
from sn_monitor.controller.service.topology_desk import TopologyDesk
from sn_monitor.model import (
    GpuReport,
    IbPortReport,
    NicPortTopology,
    NicTopology,
    NodeTopology,
    Report,
    topology_digest,
)
from sn_monitor.rules.view import NodeView
from tests.support.api import AGENT, READ, Api, bearer

TOPOLOGY = NodeTopology(nics=[
    NicTopology(device=f"mlx5_{i}", role="rail", rail=i,
                ports=[NicPortTopology(port=1, guid=f"0000:0000:0000:000{i}",
                                       link_layer="InfiniBand", rate_bytes_per_second=5e10)])
    for i in range(2)])
DIGEST = topology_digest(TOPOLOGY)
LETTER = {"ok": "o", "degraded": "d", "failed": "f", "unknown": "u"}
PLAIN = {"Accept-Encoding": "identity"}


def send(api: Api, node: str, seq: int, *, down: int | None = None,
         gpus: list[GpuReport] | None = None, rack: str = "r1", rate: float = 5e10) -> None:
    """A report of ``node`` (its rail ``down`` not ACTIVE), carrying its topology."""
    report = Report(
        node=node, instance="i", sequence=seq, sample_time_seconds=api.h.clock.time(),
        labels={"supernode": "sn0", "rack": rack}, topology_digest=DIGEST, topology=TOPOLOGY,
        gpus=gpus or [], infiniband=[
            IbPortReport(device=f"mlx5_{i}", port=1, state=1 if i == down else 4,
                         rate_bytes_per_second=rate, counters={"transmitted_bytes": seq})
            for i in range(2)])
    answer = api.client.post("/api/v1/reports", content=msgspec.json.encode(report),
                             headers=bearer(AGENT))
    assert answer.status_code == 200, answer.text


def read(api: Api, path: str, **headers: str) -> Any:
    """``path`` read with a read token, plainly unless ``headers`` say otherwise."""
    return api.client.get(path, headers={**bearer(READ), **PLAIN, **headers})


def overview(api: Api, query: str = "", **headers: str) -> Any:
    return read(api, f"/api/v1/topology/overview{query}", **headers)


def rows_of(doc: dict[str, Any]) -> dict[str, list[Any]]:
    return {row[0]: row for row in doc["nodes"]}


def test_an_unchanged_overview_keeps_its_version_and_answers_304(api: Api) -> None:
    send(api, "gpu-1", 1)
    first = overview(api)
    assert first.status_code == 200
    etag = first.headers["etag"]
    assert etag == f'"{first.json()["version"]}"'
    api.h.clock.advance(5.0)
    send(api, "gpu-1", 2)  # new counters, the same health
    again = overview(api, **{"If-None-Match": etag})
    assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag)

    send(api, "gpu-1", 3, down=1)
    api.h.clock.advance(1.0)
    moved = overview(api, **{"If-None-Match": etag})
    assert moved.status_code == 200
    assert moved.json()["version"] == first.json()["version"] + 1
    assert moved.headers["etag"] != etag


def test_the_document_answers_304_to_its_own_tag(api: Api) -> None:
    send(api, "gpu-1", 1)
    tag = read(api, "/api/v1/topology").headers["etag"]
    assert read(api, "/api/v1/topology", **{"If-None-Match": tag}).status_code == 304
    assert read(api, "/api/v1/topology", **{"If-None-Match": f'"x", W/{tag}'}
                ).status_code == 304
    assert read(api, "/api/v1/topology?job=llm", **{"If-None-Match": tag}
                ).status_code == 200  # another filter, another tag


@pytest.mark.parametrize("path", ["/api/v1/topology", "/api/v1/topology/overview"])
def test_gzip_when_asked_the_same_document(api: Api, path: str) -> None:
    send(api, "gpu-1", 1)
    send(api, "gpu-2", 1, down=0)
    plain = read(api, path)
    assert "content-encoding" not in plain.headers
    squeezed = api.client.stream("GET", path, headers={**bearer(READ),
                                                       "Accept-Encoding": "gzip"})
    with squeezed as answer:
        assert answer.headers["content-encoding"] == "gzip"
        assert answer.headers["vary"] == "Accept-Encoding"
        raw = b"".join(answer.iter_raw())
    assert gzip.decompress(raw) == plain.content
    refused = read(api, path, **{"Accept-Encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in refused.headers


def test_since_answers_only_the_rows_that_changed(api: Api) -> None:
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        send(api, node, 1)
    held = overview(api).json()
    assert held["full"] is True
    assert len(held["nodes"]) == 3
    send(api, "gpu-2", 2, down=0)
    api.h.clock.advance(1.0)
    update = overview(api, f"?since={held['version']}").json()
    assert (update["full"], update["since"], update["removed"]) == (False, held["version"], [])
    assert [row[0] for row in update["nodes"]] == ["gpu-2"]
    assert update["nodes"][0][3] == "degraded"
    assert update["nodes"][0][6] == "fo"
    assert update["counts"] == {"ok": 2, "degraded": 1, "failed": 0, "unknown": 0}
    assert update["rails"] == {"0": "degraded", "1": "ok"}
    unchanged = overview(api, f"?since={update['version']}").json()
    assert (unchanged["full"], unchanged["nodes"]) == (False, [])


def test_since_a_version_no_longer_kept_answers_the_whole(api: Api) -> None:
    send(api, "gpu-1", 1)
    oldest = overview(api).json()["version"]
    for seq in range(2, 12):  # ten changes: more versions than are kept
        send(api, "gpu-1", seq, down=seq % 2)
        api.h.clock.advance(1.0)
        overview(api)
    whole = overview(api, f"?since={oldest}").json()
    assert (whole["full"], len(whole["nodes"])) == (True, 1)
    assert overview(api, f"?since={oldest - 1}").json()["full"] is True
    assert overview(api, "?since=-1").status_code == 422
    assert overview(api, "?sense=1").status_code == 422


def test_the_overview_agrees_with_the_document(api: Api) -> None:
    send(api, "gpu-1", 1)
    send(api, "gpu-2", 1, down=1, rack="r2")
    send(api, "gpu-3", 1, gpus=[GpuReport(index=0, uuid="u0"),
                                GpuReport(index=1, uuid="u1", lost=True)])
    doc = read(api, "/api/v1/topology").json()
    rows = rows_of(overview(api).json())
    assert set(rows) == set(doc["nodes"])
    for name, part in doc["nodes"].items():
        gpus = "".join(LETTER[g["health"]] for g in part["gpus"])
        rails = "".join(LETTER[p["health"]] for n in part["nics"] if n["rail"] is not None
                        for p in n["ports"])
        assert rows[name][1:7] == [part["supernode"], part["rack"], part["health"],
                                   part["state"], gpus, rails], name
    assert [rows[n][3] for n in sorted(rows)] == ["ok", "degraded", "degraded"]
    assert [rows[n][5:7] for n in sorted(rows)] == [["", "oo"], ["", "of"], ["of", "oo"]]
    assert {str(r["rail"]): r["health"] for r in doc["rails"]} == overview(api).json()["rails"]


# ---------------------------------------------------------------- the desk alone


class HeldFabric:
    """A source of inputs that holds the first build until the test lets it go."""

    def __init__(self) -> None:
        self.building = threading.Event()
        self.go = threading.Event()
        self.builds = 0

    def __call__(self) -> FleetFabric:
        self.builds += 1
        self.building.set()
        assert self.go.wait(30), "the test never let the build go"
        return FleetFabric(now=0.0, views={}, states={}, incidents=[], wirings={},
                           readings={}, jobs=[], fail_slow=[])


@pytest.mark.parametrize("kind", ["document", "overview"])
def test_requests_that_meet_a_build_wait_for_it_and_share_it(kind: str) -> None:
    clock = ManualClock()
    fabric = HeldFabric()
    desk = TopologyDesk(fabric, clock, cpu_clock=clock.monotonic)
    read = getattr(desk, kind)
    answers: list[Any] = []
    readers = [threading.Thread(target=lambda: answers.append(read()), name=f"reader-{i}")
               for i in range(2)]
    readers[0].start()
    assert fabric.building.wait(30)
    readers[1].start()
    fabric.go.set()
    for reader in readers:
        reader.join(30)
    assert len(answers) == 2
    assert answers[0] is answers[1]
    assert (fabric.builds, desk.builds) == (1, 1)
    assert answers[0].gzipped() is answers[1].gzipped()  # compressed once

    read()
    assert desk.builds == 1  # within the period: the same build
    clock.advance(1.0)
    assert read() is answers[0]  # built again, the same content: the same answer
    assert desk.settle(30)
    assert desk.builds == 2


class ChangingFabric:
    """A fleet whose one node is seen ``reported`` times; a build waits on ``go`` once
    ``hold`` is set."""

    def __init__(self) -> None:
        self.hold = False
        self.building, self.go = threading.Event(), threading.Event()
        self.builds = 0

    def __call__(self) -> FleetFabric:
        self.builds += 1
        if self.hold:
            self.building.set()
            assert self.go.wait(30), "the test never let the build go"
        view = NodeView(name=f"gpu-{self.builds}", labels={}, received_monotonic=0.0,
                        received_wall=0.0)
        return FleetFabric(now=0.0, views={view.name: view}, states={}, incidents=[],
                           wirings={}, readings={}, jobs=[], fail_slow=[])


@pytest.mark.parametrize("kind", ["document", "overview"])
def test_a_read_never_waits_for_a_rebuild_it_starts_the_next_read_gets_it(kind: str) -> None:
    clock = ManualClock()
    fabric = ChangingFabric()
    # wait_under=0: every build counts as slow (as at 8,192 nodes), none is waited for
    desk = TopologyDesk(fabric, clock, cpu_clock=clock.monotonic, wait_under=0.0)
    read = getattr(desk, kind)
    first = read()
    clock.advance(1.0)
    fabric.hold = True
    assert read() is first  # answered at once, the build held meanwhile
    assert fabric.building.wait(30)
    assert read() is first  # one build at a time: none started while one is under way
    fabric.go.set()
    assert desk.settle(30)
    assert fabric.builds == 2
    later = read()
    assert later is not first
    assert b"gpu-2" in later.body


def test_a_slow_build_spaces_the_next_ones() -> None:
    clock = ManualClock()

    def slow() -> FleetFabric:
        clock.advance(3.0)  # a 3 s build: the next one no sooner than 30 s after it began
        return FleetFabric(now=0.0, views={}, states={}, incidents=[], wirings={},
                           readings={}, jobs=[], fail_slow=[])

    desk = TopologyDesk(slow, clock, busy_share=0.1, cpu_clock=clock.monotonic)
    desk.overview()
    clock.advance(26.0)
    desk.overview()
    assert desk.builds == 1
    clock.advance(1.0)
    desk.overview()
    assert desk.builds == 2


def test_a_job_filter_keeps_the_jobs_nodes_and_its_own_tag(api: Api, tmp_path: Path) -> None:
    doc = {"apiVersion": "training.ai/v1", "kind": "DistributedJob",
           "metadata": {"name": "llm"},
           "spec": {"replicas": 2, "nodes": ["gpu-1", "gpu-2"],
                    "checkpoint": {"dir": str(tmp_path / "ckpt")}}}
    api.h.controller.jobs.add_job(job_from_json(json.dumps(doc).encode()), "test")
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        send(api, node, 1)
    whole = overview(api)
    of_job = overview(api, "?job=llm")
    assert {r[0]: r[7] for r in whole.json()["nodes"]} == {
        "gpu-1": "llm", "gpu-2": "llm", "gpu-3": None}
    assert [r[0] for r in of_job.json()["nodes"]] == ["gpu-1", "gpu-2"]
    assert of_job.json()["counts"]["ok"] == 2
    assert of_job.headers["etag"] != whole.headers["etag"]
    assert overview(api, "?job=llm", **{"If-None-Match": of_job.headers["etag"]}
                    ).status_code == 304


def test_a_scope_narrows_the_document_to_a_rack_judged_as_in_the_whole(api: Api) -> None:
    send(api, "gpu-1", 1, rack="r1", down=0)
    send(api, "gpu-2", 1, rack="r2")
    whole = read(api, "/api/v1/topology").json()
    rack = read(api, "/api/v1/topology?supernode=sn0&rack=r1")
    assert rack.status_code == 200
    doc = rack.json()
    assert doc["scope"] == {"supernode": "sn0", "rack": "r1"}
    assert list(doc["nodes"]) == ["gpu-1"]
    assert doc["nodes"]["gpu-1"] == whole["nodes"]["gpu-1"]
    assert doc["supernodes"] == [{"name": "sn0", "racks": [{"name": "r1", "nodes": ["gpu-1"]}]}]
    assert {p["node"] for r in doc["rails"] for p in r["ports"]} == {"gpu-1"}
    assert read(api, "/api/v1/topology?rack=r2").json()["nodes"].keys() == {"gpu-2"}
    assert read(api, "/api/v1/topology?supernode=sn9").json()["nodes"] == {}
    assert rack.headers["etag"] != read(api, "/api/v1/topology").headers["etag"]
    assert read(api, "/api/v1/topology?supernode=sn0&rack=r1",
                **{"If-None-Match": rack.headers["etag"]}).status_code == 304


def test_a_rack_reads_the_rates_of_its_own_nodes_and_the_rails_best_of_all(api: Api) -> None:
    send(api, "gpu-1", 1, rack="r1")
    send(api, "gpu-2", 1, rack="r2", rate=1e11)  # rail 0 and 1's best: in another rack
    scoped = api.h.controller.job_health.fabric(scope=FabricScope(rack="r1"))
    meter = api.h.controller.fabric.finder.meter
    assert scoped.readings["gpu-1"] is meter.values("gpu-1")
    assert scoped.readings["gpu-2"] is meter.health("gpu-2")  # no rates: not drawn
    whole = read(api, "/api/v1/topology").json()
    rack = read(api, "/api/v1/topology?rack=r1").json()
    assert rack["nodes"]["gpu-1"] == whole["nodes"]["gpu-1"]
    ports = [p for nic in rack["nodes"]["gpu-1"]["nics"] for p in nic["ports"]]
    assert {p["health"] for p in ports} == {"degraded"}  # slower than the rail's best
    assert {p["max_rate_bytes_per_second"] for p in ports} == {1e11}


def test_the_overview_carries_the_bottlenecks_and_a_new_one_moves_its_version() -> None:
    clock = ManualClock()
    standing: list[dict[str, Any]] = []

    def fabric() -> FleetFabric:
        return FleetFabric(now=0.0, views={}, states={}, incidents=[], wirings={},
                           readings={}, jobs=[], fail_slow=list(standing))

    desk = TopologyDesk(fabric, clock, cpu_clock=clock.monotonic)
    before = json.loads(desk.overview().body)
    assert before["fail_slow"] == []
    standing.append({"job": "llm", "node": "gpu-2", "link": "mlx5_1", "kind": "congested"})
    clock.advance(1.0)
    after = json.loads(desk.overview(since=before["version"]).body)
    assert after["version"] > before["version"]
    assert (after["full"], after["nodes"]) == (False, [])
    assert after["fail_slow"] == standing


def test_a_rebuild_that_fails_is_logged_and_the_answer_there_is_stays(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    fabric = ChangingFabric()

    def failing() -> FleetFabric:
        if fabric.builds:
            raise RuntimeError("the fleet could not be read")
        return fabric()

    desk = TopologyDesk(failing, clock, cpu_clock=clock.monotonic, wait_under=0.0,
                        refresh=lambda build: build())
    first = desk.document()
    clock.advance(1.0)
    assert desk.document() is first
    assert "could not be built again" in caplog.text
    assert "the fleet could not be read" in caplog.text


def test_a_rebuild_that_cannot_start_raises_and_the_next_read_starts_it() -> None:
    clock = ManualClock()
    fabric = ChangingFabric()
    refused: list[int] = []

    def refresh(build: Any) -> None:
        if not refused:
            refused.append(1)
            raise RuntimeError("can't start new thread")
        build()

    desk = TopologyDesk(fabric, clock, cpu_clock=clock.monotonic, wait_under=0.0,
                        refresh=refresh)
    first = desk.overview()
    clock.advance(1.0)
    with pytest.raises(RuntimeError, match="new thread"):
        desk.overview()
    desk.overview()  # the refused start held no build: this one runs
    assert fabric.builds == 2
    assert desk.overview() is not first
