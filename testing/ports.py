"""``free_port``: the one way tests, benches and the local cluster pick a port for a server
they start."""

from __future__ import annotations

import random
import socket

# Ports servers are started on come from below the kernel's ephemeral range (32768-60999
# by default): the kernel's own pick (binding port 0) is in that range, where any outbound
# connection may claim the port between the pick and the server's bind, and SeaweedFS's
# gRPC port (its port + 10000) may land past 65535. Several clusters, test servers and a
# bench start side by side, so a port is drawn at random, not counted up from a base.
PORTS = range(10000, 32768)
_draw = random.SystemRandom()


def free_port(*, also: tuple[int, ...] = ()) -> int:
    """A port below the ephemeral range that nobody listens on now, on any address; with
    ``also``, each port + offset is free too (a server that derives ports from its own)."""
    last = PORTS.stop - 1 - max(also, default=0)
    for _ in range(1000):
        port = _draw.randint(PORTS.start, last)
        if all(_bindable(port + offset) for offset in (0, *also)):
            return port
    raise RuntimeError(f"no free port in {PORTS.start}-{last} after 1000 draws")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
