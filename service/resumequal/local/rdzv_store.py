"""The rendezvous store of a local leg that runs several nodes, in a process of its own.

torchrun's c10d rendezvous keeps its state in a TCPStore that, by default, the first
agent to start hosts; when that agent's node is killed the store goes with it and every
other agent gives up (``RendezvousConnectionError``). A leg whose nodes may be killed
therefore gets this process as its store, and every agent is told it is not the host
(``--rdzv-conf is_host=false``; torch/distributed/elastic/rendezvous/
c10d_rendezvous_backend.py ``_create_tcp_store``), so any node can die and be replaced.

    python -m resumequal.local.rdzv_store --port PORT

It serves until SIGTERM or SIGINT. Nothing else of ours is imported: it is started once per
such leg and stays light.
"""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import timedelta


def main() -> None:
    """Serve a multi-tenant TCPStore on 127.0.0.1:PORT until told to stop."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from torch.distributed import TCPStore

    # multi_tenant: agents connect to this port as clients; wait_for_workers: nobody
    # counts them, they come and go with their nodes.
    store = TCPStore("127.0.0.1", args.port, is_master=True, multi_tenant=True,
                     wait_for_workers=False, timeout=timedelta(seconds=60))
    print(f"rendezvous store serving on 127.0.0.1:{args.port}", flush=True)
    stop.wait()
    del store


if __name__ == "__main__":
    main()
