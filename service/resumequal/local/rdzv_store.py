"""The rendezvous store of a local leg, in a process of its own, on loopback alone.

torchrun's c10d rendezvous keeps its state in a TCPStore that, by default, the first
agent to start hosts; when that agent's node is killed the store goes with it and every
other agent gives up (``RendezvousConnectionError``). Every local leg therefore gets this
process as its store, and every agent is told it is not the host (``--rdzv-conf
is_host=false``; torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py
``_create_tcp_store``), so any node can die and be replaced.

It also keeps the store off the network. The rendezvous state is pickled in the store
(``torch.rendezvous.*`` keys, dynamic_rendezvous.py ``_BackendRendezvousStateHolder``) and
the agents unpickle it, so whoever can write the store runs code in the agents. A TCPStore
torch opens listens on every interface whatever host it is given; this process binds
127.0.0.1 itself and hands torch the listening socket (:mod:`resumequal.train.loopback`), so only
this machine's processes reach it.

    python -m resumequal.local.rdzv_store --port PORT

It serves until SIGTERM or SIGINT (the runner's cleanup, or the kernel's when the runner
dies: :mod:`resumequal.lifeline`). Nothing else of ours is imported: it is started once
per such leg and stays light.
"""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import timedelta

from resumequal.train.loopback import LOOPBACK, loopback_store

__all__ = ["LOOPBACK", "loopback_store", "main"]


def main() -> None:
    """Serve a multi-tenant TCPStore on 127.0.0.1:PORT until told to stop."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # multi_tenant: agents connect to this port as clients; wait_for_workers: nobody
    # counts them, they come and go with their nodes.
    store = loopback_store(args.port, multi_tenant=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))
    print(f"rendezvous store serving on {LOOPBACK}:{args.port}", flush=True)
    stop.wait()
    del store


if __name__ == "__main__":
    main()
