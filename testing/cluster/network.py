"""The pod network: a Linux bridge on this machine and a network namespace per pod.

What the CNI ``bridge`` plugin with ``host-local`` IPAM does on a node
(containernetworking/plugins ``plugins/main/bridge/bridge.go``, ``plugins/ipam/host-local``):
the node's bridge holds the gateway address of the pod subnet; each pod gets a network
namespace of its own with a veth pair, one end (``eth0``) in the pod with an address of the
subnet and a default route through the gateway, the other end on the bridge. Pods reach
each other and the node over the bridge, by address, as on a one-node cluster; nothing
leaves the machine (no masquerading, no forwarding). The control plane and the S3 server
listen on the gateway address, which pods reach as a node's own address.

Needs root (CAP_NET_ADMIN), as a CNI plugin does.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import ClusterError

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
LOCK = Path("/run/lock/resumequal-pod-network.lock")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip`` (iproute2); a failure names the command and what it said."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)} exited {result.returncode}: "
                           f"{result.stderr.strip()}")
    return result


def used_subnets() -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every IPv4 network an interface of this machine is on."""
    out = ip("-4", "-o", "addr", "show").stdout
    nets = set()
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            nets.add(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    return nets


@dataclass(frozen=True)
class Bridge:
    """The node's bridge and the pod subnet behind it."""

    name: str
    subnet: str  # e.g. 10.244.3.0/24

    @property
    def gateway(self) -> str:
        """The bridge's own address: the node's address on the pod network."""
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    def pod_addresses(self) -> list[str]:
        """The addresses pods may get (the gateway excluded)."""
        return [str(a) for a in list(ipaddress.ip_network(self.subnet).hosts())[1:]]


def create_bridge(cluster: str) -> Bridge:
    """Make the node's bridge on the first 10.244.X.0/24 no interface here is on. Under a
    machine-wide lock: two clusters started at once (two checkouts' test sessions) would
    otherwise both take the same subnet."""
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken = used_subnets()
        for x in range(256):
            subnet = ipaddress.ip_network(f"10.244.{x}.0/24")
            if not any(subnet.overlaps(n) for n in taken):
                break
        else:
            raise ClusterError("no free 10.244.X.0/24 for the pod network")
        bridge = Bridge(f"rq{cluster[:10]}", str(subnet))
        if ip("link", "show", bridge.name, check=False).returncode == 0:
            ip("link", "del", bridge.name)
        ip("link", "add", bridge.name, "type", "bridge")
        ip("addr", "add", f"{bridge.gateway}/{subnet.prefixlen}", "dev", bridge.name)
        ip("link", "set", bridge.name, "up")
    return bridge


def delete_bridge(name: str) -> None:
    """Remove the bridge (its veths go with their namespaces)."""
    if ip("link", "show", name, check=False).returncode == 0:
        ip("link", "del", name)


def _veth_name(netns: str) -> str:
    return f"v{netns[-12:]}"  # interface names hold at most 15 characters


def add_pod(bridge: Bridge, netns: str, address: str) -> None:
    """A network namespace ``netns`` with ``eth0`` at ``address`` on the bridge."""
    prefix = ipaddress.ip_network(bridge.subnet).prefixlen
    veth = _veth_name(netns)
    remove_pod(netns)
    ip("netns", "add", netns)
    try:
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("link", "set", veth, "master", bridge.name, "up")
        ip("-n", netns, "addr", "add", f"{address}/{prefix}", "dev", "eth0")
        ip("-n", netns, "link", "set", "eth0", "up")
        ip("-n", netns, "link", "set", "lo", "up")
        ip("-n", netns, "route", "add", "default", "via", bridge.gateway)
    except ClusterError:
        remove_pod(netns)
        raise


def remove_pod(netns: str) -> None:
    """Delete the pod's namespace (its veth pair goes with it)."""
    if (NETNS_DIR / netns).exists():
        ip("netns", "del", netns, check=False)
    ip("link", "del", _veth_name(netns), check=False)


def pod_namespaces(prefix: str) -> list[str]:
    """The network namespaces of this cluster's pods that still exist."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))
