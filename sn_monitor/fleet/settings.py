"""The fleet view's settings (deploy/fleet.yaml), read by the one config loader."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sn_monitor.config import Duration, bind, listen_address, load_yaml, positive, setting
from sn_monitor.transport import check_http_url

_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")


def _name(value: str) -> None:
    if _NAME.fullmatch(value) is None:
        raise ValueError(f"expected a name of lower-case letters, digits, '.', '_', '-' "
                         f"(at most 63), got {value!r}")


def _urls(value: list[str]) -> None:
    if not value:
        raise ValueError("at least one controller URL")
    for url in value:
        check_http_url(url)


@dataclass(frozen=True)
class SupernodeSettings:
    """One supernode: its controllers (an HA pair is tried in order), how to reach them."""

    name: str = setting(check=_name)
    controllers: list[str] = setting(check=_urls)
    #: A token with the ``read`` scope on that controller.
    token_file: str | None = None
    #: The CA bundle its controllers' certificates chain to (https; None: the system's).
    ca_file: str | None = None


def _supernodes(value: list[SupernodeSettings]) -> None:
    if not value:
        raise ValueError("at least one supernode")
    names = [s.name for s in value]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"supernode names must differ: {', '.join(twice)} given twice")


@dataclass(frozen=True)
class FleetSettings:
    """Everything ``sn-monitor fleet`` reads from its config file."""

    supernodes: list[SupernodeSettings] = setting(check=_supernodes)
    listen: str = setting(default="0.0.0.0:9849", check=listen_address)
    #: How long one controller may take to answer before it counts as unreachable.
    timeout: Duration = setting(default=Duration(5.0), check=positive)
    #: A view at most this old is served again instead of asking every controller.
    cache: Duration = setting(default=Duration(1.0), check=positive)
    #: The bearer token the view's own clients must send (None: the API is open).
    token_file: str | None = None
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"


def load_fleet_settings(path: str | Path) -> FleetSettings:
    return bind(FleetSettings, load_yaml(path))
