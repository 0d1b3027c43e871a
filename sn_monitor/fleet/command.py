"""``sn-monitor fleet --config F``: serve the fleet view until SIGTERM or SIGINT.

The view's modules (requests, prometheus_client) are imported when the command runs:
every ``sn-monitor`` command builds its parser from here, the agent's included.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

log = logging.getLogger(__name__)

EXIT_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="F",
                        help="the fleet file: supernodes and their controllers")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help="where to serve the view (default from the file, 0.0.0.0:9849)")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="stop after S seconds (default: until SIGTERM or Ctrl-C)")


def run_fleet(args: argparse.Namespace) -> int:
    from sn_monitor.clock import SystemClock
    from sn_monitor.config import ConfigError, listen_address, parse_listen
    from sn_monitor.fleet.server import FleetServer
    from sn_monitor.fleet.settings import load_fleet_settings
    from sn_monitor.fleet.view import FleetView
    from sn_monitor.logs import configure_logging
    from sn_monitor.serving import ListenError
    from sn_monitor.transport import TokenError, read_token

    try:
        settings = load_fleet_settings(args.config)
        listen = args.listen or settings.listen
        listen_address(listen)
        token = read_token(settings.token_file) if settings.token_file else None
        view = FleetView(settings, SystemClock())
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_CONFIG
    except (ValueError, TokenError) as err:
        print(f"sn-monitor fleet: {err}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(args.log_format or settings.log_format,
                      args.log_level or settings.log_level)
    host, port = parse_listen(listen)
    try:
        server = FleetServer(view, host, port, token)
    except ListenError as err:
        view.close()
        print(f"sn-monitor fleet: {err}", file=sys.stderr)
        return EXIT_CONFIG
    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    server.start()
    log.info("fleet view of %d supernodes serving on %s:%d",
             len(settings.supernodes), host, server.port)
    try:
        done.wait(timeout=args.duration)
    finally:
        server.stop()
        view.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
