"""Reading one small /sys attribute: a raw ``open``/``read``/``close``, no Python file object.

The net and InfiniBand collectors read dozens of these every cycle; ``open()`` with a
text wrapper and ``pathlib`` joins cost several times the system calls themselves.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def read_attribute(path: str) -> str | None:
    """The attribute's text, stripped; None when it is absent or the kernel refuses it."""
    data = read_raw(path)
    return None if data is None else data.decode("ascii", errors="replace").strip()


def read_raw(path: str) -> bytes | None:
    """The attribute's bytes (at most 4 KiB, a sysfs page); None as :func:`read_attribute`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        log.debug("cannot open %s: %s", path, exc)
        return None
    try:
        data = os.read(fd, 4096)
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
        return None
    finally:
        os.close(fd)
    return data
