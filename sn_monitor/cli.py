"""The one entry point: ``sn-monitor agent|controller|demo|simulate|breaker|verify|...``.

And ``sn-monitor version``, ``topology``, ``check-config``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from sn_monitor import __version__
from sn_monitor.agent.settings import AgentSettings, agent_settings_from, load_agent_settings
from sn_monitor.config import ConfigError, bind, listen_address, load_yaml, parse_duration
from sn_monitor.errors import SnMonitorError
from sn_monitor.fleet.command import add_arguments as add_fleet_arguments
from sn_monitor.fleet.command import run_fleet
from sn_monitor.goodput.command import add_arguments as add_goodput_arguments
from sn_monitor.goodput.command import run_goodput
from sn_monitor.logs import configure_logging
from sn_monitor.model import CheckResult
from sn_monitor.serving import ListenError
from sn_monitor.transport import check_http_url

log = logging.getLogger("sn_monitor")

EXIT_CONFIG = 2
#: slurm-health's agent (sn_monitor.slurm_health.DEFAULT_AGENT; imported only when it runs).
DEFAULT_AGENT_URL = "http://127.0.0.1:9847"
#: The controller's store cannot be opened (unreachable server, unwritable directory):
#: a supervisor may start it again later.
EXIT_STORE = 1


def _listen(value: str) -> str:
    """``--listen``: HOST:PORT with a port 1-65535 and a host that is an address or a name."""
    try:
        listen_address(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _http_url(value: str) -> str:
    """``--controller``: an http:// or https:// URL with a host (``ctl:9848`` is refused)."""
    try:
        check_http_url(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _agent_url(value: str) -> str:
    """``slurm-health --agent``: an http(s) URL, or '' for no agent."""
    return _http_url(value) if value else value


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _duration(value: str) -> float:
    try:
        seconds = float(value) if value.replace(".", "", 1).isdigit() else parse_duration(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value!r}")
    return seconds


#: ``sn-monitor --help``: plain text (argparse prints it as is; no RST markup).
DESCRIPTION = (
    "Watch GPU supernodes and repair them. An agent on every GPU node samples its GPUs, "
    "network and kernel log and serves /metrics; a controller receives every node's "
    "reports, applies the rules and acts: throttle, alert, cordon, evict, fail over to a "
    "spare, restart the job from its latest checkpoint. 'sn-monitor demo' shows it on a "
    "simulated supernode; 'sn-monitor COMMAND --help' describes each command.")


def build_parser() -> argparse.ArgumentParser:
    """The command line of DESIGN.md (subcommands grow with the product)."""
    parser = argparse.ArgumentParser(prog="sn-monitor", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    agent = sub.add_parser("agent", help="run the node agent",
                           description="Sample this node's GPUs, network and kernel log; "
                                       "serve /metrics and /healthz.")
    agent.add_argument("--config", type=Path, help="agent config file (deploy/agent.yaml)")
    agent.add_argument("--simulate", type=_positive_int, metavar="GPUS",
                       help="run on a simulated node with this many GPUs (no GPU needed)")
    agent.add_argument("--listen", type=_listen, metavar="HOST:PORT",
                       help="address for /metrics and /healthz (default 0.0.0.0:9847)")
    agent.add_argument("--node",
                       help="node name (default: config, then $NODE_NAME, then the hostname)")
    agent.add_argument("--controller", action="append", type=_http_url, metavar="URL",
                       help="report to this controller (http[s]://host:9848); give it "
                            "again for each controller of a high-availability pair")
    agent.add_argument("--token-file", metavar="F",
                       help="file holding the bearer token for the controller")
    agent.add_argument("--state-dir", metavar="DIR",
                       help="where the event spool and saved power limits live")
    agent.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    agent.add_argument("--sim-speed", type=float, default=1.0, metavar="X",
                       help="with --simulate: run the GPUs' physics X times faster")
    _log_options(agent)

    controller = sub.add_parser(
        "controller", help="run the controller",
        description="Receive every node's reports, apply the rules, act through the "
                    "safety policy, record everything.")
    controller.add_argument("--config", type=Path, help="controller config file")
    controller.add_argument("--listen", type=_listen, metavar="HOST:PORT",
                            help="API address (default 0.0.0.0:9848)")
    controller.add_argument("--state-dir", metavar="DIR", help="where the SQLite store lives")
    controller.add_argument("--rules", action="append", metavar="DIR",
                            help="rule files or directories (repeatable)")
    controller.add_argument("--token-file", metavar="F", help="the API token file (YAML)")
    controller.add_argument("--jobs", metavar="DIR", help="a directory of DistributedJob files")
    _log_options(controller)

    demo = sub.add_parser(
        "demo", help="watch a simulated supernode break and recover",
        description="Start a controller, N simulated agents (real agent processes) and a "
                    "training job over all but 2 of them (the spares), play a scenario of "
                    "faults, show it live, and end with a summary: each fault, when it was "
                    "detected, what was done, how long recovery took, the job's effective "
                    "training ratio.")
    demo.add_argument("--nodes", type=_positive_int, default=16,
                      help="simulated nodes, the last 2 of them spares (default 16)")
    demo.add_argument("--gpus-per-node", type=_positive_int, default=8, dest="gpus",
                      help="GPUs per node (default 8)")
    demo.add_argument("--scenario", metavar="F", default="default",
                      help="a scenario file, or a packaged one by name (default: default)")
    demo.add_argument("--speed", type=float, default=10.0, metavar="X",
                      help="simulated seconds per wall second: scenario time, GPU physics "
                           "and rule holds (default 10)")
    demo.add_argument("--duration", type=_duration, default=None, metavar="S",
                      help="stop after S wall seconds (default: the scenario's end)")
    demo.add_argument("--listen", type=_listen, default="127.0.0.1:9848", metavar="HOST:PORT",
                      help="the controller's address (default 127.0.0.1:9848); agents take "
                           "the free ports after it")
    demo.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                      help="keep the store, configs and logs here (default: a temporary "
                           "directory, removed at exit)")
    demo.add_argument("--rules", action="append", type=Path, metavar="DIR",
                      help="rule files or directories (repeatable; default: the rules "
                           "packaged with sn-monitor), their holds scaled by --speed")
    demo.add_argument("--headless", action="store_true",
                      help="no live view: print the summary as JSON; exit 1 if a fault "
                           "went undetected, a healthy node was taken for faulty, or the "
                           "job is not training at the end")
    demo.add_argument("--keep-running", action="store_true",
                      help="after the scenario, leave everything up (/metrics, /api/v1/sd "
                           "for Prometheus) until Ctrl-C")
    _log_options(demo, default_level="warning")

    simulate = sub.add_parser(
        "simulate", help="run many simulated agents against a controller",
        description="Run N simulated 8-GPU nodes in this process, each reporting to the "
                    "controller every interval, optionally breaking them by a scenario "
                    "file; print what the controller answered (accepted, refused, "
                    "latencies).")
    simulate.add_argument("--controller", required=True, type=_http_url, metavar="URL",
                          help="the controller (http[s]://host:9848)")
    simulate.add_argument("--nodes", type=_positive_int, default=1000,
                          help="simulated nodes (default 1000), named sim-0000, sim-0001, ...")
    simulate.add_argument("--first", type=int, default=0, metavar="N",
                          help="index of the first node (default 0): --first 256 --nodes 256 "
                               "is sim-0256.. in supernode sn01, beside another simulate")
    simulate.add_argument("--full-reports", action="store_true",
                          help="send full reports throughout, as agents before node-local "
                               "rules do (default: evaluate the rules the controller sends and "
                               "send trimmed reports with the findings)")
    simulate.add_argument("--post-reports", action="store_true",
                          help="post every report, one request in flight per connection, as "
                               "agents before the reports' stream do (default: a stream per "
                               "connection, answered only when there is something to say)")
    simulate.add_argument("--interval", type=_duration, default=1.0, metavar="S",
                          help="report interval of each node: 1s, 500ms, 2 (default 1s)")
    simulate.add_argument("--scenario", metavar="F",
                          help="a scenario file, or a packaged one by name "
                               "(default, thermal, network, mass-failure)")
    simulate.add_argument("--token-file", metavar="F",
                          help="file holding the agents' bearer token")
    simulate.add_argument("--ca-file", metavar="F",
                          help="CA bundle the controller's certificate must chain to (https; "
                               "default: the system's)")
    simulate.add_argument("--duration", type=_duration, default=None, metavar="S",
                          help="stop after S wall seconds (default: the scenario's duration "
                               "divided by --speed; without a scenario, run until Ctrl-C)")
    simulate.add_argument("--speed", type=float, default=1.0, metavar="X",
                          help="simulated seconds per wall second: scenario time and GPU "
                               "physics (default 1)")
    simulate.add_argument("--gpus", type=_positive_int, default=8, help="GPUs per node")
    simulate.add_argument("--connections", type=_positive_int, default=16,
                          help="keep-alive connections to the controller (default 16)")
    simulate.add_argument("--jitter", type=float, default=0.1, metavar="F",
                          help="each interval varies by up to this fraction (default 0.1)")
    simulate.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    simulate.add_argument("--json", action="store_true",
                          help="print the summary as JSON instead of a table")
    simulate.add_argument("--quiet", action="store_true",
                          help="no progress line every 10 s on stderr")
    _log_options(simulate, default_level="warning")

    breaker = sub.add_parser(
        "breaker", help="show, close or open the controller's circuit breaker",
        description="The circuit breaker freezes evictions when many nodes fail together. "
                    "'status' shows it; 'close' lets held evictions and recoveries go on "
                    "(a person looked: it was not a partition); 'open' freezes them for the "
                    "breaker's hold. Closing and opening need an operate token and are "
                    "recorded in the audit trail. Exit 1 when the controller refuses or "
                    "cannot be reached.")
    breaker.add_argument("what", choices=["status", "close", "open"], nargs="?",
                         default="status")
    breaker.add_argument("--controller", action="append", required=True, type=_http_url,
                         metavar="URL",
                         help="the controller (http[s]://host:9848); give it again for "
                              "each controller of a high-availability pair")
    breaker.add_argument("--token-file", metavar="F",
                         help="file holding a bearer token (read role for status, operate "
                              "to close or open)")
    breaker.add_argument("--ca-file", metavar="F",
                         help="CA bundle the controller's certificate must chain to")
    breaker.add_argument("--reason", help="why (required to close or open; recorded)")

    topology = sub.add_parser(
        "topology", help="print the fabric: supernodes, racks, nodes, rails, fail-slow links",
        description="Prints the controller's topology view (GET /api/v1/topology; the page "
                    "/ui/topology draws the same): fail-slow bottlenecks first, then each "
                    "rack's nodes with their health, then one line per rail naming its "
                    "unhealthy ports. Exit 1 when the controller refuses or cannot be "
                    "reached.")
    topology.add_argument("--controller", action="append", required=True, type=_http_url,
                          metavar="URL",
                          help="the controller (http[s]://host:9848); give it again for "
                               "each controller of a high-availability pair")
    topology.add_argument("--job", metavar="J", help="mark this job's nodes")
    topology.add_argument("--token-file", metavar="F",
                          help="file holding a bearer token (read role)")
    topology.add_argument("--ca-file", metavar="F",
                          help="CA bundle the controller's certificate must chain to")
    topology.add_argument("--json", action="store_true", help="print the API's JSON as is")

    goodput = sub.add_parser(
        "goodput", help="replay a failure trace: ETTR of sn-monitor and of what users run today",
        description="Replays a failure trace (by default the Llama 3 paper's interruption "
                    "rates, drawn for a seed, on a 2,048-node job for 54 days) on a "
                    "simulated job, on a virtual clock: sn-monitor's own controller makes "
                    "its decisions; Kubernetes alone and torchrun elastic are their "
                    "documented timings. Prints ETTR, lost work, the downtime split, "
                    "interruptions and false evictions side by side, with every "
                    "assumption. Exit 2 on a bad trace file or option.")
    add_goodput_arguments(goodput)
    _log_options(goodput, default_level="error")

    fleet = sub.add_parser(
        "fleet", help="serve one view over several supernodes' controllers",
        description="Ask every supernode's controller at once and serve the merged nodes "
                    "and incidents (each tagged with its supernode) on one API; a "
                    "supernode that does not answer makes the view partial, not empty.")
    add_fleet_arguments(fleet)
    _log_options(fleet)

    verify = sub.add_parser(
        "verify", help="check that this node is fit to go back into service",
        description="The return-to-service checks the controller asks an agent for before "
                    "it uncordons a repaired node: every expected GPU present and reachable, "
                    "no row remap pending or failed, PCIe links at full width (and full "
                    "generation unless idle), every NVLink up, temperatures below slowdown "
                    "minus a margin, no uncorrectable ECC error since the last reset; then "
                    "dcgmi diag when dcgmi is installed and the configured user command. "
                    "Exit 0 when every check passes, 1 when one fails, 2 when the checks "
                    "cannot run (bad config, no NVML).")
    verify.add_argument("--config", type=Path,
                        help="agent config file: its remediation.verify settings")
    verify.add_argument("--simulate", type=_positive_int, metavar="GPUS",
                        help="verify a simulated node with this many GPUs (no GPU needed)")
    verify.add_argument("--fault", action="append", default=[], metavar="NAME[@GPU]",
                        help="with --simulate: inject this fault first (pcie-downgrade@3, "
                             "nvlink-down@0, fall-off-bus@1, row-remap-pending@2); repeatable")
    verify.add_argument("--expected-gpus", type=_positive_int, metavar="N",
                        help="GPUs the node must have (default: config, then the most the "
                             "agent has seen here, then what NVML shows now)")
    verify.add_argument("--dcgm-level", type=int, choices=[0, 1, 2, 3, 4], default=None,
                        help="dcgmi diag level (default: config, 1; 0: no DCGM diagnostic)")
    verify.add_argument("--json", action="store_true", help="print the checks as JSON")
    _log_options(verify, default_level="warning")

    health = sub.add_parser(
        "slurm-health", help="Slurm HealthCheckProgram: drain this node when its GPUs fail",
        description="For slurm.conf's HealthCheckProgram (as LBNL NHC): asks the local agent "
                    "(/healthz, then /metrics) or, when none answers, checks the GPUs here "
                    "through NVML (the snapshot checks of sn-monitor verify); on a failure "
                    "drains the node with Reason=\"sn-monitor slurm-health: <why>\", on "
                    "success resumes only a drain with that prefix. Exit 0 healthy, 1 "
                    "unhealthy (drained), 2 the check or scontrol could not run.")
    health.add_argument("--node", help="the Slurm node name (default: $SLURMD_NODENAME, "
                                       "which slurmd sets, else the short host name)")
    health.add_argument("--agent", default=DEFAULT_AGENT_URL, type=_agent_url, metavar="URL",
                        help=f"the local agent (default {DEFAULT_AGENT_URL}); '' to skip it")
    health.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="for the agent's answers and for scontrol (default 5)")
    health.add_argument("--scontrol", default="scontrol", help="the scontrol to run")
    health.add_argument("--expected-gpus", type=_positive_int, metavar="N",
                        help="GPUs the node must have")
    health.add_argument("--config", type=Path,
                        help="agent config file (for the checks without an agent)")
    health.add_argument("--simulate", type=_positive_int, metavar="GPUS",
                        help="without an agent: check a simulated node (no GPU needed)")
    health.add_argument("--fault", action="append", default=[], metavar="NAME[@GPU]",
                        help="with --simulate: inject this fault first; repeatable")
    health.add_argument("--dry-run", action="store_true",
                        help="say what would be drained or resumed, change nothing")
    _log_options(health, default_level="warning")

    check = sub.add_parser("check-config", help="validate config files (agent, controller, rule, "
                           "job, scenario, token, fleet, XID catalogue); exit 2 on any error",
                           description=_check_config_description(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("files", nargs="+", type=Path, metavar="FILE",
                       help="YAML files of any of the kinds above, mixed")

    sub.add_parser("version", help="print the version")
    # No abbreviations: "--token SECRET" must be refused, not taken for --token-file (and
    # the secret then printed in "cannot read token file SECRET").
    parser.allow_abbrev = False
    for subparser in sub.choices.values():
        subparser.allow_abbrev = False
    return parser


def _log_options(parser: argparse.ArgumentParser, default_level: str = "info") -> None:
    parser.add_argument("--log-format", choices=["text", "json"], default=None,
                        help="one line per event as text (default) or JSON for journald")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        default=None)
    parser.set_defaults(default_log_level=default_level)


#: Keys only a controller config has: how check-config tells the two apart
#: (``remediation`` is in both: the agent's carries out rungs, the controller's climbs).
_CONTROLLER_KEYS = frozenset({"state_dir", "rules", "token_file", "max_body_bytes",
                              "sweep_interval", "policy", "runner", "drivers", "routes",
                              "jobs", "recovery", "settle", "tls", "store", "ha",
                              "xid_catalog"})
_AGENT_KEYS = frozenset({"node", "labels", "labels_from_node", "interval", "controller",
                         "paths", "collectors", "guard"})


def _check_config_description() -> str:
    """``check-config --help``: the kinds of file, told apart as :func:`check_file` does."""
    import textwrap

    def keys(names: frozenset[str]) -> str:
        return textwrap.fill(", ".join(sorted(names)), width=78, initial_indent=" " * 20,
                             subsequent_indent=" " * 20)

    return (
        "Validate each FILE and print 'FILE: ok (kind)', or each error as\n"
        "'FILE:LINE: KEY: what is wrong'. Exit 2 if any file has an error.\n\n"
        "The kind of each file is told from its content, in this order:\n"
        "  scenario file     a mapping with kind: Scenario\n"
        "  XID catalogue     kind: XidCatalog, or an entries: list without a kind\n"
        "  job file          kind: DistributedJob\n"
        "  token file        a list whose items have token, token_file or role\n"
        "  rule file         any other list (of rules)\n"
        "  fleet config      a mapping with supernodes:\n"
        "  controller config a mapping with one of the keys only a controller has:\n"
        f"{keys(_CONTROLLER_KEYS)}\n"
        "                    and none of those only an agent has:\n"
        f"{keys(_AGENT_KEYS)}\n"
        "  agent config      any other mapping (an empty file included)\n\n"
        "Other tools' files are told apart first and not read as sn-monitor's:\n"
        "Kubernetes manifests (apiVersion and kind; named and skipped), Prometheus\n"
        "configurations and rule files (checked with promtool) and Alertmanager\n"
        "configurations (checked with amtool) where those tools are on PATH.\n"
        "What a file names that is not on this machine (a token file, a rules\n"
        "directory, the Kubernetes client) is a note, not an error: the daemon\n"
        "that reads the file refuses to start without it.\n\n"
        "Example: sn-monitor check-config /etc/sn-monitor/*.yaml "
        "/etc/sn-monitor/rules/*.yaml")


def check_file(path: Path, notes: list[str] | None = None) -> str:
    """Validate one config file of any kind; return what it was. Raises ConfigError.

    An XID catalogue is told by its ``kind: XidCatalog``, or by an ``entries:`` list
    where the kind was left out (so that the error says the kind is missing). What the
    file names that is not on this machine (a token file, a rules directory) is not
    checked: said in ``notes``.
    """
    from sn_monitor.controller.security.auth import check_token_file
    from sn_monitor.controller.settings import ControllerSettings, check_rules
    from sn_monitor.rules.spec import load_rules
    from sn_monitor.rules.xid_catalog import is_catalog_document, parse_catalog

    notes = notes if notes is not None else []
    doc = load_yaml(path)
    if isinstance(doc.data, dict) and doc.data.get("kind") == "Scenario":
        from sn_monitor.sim.scenario import parse_scenario

        parse_scenario(doc)
        return "scenario file"
    if isinstance(doc.data, dict) and (is_catalog_document(doc.data) or (
            "entries" in doc.data and "kind" not in doc.data)):
        parse_catalog(doc)
        return "xid catalog"
    if isinstance(doc.data, dict) and doc.data.get("kind") == "DistributedJob":
        from sn_monitor.controller.jobs.spec import parse_job

        parse_job(doc)
        return "job file"
    if isinstance(doc.data, list):
        if any(isinstance(item, dict) and ({"token", "token_file", "role"} & item.keys())
               for item in doc.data):
            notes.extend(f"token_file {name} is not on this machine: not checked"
                         for name in check_token_file(path))
            return "token file"
        load_rules([path])
        return "rule file"
    if isinstance(doc.data, dict) and "supernodes" in doc.data:
        from sn_monitor.fleet.settings import FleetSettings

        bind(FleetSettings, doc)
        return "fleet config"
    if isinstance(doc.data, dict) and _is_controller_config(doc.data):
        notes.extend(check_rules(bind(ControllerSettings, doc), doc))
        return "controller config"
    agent_settings_from(doc)
    return "agent config"


def _is_controller_config(data: dict[Any, Any]) -> bool:
    """Whether a mapping is a controller config (else it is taken for an agent's).

    A controller-only key and no agent-only key; or a key no agent has that is closest to
    a controller-only key (``sweep_intervall``: the error then suggests ``sweep_interval``,
    not an agent's ``interval``).
    """
    import difflib

    from sn_monitor.agent.settings import AgentSettings

    keys = {key for key in data if isinstance(key, str)}
    if keys & _AGENT_KEYS:
        return False
    if keys & _CONTROLLER_KEYS:
        return True
    agent_keys = {field.name for field in fields(AgentSettings)}
    known = sorted(agent_keys | _CONTROLLER_KEYS)
    return any(set(difflib.get_close_matches(key, known, n=1)) & _CONTROLLER_KEYS
               for key in keys - agent_keys)


def check_config(files: Sequence[Path]) -> int:
    """Validate each file; print every error as ``file:line: key: message``."""
    from sn_monitor.controller.k8s.settings import absent_client_noted
    from sn_monitor.foreign_config import check, recognise

    failed = False
    for path in files:
        found = recognise(path)
        if found is not None:
            verdict = check(found)
            if verdict.error is not None:
                print(f"{path}: {verdict.summary}: {verdict.error}", file=sys.stderr)
                failed = True
            else:
                print(f"{path}: {'ok' if verdict.checked else 'skipped'} ({verdict.summary})")
            continue
        notes: list[str] = []
        try:
            with absent_client_noted(notes):
                kind = check_file(path, notes)
        except ConfigError as err:
            print(err, file=sys.stderr)
            failed = True
        else:
            print(f"{path}: ok ({kind})")
            for note in notes:
                print(f"{path}: note: {note}")
    return EXIT_CONFIG if failed else 0


def _agent_settings(args: argparse.Namespace) -> AgentSettings:
    settings = load_agent_settings(args.config)
    if args.listen:
        settings = replace(settings, listen=args.listen)
    if args.node:
        settings = replace(settings, node=args.node)
    if args.controller or args.token_file:
        url, urls = settings.controller.url, settings.controller.urls
        if args.controller:  # one: url, as ever; several: urls
            url, urls = (args.controller[0], None) if len(args.controller) == 1 else (
                None, list(args.controller))
        try:
            controller = replace(settings.controller, url=url, urls=urls,
                                 token_file=args.token_file or settings.controller.token_file)
        except ValueError as err:
            raise ConfigError("command line", "--controller", None, str(err)) from None
        settings = replace(settings, controller=controller)
    if args.state_dir:
        settings = replace(settings, state_dir=args.state_dir)
    return settings


def run_agent(settings: AgentSettings, simulate: int | None, duration: float | None,
              sim_speed: float = 1.0) -> int:
    """The agent on this node's GPUs, or on a simulated node with ``simulate`` GPUs.

    A simulated node's physics run ``sim_speed`` times faster than the wall (the agent's
    clocks do not), and its agent takes faults on ``POST /sim/fault``.
    """
    from sn_monitor.agent.daemon import build_agent
    from sn_monitor.clock import SystemClock
    from sn_monitor.transport import TokenError

    clock = SystemClock()
    try:
        if simulate is None:
            from sn_monitor.agent.nvml import load_pynvml

            build_agent(settings, load_pynvml(), clock).run_until_signalled(duration)
            return 0
        from sn_monitor.sim.node import SimulatedNode, fault_endpoint

        with tempfile.TemporaryDirectory(prefix="sn-sim-") as root:
            node = SimulatedNode(Path(root), gpus=simulate)
            settings = node.agent_settings(settings)
            agent = build_agent(
                settings, node.nvml, clock,
                before_sample=lambda dt: node.step(dt * sim_speed, traffic_seconds=dt),
                actuator=node.actuator())
            agent.http.add_post_route("/sim/fault", fault_endpoint(node))
            agent.run_until_signalled(duration)
        return 0
    except (TokenError, ListenError, OSError) as err:
        print(f"sn-monitor agent: {err}", file=sys.stderr)
        return EXIT_CONFIG


def run_verify(args: argparse.Namespace) -> int:
    """``sn-monitor verify``: one sample of this node's GPUs, the checks, exit 0 / 1 / 2."""
    import json

    import msgspec

    from sn_monitor.agent.verify import summary

    try:
        settings = load_agent_settings(args.config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    verify = settings.remediation.verify
    if args.expected_gpus is not None:
        verify = replace(verify, expected_gpus=args.expected_gpus)
    if args.dcgm_level is not None:
        verify = replace(verify, dcgm_level=args.dcgm_level)
    settings = replace(settings, remediation=replace(settings.remediation, verify=verify))
    if args.fault and args.simulate is None:
        print("sn-monitor verify: --fault needs --simulate", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if args.simulate is None:
            from sn_monitor.agent.nvml import load_pynvml

            checks = _verify_once(settings, load_pynvml())
        else:
            checks = _verify_simulated(settings, args.simulate, args.fault)
    except VerifyError as err:
        print(f"sn-monitor verify: {err}", file=sys.stderr)
        return EXIT_CONFIG
    ok = all(check.ok for check in checks)
    if args.json:
        print(json.dumps({"ok": ok, "summary": summary(checks),
                          "checks": msgspec.to_builtins(checks)}, indent=2, ensure_ascii=False))
    else:
        for check in checks:
            verdict = "SKIP" if check.skipped else "PASS" if check.ok else "FAIL"
            print(f"{verdict}  {check.name:<18} {check.detail}")
        print(summary(checks))
    return 0 if ok else 1


def run_slurm_health(args: argparse.Namespace) -> int:
    """``sn-monitor slurm-health``: see :mod:`sn_monitor.slurm_health`."""
    import os

    from sn_monitor.config import Duration
    from sn_monitor.controller.actions.drivers.slurm import SlurmDriver, SlurmSettings
    from sn_monitor.slurm_health import node_name, run

    if args.timeout <= 0:
        print("sn-monitor slurm-health: --timeout must be positive", file=sys.stderr)
        return EXIT_CONFIG
    if args.fault and args.simulate is None:
        print("sn-monitor slurm-health: --fault needs --simulate", file=sys.stderr)
        return EXIT_CONFIG
    try:
        settings = load_agent_settings(args.config)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    # Every HealthCheckInterval: the snapshot checks only, no minutes-long diagnostics.
    verify = replace(settings.remediation.verify, dcgm_level=0, command=None,
                     expected_gpus=args.expected_gpus or settings.remediation.verify.expected_gpus)
    settings = replace(settings, remediation=replace(settings.remediation, verify=verify))

    def local_checks() -> list[CheckResult]:
        if args.simulate is not None:
            return _verify_simulated(settings, args.simulate, args.fault)
        from sn_monitor.agent.nvml import load_pynvml

        return _verify_once(settings, load_pynvml())

    driver = SlurmDriver(SlurmSettings(scontrol=args.scontrol, timeout=Duration(args.timeout)))
    return run(node=node_name(args.node, dict(os.environ)), agent=args.agent or None,
               timeout=args.timeout, expected_gpus=args.expected_gpus,
               local_checks=local_checks, driver=driver, dry_run=args.dry_run,
               out=sys.stdout, err=sys.stderr)


class VerifyError(SnMonitorError):
    """The verification could not run (no NVML, a bad simulated fault)."""


def _verify_simulated(settings: AgentSettings, gpus: int,
                      faults: Sequence[str]) -> list[CheckResult]:
    from sn_monitor.sim.node import FaultError, SimulatedNode

    with tempfile.TemporaryDirectory(prefix="sn-verify-") as root:
        node = SimulatedNode(Path(root), gpus=gpus)
        for fault in faults:
            name, _, gpu = fault.partition("@")
            try:
                node.inject(name, int(gpu) if gpu else None)
            except (FaultError, ValueError) as err:  # or a GPU that is not a number
                raise VerifyError(f"--fault {fault}: {err}") from None
        return _verify_once(node.agent_settings(settings), node.nvml)


def _verify_once(settings: AgentSettings, nvml: object) -> list[CheckResult]:
    """Sample the GPUs once through the agent's own collector, then run every check."""
    from sn_monitor.agent.collectors.gpu import NvmlCollector
    from sn_monitor.agent.sampler import Sampler
    from sn_monitor.agent.verify import GpuCountMemory, verify_node
    from sn_monitor.clock import SystemClock

    clock = SystemClock()
    collector = NvmlCollector(nvml, clock)
    sampler = Sampler(settings.node, [collector], clock)
    try:
        snapshot = sampler.sample()
        if not all(status.success for status in snapshot.collectors):
            raise VerifyError("cannot read the GPUs through NVML (see the log above)")
        state = Path(settings.state_dir)
        memory = GpuCountMemory(state if state.is_dir() else None)
        return verify_node(snapshot, settings.remediation.verify, memory)
    finally:
        sampler.close()


def run_controller_command(args: argparse.Namespace) -> int:
    """``sn-monitor controller``: flags override the config file."""
    from sn_monitor.clock import SystemClock
    from sn_monitor.controller.process.daemon import run_controller
    from sn_monitor.controller.settings import load_controller_settings
    from sn_monitor.controller.storage.database import StoreError

    try:
        settings = load_controller_settings(args.config)
        overrides: dict[str, object] = {}
        if args.listen:
            overrides["listen"] = args.listen
        if args.state_dir:
            overrides["state_dir"] = args.state_dir
        if args.rules:
            overrides["rules"] = list(args.rules)
        if args.token_file:
            overrides["token_file"] = args.token_file
        if args.jobs:
            overrides["jobs"] = args.jobs
        settings = replace(settings, **overrides)  # type: ignore[arg-type]
        configure_logging(args.log_format or settings.log_format,
                          args.log_level or settings.log_level)
        return run_controller(settings, SystemClock())
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    except OSError as err:
        print(f"sn-monitor controller: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreError as err:  # names the store (never a password), not a traceback
        print(f"sn-monitor controller: {err}", file=sys.stderr)
        return EXIT_STORE
    except ListenError as err:  # the address in use, or not this machine's
        print(f"sn-monitor controller: {err}", file=sys.stderr)
        return EXIT_CONFIG


def run_simulate(args: argparse.Namespace) -> int:
    """``sn-monitor simulate``: many simulated agents against one controller."""
    import json
    import signal
    import threading

    from sn_monitor.sim.fleet import Fleet, FleetOptions, render_summary
    from sn_monitor.sim.scenario import find_scenario
    from sn_monitor.transport import TokenError, read_token

    try:
        scenario = find_scenario(args.scenario) if args.scenario else None
        token = read_token(args.token_file) if args.token_file else None
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    except TokenError as err:
        print(f"sn-monitor simulate: {err}", file=sys.stderr)
        return EXIT_CONFIG
    if args.speed <= 0 or not 0 <= args.jitter < 1:
        print("sn-monitor simulate: --speed must be above 0 and --jitter from 0 to 0.99",
              file=sys.stderr)
        return EXIT_CONFIG
    duration = args.duration
    if duration is None and scenario is not None and scenario.duration is not None:
        duration = scenario.duration / args.speed
    options = FleetOptions(controller=args.controller, nodes=args.nodes,
                           interval=args.interval, duration=duration, speed=args.speed,
                           gpus=args.gpus, connections=args.connections, jitter=args.jitter,
                           seed=args.seed, token=token, ca_file=args.ca_file,
                           first=args.first, full_reports=args.full_reports,
                           post_reports=args.post_reports)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        fleet = Fleet(options, scenario, progress=None if args.quiet else progress)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as err:
        print(f"sn-monitor simulate: {err}", file=sys.stderr)
        return EXIT_CONFIG
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not args.quiet:
            until = f"for {duration:g} s" if duration is not None else "until Ctrl-C"
            progress(f"simulating {options.nodes} nodes against {options.controller} "
                     f"{until}" + (f", scenario {scenario.name}" if scenario else ""))
        fleet.run(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = fleet.summary()
    print(json.dumps(summary, indent=2) if args.json else render_summary(summary))
    if not summary["accepted"]:
        print(f"sn-monitor simulate: the controller at {options.controller} accepted no "
              f"report ({summary['sent']} sent)", file=sys.stderr)
        return 1
    return 0


def _ask_active_controller(command: str, args: argparse.Namespace,
                           send: Callable[[str, dict[str, str]], Any]) -> Any | int:
    """``send(url, headers)`` to each of ``--controller`` in turn until the active one answers.

    The 200 reply; an exit status (printed why) when the token cannot be read, the active
    controller refuses, or none answered (down, or a standby).
    """
    import requests

    from sn_monitor.transport import (
        TokenError,
        describe_failure,
        is_standby,
        read_token,
        redact_url,
    )

    try:
        token = read_token(args.token_file) if args.token_file else None
    except TokenError as err:
        print(f"sn-monitor {command}: {err}", file=sys.stderr)
        return EXIT_CONFIG
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    failures: list[str] = []
    for url in args.controller:
        try:
            reply = send(url.rstrip("/"), headers)
        except requests.RequestException as err:
            failures.append(f"{redact_url(url)}: {describe_failure(err)}")
            continue
        if is_standby(reply.status_code, reply.headers):
            failures.append(f"{redact_url(url)}: a standby")
            continue
        if reply.status_code != 200:
            try:
                why = reply.json().get("error", reply.text)
            except ValueError:
                why = reply.text
            print(f"sn-monitor {command}: {redact_url(url)} answered {reply.status_code}: "
                  f"{why}", file=sys.stderr)
            return 1
        return reply
    print(f"sn-monitor {command}: no active controller answered ({'; '.join(failures)})",
          file=sys.stderr)
    return 1


def run_breaker(args: argparse.Namespace) -> int:
    """``sn-monitor breaker``: the controller's circuit breaker, through its API."""
    import requests

    if args.what != "status" and not (args.reason or "").strip():
        print(f"sn-monitor breaker: {args.what} needs --reason (it goes in the audit trail)",
              file=sys.stderr)
        return EXIT_CONFIG

    def send(url: str, headers: dict[str, str]) -> Any:
        if args.what == "status":
            return requests.get(f"{url}/api/v1/breaker", headers=headers, timeout=10,
                                verify=args.ca_file or True)
        return requests.post(f"{url}/api/v1/breaker", headers=headers, timeout=30,
                             verify=args.ca_file or True,
                             json={"open": args.what == "open", "reason": args.reason.strip()})

    reply = _ask_active_controller("breaker", args, send)
    if isinstance(reply, int):
        return reply
    _print_breaker(reply.json())
    return 0


def run_topology(args: argparse.Namespace) -> int:
    """``sn-monitor topology``: the controller's topology view, as text."""
    import requests

    from sn_monitor.topology_text import render_topology

    params = {"job": args.job} if args.job else None

    def send(url: str, headers: dict[str, str]) -> Any:
        return requests.get(f"{url}/api/v1/topology", params=params, headers=headers,
                            timeout=30, verify=args.ca_file or True)

    reply = _ask_active_controller("topology", args, send)
    if isinstance(reply, int):
        return reply
    print(reply.text if args.json else "\n".join(render_topology(reply.json(), args.job)))
    return 0


def _print_breaker(doc: dict[str, object]) -> None:
    import time

    def when(value: object) -> str:
        if not isinstance(value, int | float):
            return "-"
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))

    if not doc.get("open"):
        print("circuit breaker: closed (evictions allowed)")
        return
    nodes = doc.get("nodes") or []
    print(f"circuit breaker: OPEN since {when(doc.get('since'))}, until "
          f"{when(doc.get('until'))}" + (" (opened by hand)" if doc.get("by_hand") else ""))
    print(f"  {doc.get('reason')}")
    if isinstance(nodes, list) and nodes:
        print(f"  closes once these are back and healthy: {', '.join(map(str, nodes))}")


def run_demo_command(args: argparse.Namespace) -> int:
    """``sn-monitor demo``: a simulated supernode, a scenario, a live view, a summary."""
    from sn_monitor.rules.spec import load_rules
    from sn_monitor.sim.demo import DemoOptions, run_demo
    from sn_monitor.sim.scenario import find_scenario

    try:
        if args.rules:
            load_rules(args.rules)
        scenario = find_scenario(args.scenario)
        scenario.check_gpus(args.gpus)
        scenario.resolve(args.nodes, [_demo_node(i, args.nodes) for i in range(args.nodes)])
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    if args.speed <= 0:
        print("sn-monitor demo: --speed must be above 0", file=sys.stderr)
        return EXIT_CONFIG
    if args.nodes < 3:
        print("sn-monitor demo: --nodes must be at least 3 (a job and 2 spares)",
              file=sys.stderr)
        return EXIT_CONFIG
    return run_demo(DemoOptions(
        scenario=scenario, nodes=args.nodes, gpus=args.gpus, speed=args.speed,
        duration=args.duration, headless=args.headless, keep_running=args.keep_running,
        listen=args.listen, state_dir=args.state_dir, rules=tuple(args.rules or ())))


def _demo_node(index: int, nodes: int) -> str:
    from sn_monitor.sim.fleet import node_name

    return node_name(index, nodes)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; return the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"sn-monitor {__version__}")
        return 0
    if args.command == "check-config":
        return check_config(args.files)
    if args.command == "controller":
        return run_controller_command(args)
    if args.command == "simulate":
        configure_logging(args.log_format or "text", args.log_level or "warning")
        return run_simulate(args)
    if args.command == "breaker":
        return run_breaker(args)
    if args.command == "topology":
        return run_topology(args)
    if args.command == "fleet":
        return run_fleet(args)
    if args.command == "verify":
        configure_logging(args.log_format or "text", args.log_level or "warning")
        return run_verify(args)
    if args.command == "slurm-health":
        configure_logging(args.log_format or "text", args.log_level or "warning")
        return run_slurm_health(args)
    if args.command == "goodput":
        configure_logging(args.log_format or "text", args.log_level or "error")
        return run_goodput(args)
    try:
        settings = _agent_settings(args) if args.command == "agent" else AgentSettings()
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    default_level = settings.log_level if args.command == "agent" else args.default_log_level
    configure_logging(args.log_format or settings.log_format, args.log_level or default_level)
    if args.command == "agent":
        return run_agent(settings, simulate=args.simulate, duration=args.duration,
                         sim_speed=args.sim_speed)
    if args.command == "demo":
        return run_demo_command(args)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
