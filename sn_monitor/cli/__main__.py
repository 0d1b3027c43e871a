"""``python -m sn_monitor.cli``: as the ``sn-monitor`` command."""

import sys

from sn_monitor.cli import main

if __name__ == "__main__":  # importing it (every module is, in a test) runs nothing
    sys.exit(main())
