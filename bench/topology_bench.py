"""``GET /api/v1/topology`` at fleet size: what a read costs, and that no report waits for it.

In one process, a real controller (manual clock, store in a temporary directory) holds
``--nodes`` simulated nodes (``sim.fleet``'s HGX reports, with their topologies and two
rounds of counters, so every port has rates). Measured:

- **document**: the controller building the document (``Controller.topology``), and
  msgspec encoding it, in seconds (median of the reads), and its size in bytes; and
  the full collections of the cyclic garbage collector during those reads (each stops
  every thread, the event loop too: a document made of a million dicts and lists, alive
  while it grows, used to cause several a read, a second or two each at 4,096 nodes);
- **answers**: what a page reads (the controller's :class:`TopologyDesk`): the whole
  document's bytes plain and gzip, and the seconds to compress it (once per build); the
  overview's build seconds (median of the reads, nothing new to work in; and once after
  a round of reports, when the meter works every node's new rates in first), its bytes
  plain and gzip; the bytes of
  a ``since`` update after one node's port went down, and the rows it holds; the seconds
  of an answer from the cache (a second page, the same version);
- **reports**: every node reports once more, on this thread (the event loop's part),
  first with nothing else running, then while another thread reads the topology again
  and again (a page left open, or several). Each report's ingest time: its median, p99
  and max. A report that waited for a read (before issue 29, on the fabric lock while
  the document was built) shows as a max near the build time; one that does not, as a
  few GIL switches (5 ms each), or a full collection that the reports' own turnover
  started (the reports of thousands of nodes replaced every round).

    python -m bench.topology_bench [--quick] [--nodes N] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.common import (
    add_output_args,
    finish,
    fmt,
    machine,
    results_path,
    stop_on_sigterm,
    summary,
)

#: Seconds between two rounds of reports (the meter takes rates every 4.5 s).
ROUND_SECONDS = 5.0


class Fleet:
    """A started controller and ``nodes`` simulated nodes that report to it."""

    def __init__(self, nodes: int, state_dir: Path) -> None:
        from sn_monitor.clock import ManualClock
        from sn_monitor.controller.actions.routing import build_drivers
        from sn_monitor.controller.service import Controller
        from sn_monitor.controller.settings import ControllerSettings
        from sn_monitor.controller.storage.store import Store
        from sn_monitor.model import topology_digest
        from sn_monitor.rules.spec import load_rules
        from sn_monitor.sim.fleet import base_reports, fleet_topology, node_labels, node_name

        self.clock = ManualClock(1_700_000_000.0)
        settings = ControllerSettings(state_dir=str(state_dir))
        rules = load_rules([Path(__file__).resolve().parents[1] / "sn_monitor" / "rules"])
        self.store = Store(state_dir / "controller.db")
        self.controller = Controller(settings, rules, self.clock, self.store,
                                     build_drivers(settings.drivers, settings.routes,
                                                   self.clock))
        self.controller.start()
        self.topology = fleet_topology(8)
        self.reports = base_reports(8, digest=topology_digest(self.topology))
        self.names = [node_name(i, nodes) for i in range(nodes)]
        self.labels = [node_labels(i) for i in range(nodes)]
        self.encoder = msgspec.json.Encoder()
        self.round = 0

    def bodies(self) -> list[bytes]:
        """One report of every node, the next round (the first carries the topology)."""
        self.round += 1
        self.clock.advance(ROUND_SECONDS)
        template = self.reports[self.round % len(self.reports)]
        return [self.encoder.encode(msgspec.structs.replace(
            template, node=name, instance="bench", sequence=self.round,
            sample_time_seconds=self.clock.time(), labels=labels,
            topology=self.topology if self.round == 1 else None))
            for name, labels in zip(self.names, self.labels, strict=True)]

    def ingest(self, bodies: Sequence[bytes]) -> list[float]:
        """Each body ingested as the event loop does: the seconds each took."""
        from sn_monitor.controller.security.auth import OPEN_ACCESS
        took = []
        for body in bodies:
            started = time.perf_counter()
            self.controller.ingest(body, OPEN_ACCESS, None)
            took.append(time.perf_counter() - started)
        return took

    def close(self) -> None:
        self.controller.close()
        self.store.close()


class FullCollections:
    """The cyclic garbage collector's full collections while it is entered: their pauses."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._started = 0.0

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._started)

    def __enter__(self) -> FullCollections:
        gc.collect()  # what the fleet's set-up left to collect is not the reads'
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)


def measure(nodes: int, reads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sn-topology-bench-") as tmp:
        fleet = Fleet(nodes, Path(tmp))
        try:
            for _ in range(2):  # the topologies, then counters: rates on every port
                fleet.ingest(fleet.bodies())
            fleet.controller.job_health.topology()  # the meter reads every node: once
            fleet.ingest(fleet.bodies())  # new counters, worked in by the first read
            build, encode, size = [], [], 0
            with FullCollections() as full:
                for _ in range(reads):
                    started = time.perf_counter()
                    doc = fleet.controller.job_health.topology()
                    built = time.perf_counter()
                    size = len(fleet.encoder.encode(doc))
                    build.append(built - started)
                    encode.append(time.perf_counter() - built)
            answers = measure_answers(fleet, reads)
            alone = fleet.ingest(fleet.bodies())
            stop = threading.Event()
            read_count = 0

            def read_again_and_again() -> None:
                nonlocal read_count
                while not stop.is_set():
                    fleet.encoder.encode(fleet.controller.job_health.topology())
                    read_count += 1

            reader = threading.Thread(target=read_again_and_again, name="topology-reader")
            bodies = fleet.bodies()
            reader.start()
            try:
                during = fleet.ingest(bodies)
            finally:
                stop.set()
                reader.join()
        finally:
            fleet.close()
    return {
        "document": {"bytes": size, "build_seconds": statistics.median(build),
                     "encode_seconds": statistics.median(encode), "reads": reads,
                     "full_collections": len(full.pauses),
                     "longest_full_collection_seconds": max(full.pauses, default=0.0)},
        "answers": answers,
        "reports": {"alone": summary(alone), "during_reads": summary(during),
                    "reads_meanwhile": read_count},
    }


def port_down(fleet: Fleet, node: int) -> bytes:
    """A report of node ``node`` whose first port is down, the next in its sequence."""
    fleet.round += 1
    template = fleet.reports[fleet.round % len(fleet.reports)]
    ports = list(template.infiniband)
    ports[0] = msgspec.structs.replace(ports[0], state=1)
    return fleet.encoder.encode(msgspec.structs.replace(
        template, node=fleet.names[node], instance="bench", sequence=fleet.round,
        sample_time_seconds=fleet.clock.time(), labels=fleet.labels[node],
        infiniband=ports))


def measure_answers(fleet: Fleet, reads: int) -> dict[str, Any]:
    """What a page reads from the controller's desk (module docstring)."""
    from sn_monitor.controller.service.topology_desk import TopologyDesk
    # the controller's sources, and the fleet's clock for the spacing too: a build each
    # time the clock moves a second (the controller's own desk spaces them by their CPU)
    desk = TopologyDesk(fleet.controller.job_health.fabric, fleet.clock,
                        cpu_clock=fleet.clock.monotonic)
    started = time.perf_counter()
    document = desk.document()
    built = time.perf_counter()
    squeezed = document.gzipped()
    out: dict[str, Any] = {
        "document_build_seconds": built - started,
        "document_gzip_seconds": time.perf_counter() - built,
        "document_bytes": len(document.body), "document_gzip_bytes": len(squeezed)}
    took = []
    for _ in range(reads):
        fleet.clock.advance(1.0)
        started = time.perf_counter()
        whole = desk.overview()
        took.append(time.perf_counter() - started)
    held = msgspec.json.decode(whole.body)["version"]
    out.update(overview_build_seconds=statistics.median(took),
               overview_bytes=len(whole.body), overview_gzip_bytes=len(whole.gzipped()))
    fleet.ingest(fleet.bodies())  # new counters from every node: the rates to work in
    started = time.perf_counter()
    desk.overview()
    out["overview_build_after_reports_seconds"] = time.perf_counter() - started
    fleet.ingest([port_down(fleet, 0)])
    fleet.clock.advance(1.0)
    update = desk.overview(since=held)
    started = time.perf_counter()
    again = desk.overview(since=held)  # a second page: the same answer, from the cache
    out["cached_answer_seconds"] = time.perf_counter() - started
    doc = msgspec.json.decode(update.body)
    out.update(update_bytes=len(update.body), update_rows=len(doc["nodes"]),
               update_full=doc["full"], update_shared=again is update)
    return out


def render(results: dict[str, Any]) -> str:
    doc, reports = results["document"], results["reports"]
    lines = [f"topology of {results['meta']['nodes']} nodes: {doc['bytes'] / 1e6:.1f} MB, "
             f"built in {fmt(doc['build_seconds'], 3)} s, encoded in "
             f"{fmt(doc['encode_seconds'], 3)} s (median of {doc['reads']}); "
             f"{doc['full_collections']} full garbage collections meanwhile (longest "
             f"{fmt(doc['longest_full_collection_seconds'], 3)} s)",
             answers_line(results["answers"]),
             "| a report's ingest | median ms | p99 ms | max ms |", "|---|---|---|---|"]
    for name, label in (("alone", "nothing else running"),
                        ("during_reads", f"while {reports['reads_meanwhile']} topology "
                                         "reads ran")):
        s = reports[name]
        lines.append(f"| {label} | {fmt(s['median'] * 1e3, 3)} | {fmt(s['p99'] * 1e3, 2)} | "
                     f"{fmt(s['max'] * 1e3, 1)} |")
    return "\n".join(lines)


def answers_line(a: dict[str, Any]) -> str:
    return (f"answers: document {a['document_bytes'] / 1e6:.1f} MB, gzip "
            f"{a['document_gzip_bytes'] / 1e6:.2f} MB in {fmt(a['document_gzip_seconds'], 2)} s; "
            f"overview {a['overview_bytes'] / 1e3:.0f} KB, gzip "
            f"{a['overview_gzip_bytes'] / 1e3:.0f} KB, built in "
            f"{fmt(a['overview_build_seconds'], 3)} s ("
            f"{fmt(a['overview_build_after_reports_seconds'], 3)} s after a round of "
            f"reports); one node's port down: an update of "
            f"{a['update_bytes']} bytes, {a['update_rows']} row(s) (full: {a['update_full']}); "
            f"from the cache in {a['cached_answer_seconds'] * 1e6:.0f} us")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.topology_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: 256 nodes, 2 reads (seconds)")
    parser.add_argument("--nodes", type=int, default=None,
                        help="fleet size (default 4096, quick 256)")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "topology.json")
    nodes = args.nodes or (256 if args.quick else 4096)
    reads = 2 if args.quick else 5
    print(f"topology bench: {nodes} nodes", flush=True)
    results: dict[str, Any] = {"meta": {"nodes": nodes, "quick": args.quick,
                                        "machine": machine()}}
    results.update(measure(nodes, reads))
    failures = [] if results["reports"]["reads_meanwhile"] else [
        "no topology read ran while the reports were ingested"]
    return finish(results, out_path, failures, render)


if __name__ == "__main__":
    sys.exit(main())
