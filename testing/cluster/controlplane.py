"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback.

Flags as controller-runtime's envtest starts etcd and the API server
(``pkg/internal/testing/controlplane/{etcd,apiserver}.go``), plus what a kubeadm cluster
adds and the operator meets there: the ``Node,RBAC`` authorizer, the default admission
plugins (Pod Security among them), service-account tokens signed with a key of the
cluster's (TokenRequest), the aggregation layer's front proxy, and a controller manager
(Job, garbage collector, namespace, ServiceAccount, Deployment/ReplicaSet, EndpointSlice,
certificate signing) and a scheduler that bind pods to the node agent's Node.

One deviation, for loopback: the API server resolves a webhook's Service through its
endpoints (``--enable-aggregator-routing``, as clusters without a kube-proxy reach
aggregated APIs), since no kube-proxy gives Service IPs a route here.
"""

from __future__ import annotations

import json
import logging
import ssl
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from testing.ports import free_port

from . import audit, daemons
from .pki import ClusterPKI, Pair, make_pki

log = logging.getLogger(__name__)

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the first address: the kubernetes Service
CLUSTER_CIDR = "10.244.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT_S = 120.0




@dataclass
class Ports:
    """Where each component listens on 127.0.0.1."""

    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(**{name: free_port() for name in cls.__dataclass_fields__})


def kubeconfig(server: str, ca: Path, user: str, *, client: Pair | None = None,
               token: str | None = None) -> str:
    """A kubeconfig for one user of the cluster (a client certificate or a bearer token)."""
    credentials: dict[str, str] = (
        {"client-certificate": str(client.cert), "client-key": str(client.key)} if client
        else {"token": token or ""})
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "resumequal-local", "cluster": {
            "server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "resumequal-local", "user": user}}],
        "current-context": user,
    }, sort_keys=False)


@dataclass
class ControlPlane:
    """A started control plane: where it listens and the files that reach it."""

    root: Path
    ports: Ports
    admin_kubeconfig: Path
    host: str

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.ports.apiserver}"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def to_json(self) -> dict[str, object]:
        return {"root": str(self.root), "ports": asdict(self.ports),
                "admin_kubeconfig": str(self.admin_kubeconfig), "host": self.host}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ControlPlane:
        ports = data["ports"]
        assert isinstance(ports, dict)
        return cls(Path(str(data["root"])), Ports(**ports), Path(str(data["admin_kubeconfig"])),
                   str(data["host"]))

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts the cluster CA and presents the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context


def _etcd_args(bin_etcd: Path, root: Path, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [str(bin_etcd), "--name=default", f"--data-dir={root / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}", "--initial-cluster-state=new",
            # A test cluster's etcd: a crash of this machine loses it anyway.
            "--unsafe-no-fsync", "--log-level=warn"]


def _apiserver_args(binary: Path, root: Path, ports: Ports, pki: ClusterPKI, host: str,
                    audited: tuple[str, ...], watch_cache: bool) -> list[str]:
    # Without the watch cache every watch is served by etcd, so a resourceVersion etcd has
    # compacted expires at once (410) rather than when it leaves the cache's window.
    cache = [] if watch_cache else ["--watch-cache=false"]
    return [
        str(binary), *cache,
        f"--etcd-servers=http://127.0.0.1:{ports.etcd}",
        f"--bind-address={host}", f"--secure-port={ports.apiserver}",
        f"--advertise-address={host}",
        f"--tls-cert-file={pki.apiserver.cert}", f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        f"--service-account-issuer={ISSUER}",
        f"--service-account-key-file={pki.sa_public}",
        f"--service-account-signing-key-file={pki.sa_private}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        # The aggregation layer's front proxy (kubeadm's flags).
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-username-headers=X-Remote-User",
        "--enable-aggregator-routing=true",
        f"--cert-dir={root / 'pki' / 'apiserver-generated'}",
        # Who asked what, and what they were answered: tests read the operator's requests
        # here (testing/cluster/audit.py), as the authorizer saw them.
        f"--audit-policy-file={audit.write_policy(root / 'audit-policy.yaml', audited)}",
        f"--audit-log-path={audit.log_path(root)}", "--audit-log-format=json",
        "--audit-log-mode=batch", "--audit-log-batch-max-wait=1s",
        "--audit-log-maxbackup=1",
    ]


def _component_flags(kubeconfig: Path) -> list[str]:
    """What the controller manager and the scheduler share: one kubeconfig for the API,
    for checking who calls their secure port and for asking whether they may, served on
    loopback."""
    return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1"]


def _component_kubeconfig(cp: ControlPlane, name: str, client: Pair) -> Path:
    path = cp.root / f"{name}.kubeconfig"
    path.write_text(kubeconfig(cp.server, cp.pki / "ca.crt", name, client=client))
    return path


def start(root: Path, binaries: dict[str, Path], *, cluster: str, host: str,
          audited: tuple[str, ...] = (), controllers: bool = True,
          watch_cache: bool = True) -> ControlPlane:
    """Make keys, start the four components and wait until each is ready; the API server
    listens on ``host`` (the node's address, which pods reach), the rest on loopback, and
    audits the requests of the service accounts of the namespaces ``audited``. Without
    ``controllers``, etcd and the API server only: objects stay as written."""
    root.mkdir(parents=True, exist_ok=True)
    pki = make_pki(root / "pki", SERVICE_IP, host)
    ports = Ports.pick()
    admin = root / "admin.kubeconfig"
    cp = ControlPlane(root, ports, admin, host)
    admin.write_text(kubeconfig(cp.server, pki.ca.cert, "admin", client=pki.admin))
    logs = cp.logs

    etcd = daemons.start("etcd", _etcd_args(binaries["etcd"], root, ports), cluster=cluster,
                         logs=logs)
    daemons.wait_until("etcd", lambda: daemons.http_ok(f"http://127.0.0.1:{ports.etcd}/health"),
                       START_TIMEOUT_S, proc=etcd, logs=logs, name="etcd")

    apiserver = daemons.start("kube-apiserver", _apiserver_args(
        binaries["kube-apiserver"], root, ports, pki, host, audited, watch_cache),
        cluster=cluster, logs=logs)
    context = cp.ssl_context()
    daemons.wait_until("kube-apiserver", lambda: daemons.http_ok(
        f"{cp.server}/readyz", context=context), START_TIMEOUT_S, proc=apiserver, logs=logs,
        name="kube-apiserver")
    if not controllers:
        return cp

    kcm_config = _component_kubeconfig(cp, "kube-controller-manager", pki.controller_manager)
    kcm = daemons.start("kube-controller-manager", [
        str(binaries["kube-controller-manager"]), *_component_flags(kcm_config),
        f"--secure-port={ports.controller_manager}",
        f"--service-account-private-key-file={pki.sa_private}",
        f"--root-ca-file={pki.ca.cert}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--cluster-cidr={CLUSTER_CIDR}",
        "--leader-elect=false",
        "--controllers=*,bootstrapsigner,tokencleaner",
    ], cluster=cluster, logs=logs)
    scheduler_config = _component_kubeconfig(cp, "kube-scheduler", pki.scheduler)
    scheduler = daemons.start("kube-scheduler", [
        str(binaries["kube-scheduler"]), *_component_flags(scheduler_config),
        f"--secure-port={ports.scheduler}",
        "--leader-elect=false",
    ], cluster=cluster, logs=logs)
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # their serving certificates are self-made
    for name, proc, port in (("kube-controller-manager", kcm, ports.controller_manager),
                             ("kube-scheduler", scheduler, ports.scheduler)):
        daemons.wait_until(name, lambda p=port: daemons.http_ok(  # type: ignore[misc]
            f"https://127.0.0.1:{p}/healthz", context=insecure), START_TIMEOUT_S, proc=proc,
            logs=logs, name=name)
    return cp


def kubectl(cp: ControlPlane, binary: Path, *args: str, input: str | None = None,
            kubeconfig_path: Path | None = None) -> str:
    """Run kubectl against the cluster as the admin (or the kubeconfig given)."""
    result = subprocess.run([str(binary), f"--kubeconfig={kubeconfig_path or cp.admin_kubeconfig}",
                             *args], input=input, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise daemons.ClusterError(f"kubectl {' '.join(args)} exited {result.returncode}: "
                                   f"{result.stderr.strip()[-2000:]}")
    return result.stdout


def state_json(cp: ControlPlane) -> str:
    return json.dumps(cp.to_json(), indent=1)
