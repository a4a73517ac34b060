"""A pod's sandbox on this machine: its network namespace and address, its folder, and the
files the kubelet manages for it (``/etc/hosts``, ``/etc/resolv.conf``, ``/etc/hostname``).

The kubelet's content for each (kubernetes ``pkg/kubelet/kubelet_pods.go``
managedHostsFileContent and GeneratePodHostNameAndDomain, ``pkg/kubelet/network/dns/
dns.go`` GetPodDNS for ``dnsPolicy: ClusterFirst``): the pod's host name is
``spec.hostname`` or its name (at most 63 characters); with ``spec.subdomain`` the hosts
file also names it ``<hostname>.<subdomain>.<namespace>.svc.cluster.local``; the resolver
searches the namespace's, ``svc``'s and the cluster's domains with ``ndots:5``.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import network
from ..errors import ClusterError
from ..network import Bridge

Obj = dict[str, Any]
CLUSTER_DOMAIN = "cluster.local"

HOSTS_HEADER = """# Kubernetes-managed hosts file.
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
fe00::0\tip6-mcastprefix
fe00::1\tip6-allnodes
fe00::2\tip6-allrouters
"""


def host_and_domain(pod: Obj) -> tuple[str, str]:
    """The pod's host name and, with a subdomain, its domain (GeneratePodHostNameAndDomain)."""
    spec, meta = pod["spec"], pod["metadata"]
    hostname = spec.get("hostname") or meta["name"]
    hostname = hostname[:63].rstrip("-.")
    domain = ""
    if spec.get("subdomain"):
        domain = f"{spec['subdomain']}.{meta['namespace']}.svc.{CLUSTER_DOMAIN}"
    return hostname, domain


def hosts_file(pod: Obj, ip: str) -> str:
    hostname, domain = host_and_domain(pod)
    lines = [HOSTS_HEADER]
    lines.append(f"{ip}\t{hostname}.{domain}\t{hostname}\n" if domain else f"{ip}\t{hostname}\n")
    aliases = pod["spec"].get("hostAliases") or []
    if aliases:
        lines.append("\n# Entries added by HostAliases.\n")
        lines += [f"{a['ip']}\t{chr(9).join(a.get('hostnames') or [])}\n" for a in aliases]
    return "".join(lines)


def resolv_conf(pod: Obj, nameserver: str) -> str:
    """ClusterFirst (the default; ``Default`` and ``None`` as the pod's dnsConfig says)."""
    namespace = pod["metadata"]["namespace"]
    policy = pod["spec"].get("dnsPolicy", "ClusterFirst")
    config = pod["spec"].get("dnsConfig") or {}
    servers, searches, options = [], [], []
    if policy in ("ClusterFirst", "ClusterFirstWithHostNet"):
        servers = [nameserver]
        searches = [f"{namespace}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}",
                    CLUSTER_DOMAIN]
        options = ["ndots:5"]
    servers += config.get("nameservers") or []
    searches += config.get("searches") or []
    options += [o["name"] + (f":{o['value']}" if o.get("value") else "")
                for o in config.get("options") or []]
    out = [f"search {' '.join(searches)}\n"] if searches else []
    out += [f"nameserver {s}\n" for s in servers]
    out += [f"options {' '.join(options)}\n"] if options else []
    return "".join(out)


class Addresses:
    """The pod subnet's free addresses (host-local IPAM), handed out and taken back."""

    def __init__(self, bridge: Bridge) -> None:
        self._free = bridge.pod_addresses()
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            if not self._free:
                raise ClusterError("the pod subnet is full")
            return self._free.pop(0)

    def give_back(self, address: str) -> None:
        with self._lock:
            if address not in self._free:
                self._free.append(address)


@dataclass
class Sandbox:
    """One pod's namespace, address and folder."""

    pod_uid: str
    netns: str
    ip: str
    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    def write_files(self, pod: Obj, nameserver: str) -> None:
        """The managed files, rewritten in place (a bind mount follows the inode)."""
        self.etc.mkdir(parents=True, exist_ok=True)
        hostname, _ = host_and_domain(pod)
        for name, text in (("hosts", hosts_file(pod, self.ip)),
                           ("resolv.conf", resolv_conf(pod, nameserver)),
                           ("hostname", hostname + "\n")):
            path = self.etc / name
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o644)


def create(bridge: Bridge, addresses: Addresses, pods_root: Path, pod: Obj, prefix: str
           ) -> Sandbox:
    """The pod's network namespace with an address of the subnet, and its folder."""
    meta = pod["metadata"]
    uid = meta["uid"]
    netns = f"{prefix}{uid.replace('-', '')[:12]}"
    address = addresses.take()
    try:
        network.add_pod(bridge, netns, address)
    except Exception:
        addresses.give_back(address)
        raise
    root = pods_root / f"{meta['namespace']}_{meta['name']}_{uid}"
    root.mkdir(parents=True, exist_ok=True)
    return Sandbox(uid, netns, address, root)


def destroy(sandbox: Sandbox, addresses: Addresses, *, keep_logs: bool = True) -> None:
    """The namespace and address go; the folder's volumes too (logs stay where asked)."""
    network.remove_pod(sandbox.netns)
    addresses.give_back(sandbox.ip)
    for child in sandbox.root.iterdir() if sandbox.root.exists() else []:
        if keep_logs and child.name == "logs":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)

