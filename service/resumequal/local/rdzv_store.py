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
torch opens listens on every interface whatever host it is given (its server binds the
wildcard address, torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp and
TCPStoreBackend.cpp); this process binds 127.0.0.1 itself and hands torch the listening
socket (``master_listen_fd``), so only this machine's processes reach it.

    python -m resumequal.local.rdzv_store --port PORT

It serves until SIGTERM or SIGINT. Nothing else of ours is imported: it is started once per
such leg and stays light.
"""

from __future__ import annotations

import argparse
import signal
import socket
import threading
from datetime import timedelta
from typing import Any

LOOPBACK = "127.0.0.1"


def loopback_store(port: int, **options: Any) -> Any:
    """A TCPStore server that listens on ``LOOPBACK:port`` alone (``port`` 0: any free one).

    torch's libuv server takes a listening socket in recent releases (2.9 and 2.13 here);
    older ones refuse it ("does not support initialization with an listen fd", 2.6), where
    the legacy server takes it."""
    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, port))
    listener.listen(socket.SOMAXCONN)
    bound = listener.getsockname()[1]
    try:
        try:
            return TCPStore(LOOPBACK, bound, is_master=True,
                            master_listen_fd=listener.fileno(), **options)
        except NotImplementedError:
            return TCPStore(LOOPBACK, bound, is_master=True, use_libuv=False,
                            master_listen_fd=listener.fileno(), **options)
    finally:
        listener.detach()  # the store owns the socket now


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
