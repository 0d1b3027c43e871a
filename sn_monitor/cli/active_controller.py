"""Asking the active controller of ``--controller`` URLs, as ``breaker`` and ``topology`` do."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from sn_monitor.cli.exit_status import refuse


def ask_active_controller(command: str, args: argparse.Namespace,
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
        return refuse(f"sn-monitor {command}: {err}")
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
