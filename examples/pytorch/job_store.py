"""The job's rendezvous store, run off the job's nodes: ``python job_store.py PORT_FILE``.

torchrun's c10d rendezvous hosts its store in whichever agent binds the endpoint first,
and when that node dies every other agent loses the store and stops its ranks: one dead
node takes the whole job down, and no rank can outlive it. Like an etcd or a head-node
store on a real cluster, this process holds the store for the job's whole life instead:
the torchrun agents of every generation rendezvous on it (each generation under its own
``--rdzv-id``), and so do the process groups of warm restores (``rejoin.py``).

It binds a free port on 127.0.0.1, writes the port to PORT_FILE and serves until killed
(or ``--lifetime`` seconds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("port_file", type=Path)
    parser.add_argument("--lifetime", type=float, default=7 * 24 * 3600.0, metavar="S")
    args = parser.parse_args(argv)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    tmp = args.port_file.with_name(args.port_file.name + ".tmp")
    tmp.write_text(str(store.port))
    os.replace(tmp, args.port_file)
    print(f"job store on 127.0.0.1:{store.port}", flush=True)
    time.sleep(args.lifetime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
