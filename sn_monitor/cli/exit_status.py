"""The exit statuses every command shares, and the one way a command refuses to start.

0: done (or healthy); 1: the command ran and what it checked failed, or the controller
refused; :data:`EXIT_CONFIG` (2): a usage or config error, said on stderr.
"""

from __future__ import annotations

import sys

#: A usage or config error: the command did not start (argparse exits 2 too).
EXIT_CONFIG = 2
#: The controller's store cannot be opened (unreachable server, unwritable directory):
#: a supervisor may start it again later.
EXIT_STORE = 1


def refuse(message: object) -> int:
    """Say on stderr why the command cannot run; return :data:`EXIT_CONFIG`."""
    print(message, file=sys.stderr)
    return EXIT_CONFIG
