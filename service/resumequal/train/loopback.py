"""A TCPStore server that listens on 127.0.0.1 alone, for what runs on one machine.

A TCPStore torch opens itself listens on every interface whatever host it is given (its
server binds the wildcard address: torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp
and TCPStoreBackend.cpp; nothing in its Python API chooses otherwise). Bound here to
127.0.0.1 and handed to torch as a listening socket (``master_listen_fd``), a store is
reached from this machine alone: a local leg's rendezvous store
(:mod:`resumequal.local.rdzv_store`) and its workers' store
(:func:`resumequal.train.distributed.init_process_group`). torch loads on the first call.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

__all__ = ["LOOPBACK", "is_loopback", "loopback_store"]

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address of this machine's loopback (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
