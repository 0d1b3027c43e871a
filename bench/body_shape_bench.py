"""The request-body shape check takes linear time: a megabyte of each hostile shape against
an eighth of it.

Run with ``python -m bench.body_shape_bench`` (``make bench``); ``--quick`` for a smoke
run (3 runs of each size instead of 7). :func:`sn_monitor.controller.api.bodies.check_shape`
runs on every body of the API's less frequent routes, before any parser; a body may be a
megabyte (the default ``max_body_bytes``). For each shape (one unit repeated: ``[``,
``{``, ``- ``, digits, backslashes in a string, quotes, blanks, newlines, a list of small
objects) the check runs on 1 MiB and on 128 KiB, in this process, and the fastest run of
each size is kept (a busy machine only ever adds time). Linear time is a ratio near 8,
quadratic near 64. Goal: every ratio below 24; printed beside the figures, never a
failure. The exit status is 1 only when nothing could be measured.

``tests/unit/test_hostile_input.py`` checks, without a clock, that each of these bodies
is checked to its verdict; the times are measured here only.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import add_output_args, finish, machine, results_path, stop_on_sigterm
from sn_monitor.controller.api.bodies import BodyRefused, check_shape

#: (name, prefix, repeated unit, suffix): the hostile shapes, as the unit test has them.
SHAPES: list[tuple[str, bytes, bytes, bytes]] = [
    ("brackets", b"", b"[", b""), ("braces", b"", b"{", b""), ("dashes", b"", b"- ", b""),
    ("digits", b"", b"9", b""), ("backslashes", b'"', b"\\", b""),
    ("single quotes", b"", b"'", b"x"), ("double quotes", b"", b'"', b""),
    ("blanks", b"", b" ", b""), ("newlines", b"", b"\n", b""),
    ("objects", b"", b'[{"a": "b"}, ', b"]"),
]
BIG_BYTES = 1 << 20
GOAL_RATIO = 24.0


def fastest_seconds(body: bytes, runs: int) -> float:
    """The fastest of ``runs`` shape checks of ``body`` (YAML allowed: every check runs)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        with contextlib.suppress(BodyRefused):
            check_shape(body, yaml_allowed=True)
        times.append(time.perf_counter() - started)
    return min(times)


def measure(runs: int) -> list[dict[str, Any]]:
    rows = []
    for name, prefix, unit, suffix in SHAPES:
        count = BIG_BYTES // len(unit)
        big = fastest_seconds(prefix + unit * count + suffix, runs)
        small = fastest_seconds(prefix + unit * (count // 8) + suffix, runs)
        ratio = big / max(small, 1e-6)
        rows.append({"shape": name, "small_ms": round(small * 1e3, 3),
                     "big_ms": round(big * 1e3, 3), "ratio": round(ratio, 1),
                     "goal_met": ratio < GOAL_RATIO})
        print(f"  {name:14} 128 KiB {small * 1e3:9.3f} ms   1 MiB {big * 1e3:9.3f} ms   "
              f"ratio {ratio:5.1f} (goal < {GOAL_RATIO:g}: "
              f"{'met' if ratio < GOAL_RATIO else 'MISSED'})", flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.body_shape_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: 3 runs of each size instead of 7")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "body_shape.json")
    runs = 3 if args.quick else 7
    print(f"body shape check: 1 MiB against 128 KiB of each shape, fastest of {runs} runs",
          flush=True)
    rows = measure(runs)
    results: dict[str, Any] = {"meta": {"runs": runs, "quick": args.quick,
                                        "big_bytes": BIG_BYTES, "goal_ratio": GOAL_RATIO,
                                        "machine": machine()},
                               "shapes": rows}
    return finish(results, out_path, [] if rows else ["no shape measured"])


if __name__ == "__main__":
    sys.exit(main())
