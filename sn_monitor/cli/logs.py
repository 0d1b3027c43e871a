"""``sn-monitor logs analyze``: why did the job die, from its saved logs.

Runs the same recognition and root-cause ordering as the agent and the controller
(:mod:`sn_monitor.joblog`) over files and directories of logs: one file per rank, or
mixed. Prints the categories found and the first failing rank with its lines, or with
``--json`` one object (the contract of issue 33)::

    {"findings": [{"file", "line", "category", "root_candidate", "rank", "node", "text"}],
     "root_cause": {"file", "line", "rank", "node", "category"} | null}

Exit 0 when the analysis ran, whatever it found (a report, not a health check: read
``root_cause``), 2 on a usage error, a path that cannot be read or a bad ``--signatures``
file.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sn_monitor.cli.exit_status import refuse
from sn_monitor.cli.options import Commands

if TYPE_CHECKING:  # the command imports the analysis when it runs, not when --help builds
    from sn_monitor.joblog.analysis import Analysis

#: Lines of the root rank printed under the root cause (the rest: ``--json``).
_RANK_LINES = 12


def add_parser(commands: Commands) -> None:
    """``logs analyze [--json] [--signatures FILE] PATH...``."""
    logs = commands.add_parser("logs", help="analyse a training job's logs: failures and "
                               "the first failing rank",
                               description="Training-job log analysis.")
    actions = logs.add_subparsers(dest="logs_command", required=True)
    analyze = actions.add_parser(
        "analyze", help="recognise the failures in saved logs and name the root cause",
        description="Reads every FILE (a directory: every file under it), recognises "
                    "failure lines with the signature catalogue (NCCL and gloo timeouts, "
                    "CUDA errors and OOM, NaN loss, killed ranks, segfaults, tracebacks, "
                    "...), takes each line's rank and node from the file's path or the "
                    "line, and names the first failing rank and why. Exit 0: analysed "
                    "(whatever was found); 2: a path or --signatures file that cannot be "
                    "used.")
    analyze.add_argument("paths", nargs="+", type=Path, metavar="FILE|DIR",
                         help="log files, or directories of them (torchrun --log-dir)")
    analyze.add_argument("--json", action="store_true",
                         help="print one JSON object: findings and root_cause")
    analyze.add_argument("--signatures", type=Path, metavar="FILE", default=None,
                         help="a signature catalogue to use instead of the packaged one "
                              "(check it with 'sn-monitor check-config FILE')")
    analyze.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    """Analyse the paths; print the report; 0 once analysed, 2 when it cannot be."""
    from sn_monitor.joblog.analysis import LogsError, analyze
    from sn_monitor.joblog.catalogue import SignatureError, load_catalogue
    from sn_monitor.joblog.recognition import Recognizer

    try:
        recognizer = Recognizer(load_catalogue(args.signatures))
        result = analyze(args.paths, recognizer)
    except (SignatureError, LogsError) as err:
        return refuse(err)
    if args.json:
        print(json.dumps(as_json(result), indent=2))
    else:
        print(as_text(result))
    return 0


def as_json(result: Analysis) -> dict[str, Any]:
    """The ``--json`` object: exactly the keys of the contract."""
    cause = result.root_cause
    return {
        "findings": [{"file": f.file, "line": f.line, "category": f.category,
                      "root_candidate": f.root_candidate, "rank": f.rank, "node": f.node,
                      "text": f.text} for f in result.findings],
        "root_cause": None if cause is None else {
            "file": cause.file, "line": cause.line, "rank": cause.rank, "node": cause.node,
            "category": cause.category},
    }


def as_text(result: Analysis) -> str:
    """The report for a person: what was read, the categories, the root cause, its lines."""
    out = [f"{result.files} file(s), {result.lines:,} line(s) read; "
           f"{len(result.findings)} finding(s)"]
    counts = Counter(f.category for f in result.findings)
    if counts:
        out.append("categories: " + ", ".join(f"{category} {n}"
                                              for category, n in counts.most_common()))
    cause = result.root_cause
    if cause is None:
        out.append("root cause: none (no failure recognised)")
        return "\n".join(out)
    where = ", ".join(part for part in (
        f"rank {cause.rank}" if cause.rank is not None else "",
        f"node {cause.node}" if cause.node else "") if part) or "unknown rank"
    out.append(f"root cause: {cause.category} on {where}")
    out.append(f"  why chosen: {cause.reason}")
    if cause.file is not None:
        out.append(f"  at: {cause.file}:{cause.line}" if cause.line else f"  at: {cause.file}")
    if cause.finding is not None:
        out.append(f"  > {cause.finding.text.strip()}")
    own = [f for f in result.findings
           if cause.rank is not None and f.rank == cause.rank][:_RANK_LINES]
    if own:
        out.append(f"lines of rank {cause.rank}:")
        out.extend(f"  {f.file}:{f.line}: [{f.category}] {f.text.strip()}" for f in own)
    return "\n".join(out)
